"""The things runmodel registers by name for configs: torch's common optimizers and
losses, and runmodel's own interfaces, backends and packs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..backends import BACKEND_TYPES
from ..models import Supervised
from ..packs import PACK_TYPES

__all__ = ["BUILTINS"]

BUILTINS: dict[str, dict[str, Callable[..., Any]]] = {
    "optimizer": {
        "sgd": torch.optim.SGD,
        "adam": torch.optim.Adam,
        "adamw": torch.optim.AdamW,
        "rmsprop": torch.optim.RMSprop,
        "adagrad": torch.optim.Adagrad,
    },
    "loss": {
        "cross_entropy": nn.CrossEntropyLoss,
        "mse": nn.MSELoss,
        "l1": nn.L1Loss,
        "smooth_l1": nn.SmoothL1Loss,
        "nll": nn.NLLLoss,
        "bce": nn.BCELoss,
        "bce_with_logits": nn.BCEWithLogitsLoss,
        "huber": nn.HuberLoss,
    },
    "interface": {"supervised": Supervised},
    "backend": dict(BACKEND_TYPES),
    "pack": dict(PACK_TYPES),
}

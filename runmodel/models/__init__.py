"""Models: the contract the engine runs (``Model``), a ready ``TorchModel``, the
``Interface`` of a step, evaluation, and loading a model from a source string."""

from __future__ import annotations

from .interface import Interface, Supervised
from .loader import configure_engine, load_model, load_model_class, load_source
from .metrics import MetricSet, evaluate, inference
from .model import (
    Model,
    declared_options,
    resolve_options,
    setup_options_for,
    unknown_option_text,
)
from .torch_model import TorchModel
from .torchutil import torch_device, unwrap

__all__ = [
    "Interface",
    "MetricSet",
    "Model",
    "Supervised",
    "TorchModel",
    "configure_engine",
    "declared_options",
    "evaluate",
    "inference",
    "load_model",
    "load_model_class",
    "load_source",
    "resolve_options",
    "setup_options_for",
    "torch_device",
    "unknown_option_text",
    "unwrap",
]

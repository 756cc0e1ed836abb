"""Models that compute their own loss (Hugging Face ``transformers`` models): a mapping
batch is the module's keywords (``module(**batch)``), its ``labels`` the target, and the
module's output (a ``ModelOutput``, or any mapping or object with ``loss``/``logits``)
carries the loss and the logits. What ``TorchModel``'s default parts read of them."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .metrics import logits_of  # where metrics are fed: it imports nothing of runmodel's

__all__ = ["LABELS", "computes_loss", "labels_of", "logits_of", "loss_of", "output_loss"]

#: The key of a mapping batch that holds the target (Hugging Face's name).
LABELS = "labels"


def computes_loss(module: nn.Module | None) -> bool:
    """Whether ``module`` may compute its own loss: its ``forward`` takes ``labels`` (as
    every Hugging Face model with a head does) or any keyword (``**kwargs``)."""
    forward = getattr(module, "forward", None)
    if forward is None:
        return False
    try:
        parameters = inspect.signature(forward).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == LABELS or p.kind is p.VAR_KEYWORD for p in parameters)


def loss_of(output: Any) -> torch.Tensor | None:
    """The loss a module's output carries (``output.loss``, ``output["loss"]``), or None."""
    if isinstance(output, Mapping):
        return output.get("loss")
    return getattr(output, "loss", None)


def labels_of(batch: Mapping[str, Any]) -> Any:
    """A mapping batch's target: its ``labels``; a clear error naming its keys if none."""
    try:
        return batch[LABELS]
    except KeyError:
        raise KeyError(
            f"a mapping batch's target is its {LABELS!r}, and this batch has none (its "
            f"keys: {', '.join(map(repr, batch))}); add the labels to the batches, or "
            f"override TorchModel.target(batch)"
        ) from None


def output_loss(output: Any, owner: str) -> torch.Tensor:
    """The loss the module computed, for a model without ``loss_fn``; a clear error when
    its output carries none."""
    loss = loss_of(output)
    if loss is None:
        given = type(output).__name__
        raise ValueError(
            f"{owner} has no loss_fn, so its loss is the one its module computes, and "
            f"the module's output ({given}) carries none (a Hugging Face model computes "
            f"it when the batch has 'labels'); give the batches labels, set loss_fn in "
            f"setup(), or override compute_loss(output, batch)"
        )
    return loss

"""Checks that several packs make: reading a metric as a number, and needing a train step
that fires the backward and optimizer_step phases."""

from __future__ import annotations

import difflib
from typing import Any

import torch

__all__ = ["metric_value", "read_metric", "require_phased_step"]


def metric_value(state: Any, metric: str, owner: str) -> float:
    """``state.metrics[metric]`` as a float; a missing metric or one that is no number is
    an error that ``owner`` (``"EarlyStopping"``) raises, naming the metrics there are."""
    value = read_metric(state, metric)
    if value is None:
        names = sorted(state.metrics)
        close = difflib.get_close_matches(str(metric), names, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"{owner}: no metric {metric!r} in state.metrics at the end of epoch "
                         f"{state.epoch}.{hint} There are: {', '.join(names) or 'none'} "
                         f"(attach Evaluate() for eval_loss and the other eval_ metrics; a "
                         f"hook that puts a metric there can declare it with writes=)")
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{owner}: state.metrics[{metric!r}] is {type(value).__name__} "
                        f"{value!r}, not a number")
    return float(value)


def read_metric(state: Any, metric: str) -> Any:
    """``state.metrics[metric]`` or ``None``; for ``"loss"``, where no metric is so named,
    the last step's loss (``state.loss``): the name every step declares writing."""
    value = state.metrics.get(metric)
    if value is None and metric == "loss":
        value = state.loss
        if isinstance(value, torch.Tensor):
            value = value.detach()
    return value


def require_phased_step(engine: Any, owner: str,
                        phases: str = "the backward and optimizer_step phases") -> None:
    """In a train run, ``owner`` needs a step that fires ``phases`` (a TorchModel's, with
    the Supervised interface): say so at setup, not at step 10,000."""
    model = engine.model
    if engine.state.mode == "train" and not getattr(getattr(model, "interface", None),
                                                    "phased", False):
        raise TypeError(f"{owner} works in {phases}, which {type(model).__name__}'s train "
                        f"step does not fire (its step is its own, not a TorchModel's with "
                        f"the Supervised interface)")

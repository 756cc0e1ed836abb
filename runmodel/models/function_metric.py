"""A metric that is a plain function over a whole evaluation pass, ``fn(predictions,
targets) -> float`` (as the Hugging Face ``Trainer``'s ``compute_metrics``), as a
pytorch-ignite metric. Imported when such a metric is given (ignite is not imported
before)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

import torch
from ignite import distributed as idist
from ignite.exceptions import NotComputableError
from ignite.metrics import Metric
from ignite.metrics.metric import reinit__is_reduced

__all__ = ["FunctionMetric", "as_metrics"]


class FunctionMetric(Metric):
    """``fn(predictions, targets)`` over a whole pass: the pass's outputs (a Hugging Face
    model's logits) and targets, each concatenated along the batch dimension into one
    CPU tensor, as ``torch.cat`` makes it. The batches' outputs are kept (detached) until
    the pass ends; in a distributed run they are gathered from every process and ``fn``
    runs on process 0, its value sent to the others (as ignite's ``EpochMetric`` does)."""

    def __init__(self, fn: Callable[[torch.Tensor, torch.Tensor], Any], name: str = "") -> None:
        self.fn, self.name = fn, name or getattr(fn, "__name__", "metric")
        self._predictions: list[torch.Tensor] = []
        self._targets: list[torch.Tensor] = []
        super().__init__()

    @reinit__is_reduced
    def reset(self) -> None:
        self._predictions, self._targets = [], []

    @reinit__is_reduced
    def update(self, output: Any) -> None:
        predictions, targets = output[0], output[1]
        self._predictions.append(predictions.detach())
        self._targets.append(targets.detach())

    def compute(self) -> float:
        if not self._predictions:
            raise NotComputableError(f"{self.name} has no batch to compute over")
        predictions = torch.cat(self._predictions).cpu()
        targets = torch.cat(self._targets).cpu()
        world = idist.get_world_size()
        if world > 1:
            predictions = cast(torch.Tensor, idist.all_gather(predictions))
            targets = cast(torch.Tensor, idist.all_gather(targets))
        value = 0.0
        if idist.get_rank() == 0:
            value = _number(self.fn(predictions, targets), self.name)
        if world > 1:
            value = cast(float, idist.broadcast(value, src=0))
        return value


def _number(value: Any, name: str) -> float:
    """A function metric's value as a float; a clear error when it is none."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.item())
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(
            f"the metric {name!r} returned {type(value).__name__}; a metric function "
            f"fn(predictions, targets) returns one number (a float)"
        ) from None


def as_metrics(metrics: Mapping[str, Metric | Callable[..., Any]]) -> dict[str, Metric]:
    """``metrics`` with each plain function ``fn(predictions, targets) -> float`` made a
    metric over the whole pass (``function_metric.FunctionMetric``)."""
    return {
        name: m if isinstance(m, Metric) else FunctionMetric(m, name) for name, m in metrics.items()
    }

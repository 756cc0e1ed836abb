"""Evaluation, outside any run or inside one: pytorch-ignite metrics over a model's
outputs, without grad. Eval mode, ``runmodel.evaluate`` and the ``Evaluate`` pack all
compute metrics here."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from ignite.metrics import Metric

__all__ = ["Evaluable", "MetricSet", "evaluate", "inference"]


class _Outputs(Protocol):
    def output_fn(self, model: Any) -> Callable[[Any], Any]: ...


class Evaluable(Protocol):
    """What ``evaluate`` needs of a model; a ``TorchModel`` has it. A protocol here, so
    that this module names no model class: ``interface`` evaluates through it, and
    ``torch_model`` imports ``interface`` (no import circle, typing included)."""

    @property
    def device(self) -> torch.device: ...

    @property
    def interface(self) -> _Outputs: ...

    def metrics(self) -> dict[str, Metric]: ...

    def data_for(self, kind: str) -> Iterable[Any]: ...

    def to_device(self, batch: Any) -> Any: ...

    def target(self, batch: Any) -> Any: ...


@contextlib.contextmanager
def inference(model: Any) -> Iterator[None]:
    """No grad, and the model's module in eval mode; its training flag is restored after."""
    module = getattr(model, "module", None)
    training = module if isinstance(module, torch.nn.Module) and module.training else None
    if training is not None:
        training.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        if training is not None:
            training.train()


class MetricSet:
    """pytorch-ignite metrics fed ``(output, target)``; computed into a dict of floats."""

    def __init__(self, metrics: dict[str, Metric]) -> None:
        self.metrics = metrics

    def reset(self) -> None:
        for metric in self.metrics.values():
            metric.reset()

    def update(self, output: Any, target: Any) -> None:
        for metric in self.metrics.values():
            metric.update((output, target))

    def compute(self) -> dict[str, Any]:
        computed = {name: metric.compute() for name, metric in self.metrics.items()}
        return {
            k: v.item() if isinstance(v, torch.Tensor) and v.numel() == 1 else v
            for k, v in computed.items()
        }


def evaluate(
    model: Evaluable,
    data: Iterable[Any] | None = None,
    metrics: dict[str, Metric] | None = None,
    *,
    engine: Any = None,
) -> dict[str, Any]:
    """``metrics`` (default: the model's ``metrics()``) over ``data`` (default: its eval
    data), without grad and outside any run: for a hook that checks a model mid-training.
    Training state is untouched: no ``setup()`` is called, and torch's random number
    generators (CPU, and the model's CUDA device) are as they were afterwards, although
    iterating a DataLoader draws from them.

    With ``engine`` (the run's, from a hook), the pass is one of the run's evaluations:
    its ``eval_start`` hooks run before the first batch and its ``eval_end`` hooks after
    the last, both with the module in eval mode and without grad, so a model with state
    that runs on from batch to batch (an RNN's hidden state) starts the pass afresh and
    gets its training state back after it. The ``Evaluate`` pack passes its engine."""
    metric_set = MetricSet(model.metrics() if metrics is None else metrics)
    metric_set.reset()
    data = model.data_for("eval") if data is None else data
    move = None if model.device.type == "cpu" else model.to_device
    output_of = model.interface.output_fn(model)
    with inference(model), _generators_kept(model.device):
        if engine is not None:
            engine.fire("eval_start")
        for batch in data:
            batch = batch if move is None else move(batch)
            metric_set.update(output_of(batch), model.target(batch))
        values = metric_set.compute()
        if engine is not None:
            engine.fire("eval_end")
    return values


def _generators_kept(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.random.fork_rng(devices=[index], device_type="cuda")
    return torch.random.fork_rng(devices=[])

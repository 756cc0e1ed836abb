"""Evaluation, outside any run or inside one: pytorch-ignite metrics over a model's
outputs, without grad. Eval mode, ``runmodel.evaluate`` and the ``Evaluate`` pack all
compute metrics here."""

from __future__ import annotations

import contextlib
import itertools
import random
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from ignite.metrics import Metric

__all__ = [
    "REDUCTIONS",
    "Evaluable",
    "MetricSet",
    "batches_of",
    "evaluate",
    "inference",
    "logits_of",
    "with_loss_reduction",
]

#: How an evaluation's loss is summed over its batches (``loss_metric.DoubleLoss``): a
#: script's ``loss.item() * len(y)``, its ``reduction="sum"``, or Lightning's float32 sum.
REDUCTIONS = ("mean", "sum", "float32")


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
    """pytorch-ignite metrics fed ``(output, target)``; computed into a dict of floats.

    A module's output that carries ``logits`` (a Hugging Face ``ModelOutput``) feeds its
    logits, except to the metrics that read the whole output (``reads_output``, as the
    loss a module computes); what the output is, is decided at the first batch."""

    def __init__(self, metrics: dict[str, Metric]) -> None:
        self.metrics = metrics
        #: ``update(output, target)``: the first batch's decides how the next are fed
        self.update: Callable[[Any, Any], None] = self._first_update

    def reset(self) -> None:
        for metric in self.metrics.values():
            metric.reset()

    def _first_update(self, output: Any, target: Any) -> None:
        if logits_of(output) is None:
            self.update = self._update
        else:
            metrics = self.metrics.values()
            whole = [m for m in metrics if getattr(type(m), "reads_output", False)]
            rest = [m for m in metrics if not getattr(type(m), "reads_output", False)]

            def update(output: Any, target: Any) -> None:
                for metric in whole:
                    metric.update((output, target))
                logits = logits_of(output)
                for metric in rest:
                    metric.update((logits, target))

            self.update = update
        self.update(output, target)

    def _update(self, output: Any, target: Any) -> None:
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
    data: Iterable[Any] | Callable[[], Any] | None = None,
    metrics: dict[str, Metric] | None = None,
    *,
    batches: int | None = None,
    engine: Any = None,
    isolate_rng: bool = False,
    loss_reduction: str = "mean",
) -> dict[str, Any]:
    """``metrics`` (default: the model's ``metrics()``) over ``data`` (default: its eval
    data), without grad and outside any run: for a hook that checks a model
    mid-training. No ``setup()`` is called.

    ``data`` is an iterable of batches (a DataLoader, a list) or a function of no
    arguments that returns one batch per call (a script's ``get_batch``); ``batches=N``
    evaluates the first N batches of an iterable (a fresh iterator each call) or N calls
    of a function (which needs it). ``loss_reduction`` says how the loss metric that
    ``TorchModel.metrics()`` makes sums (``"mean"``, ``"sum"``, ``"float32"``;
    ``runmodel.models.loss_metric``).

    The random number generators draw as a script's evaluation does: iterating a
    shuffled DataLoader draws a seed from torch's, a sampling function draws what it
    draws, and they are left so. ``isolate_rng=True`` puts torch's (CPU, and the model's
    CUDA device), Python's ``random`` and NumPy's back afterwards, so that evaluating
    changes nothing of the training after it.

    With ``engine`` (the run's, from a hook), the pass is one of the run's evaluations:
    its ``eval_start`` hooks run before the first batch and its ``eval_end`` hooks after
    the last, both with the module in eval mode and without grad, so a model with state
    that runs on from batch to batch (an RNN's hidden state) starts the pass afresh and
    gets its training state back after it. The ``Evaluate`` pack passes its engine."""
    metrics = model.metrics() if metrics is None else metrics
    metric_set = MetricSet(with_loss_reduction(metrics, loss_reduction))
    metric_set.reset()
    source = model.data_for("eval") if data is None else data
    move = None if model.device.type == "cpu" else model.to_device
    output_of = model.interface.output_fn(model)
    kept = _generators_kept(model.device) if isolate_rng else contextlib.nullcontext()
    with inference(model), kept:
        if engine is not None:
            engine.fire("eval_start")
        for batch in batches_of(source, batches):
            batch = batch if move is None else move(batch)
            metric_set.update(output_of(batch), model.target(batch))
        values = metric_set.compute()
        if engine is not None:
            engine.fire("eval_end")
    return values


def logits_of(output: Any) -> torch.Tensor | None:
    """The logits a module's output carries (``output.logits``, ``output["logits"]``), or
    None (an output that is a tensor, or carries none)."""
    if isinstance(output, torch.Tensor):
        return None
    if isinstance(output, Mapping):
        return output.get("logits")
    return getattr(output, "logits", None)


def batches_of(source: Iterable[Any] | Callable[[], Any], batches: int | None) -> Iterable[Any]:
    """The batches of an evaluation: all of an iterable's, its first ``batches``, or
    ``batches`` calls of a function that returns one batch per call."""
    if isinstance(source, Iterable):
        return source if batches is None else itertools.islice(source, batches)
    if batches is None:
        raise ValueError(
            f"evaluating {_name(source)}, a function that returns one batch per call, "
            f"needs batches=N: how many batches to evaluate"
        )
    return (source() for _ in range(batches))


def with_loss_reduction(metrics: dict[str, Metric], reduction: str) -> dict[str, Metric]:
    """``metrics`` with their loss metrics (``DoubleLoss``, by its ``reduced_by``) summing
    by ``reduction``; ``"mean"`` leaves them as they are."""
    if reduction not in REDUCTIONS:
        raise ValueError(
            f"loss_reduction= is one of {', '.join(map(repr, REDUCTIONS))}; got {reduction!r}"
        )
    if reduction == "mean":
        return metrics
    # looked up on the class: an ignite Metric's __getattr__ makes a lazy metric of any name
    losses = {name for name, m in metrics.items() if hasattr(type(m), "reduced_by")}
    if not losses:
        raise ValueError(
            f"loss_reduction={reduction!r} sets how the loss metric of the model's "
            f"metrics() sums, and these metrics ({', '.join(metrics)}) have none"
        )
    return {name: m.reduced_by(reduction) if name in losses else m for name, m in metrics.items()}


def _name(source: object) -> str:
    return getattr(source, "__qualname__", None) or type(source).__name__


@contextlib.contextmanager
def _generators_kept(device: torch.device) -> Iterator[None]:
    """torch's generators (CPU, and ``device``'s when CUDA), Python's and NumPy's as they
    were, afterwards."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        forked = torch.random.fork_rng(devices=[index], device_type="cuda")
    else:
        forked = torch.random.fork_rng(devices=[])
    python_state = random.getstate()
    numpy_random = sys.modules.get("numpy.random")  # not imported: nothing drew from it
    numpy_state = None if numpy_random is None else numpy_random.get_state()
    try:
        with forked:
            yield
    finally:
        random.setstate(python_state)
        if numpy_state is not None:
            numpy_random.set_state(numpy_state)  # type: ignore[union-attr]

"""Checks that several packs make: reading a metric as a number, needing a train step
that fires the backward and optimizer_step phases, needing the model's optimizer (and
one that takes no closure); and the parameters a step trains."""

from __future__ import annotations

from typing import Any

import torch

from ..core.checks import did_you_mean, is_number
from ..models.torchutil import needs_closure, unwrap

__all__ = [
    "TRAIN_MODES",
    "metric_value",
    "read_metric",
    "refuse_closure_optimizer",
    "require_optimizer",
    "require_phased_step",
    "trained_parameters",
    "zero_grads",
]


def metric_value(state: Any, metric: str, owner: str) -> float:
    """``state.metrics[metric]`` as a float; a missing metric or one that is no number is
    an error that ``owner`` (``"EarlyStopping"``) raises, naming the metrics there are."""
    value = read_metric(state, metric)
    if value is None:
        names = sorted(state.metrics)
        raise ValueError(
            f"{owner}: no metric {metric!r} in state.metrics at the end of epoch "
            f"{state.epoch}.{did_you_mean(metric, names)} There are: "
            f"{', '.join(names) or 'none'} "
            f"(attach Evaluate() for eval_loss and the other eval_ metrics; a "
            f"hook that puts a metric there can declare it with writes=)"
        )
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value)
    if not is_number(value):
        raise TypeError(
            f"{owner}: state.metrics[{metric!r}] is {type(value).__name__} {value!r}, not a number"
        )
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


def require_phased_step(
    engine: Any, owner: str, phases: str = "the backward and optimizer_step phases"
) -> None:
    """In a train run, ``owner`` needs a step that fires ``phases`` (a TorchModel's, with
    the Supervised interface): say so at setup, not at step 10,000."""
    model = engine.model
    if engine.state.mode == "train" and not getattr(
        getattr(model, "interface", None), "phased", False
    ):
        raise TypeError(
            f"{owner} works in {phases}, which {type(model).__name__}'s train "
            f"step does not fire (its step is its own, not a TorchModel's with "
            f"the Supervised interface)"
        )


#: The modes whose steps may be train steps (benchmark and profile can measure them).
TRAIN_MODES = ("train", "benchmark", "profile")


def _trains(engine: Any, modes: tuple[str, ...]) -> bool:
    """Whether the run is one of ``modes`` and its steps are train steps that fire the
    phases (a model whose step is its own is ``require_phased_step``'s to refuse)."""
    return (
        engine.state.mode in modes
        and engine.state.kind == "train"
        and getattr(getattr(engine.model, "interface", None), "phased", False)
    )


def require_optimizer(
    engine: Any, owner: str, why: str, modes: tuple[str, ...] = TRAIN_MODES
) -> None:
    """In a run of train steps (of ``modes``), ``owner`` needs the model's optimizer
    (``why`` says what for): a model whose update is an override of its own has none,
    and is refused at setup."""
    model = engine.model
    if _trains(engine, modes) and getattr(model, "optimizer", None) is None:
        raise ValueError(
            f"{owner} {why}, and {type(model).__name__} has no optimizer (its "
            f"update is an override of optimizer_step); set "
            f"{type(model).__name__}.optimizer in setup(), or leave {owner} out"
        )


def refuse_closure_optimizer(
    engine: Any, owner: str, why: str, modes: tuple[str, ...] = TRAIN_MODES
) -> None:
    """In a run of train steps (of ``modes``) with a closure optimizer
    (``torch.optim.LBFGS``), refuse ``owner``, which cannot work there (``why`` says
    why)."""
    optimizer = getattr(engine.model, "optimizer", None)
    if _trains(engine, modes) and optimizer is not None and needs_closure(optimizer):
        raise ValueError(
            f"{owner} cannot work with {type(optimizer).__name__}, a closure "
            f"optimizer (its step calls the closure that computes the loss and "
            f"gradients, as many times as it needs): {why}"
        )


def trained_parameters(model: Any) -> list[torch.Tensor]:
    """The parameters a train step updates: the optimizer's, or, for a model whose update
    is an override of its own (no optimizer), its module's."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        return [p for group in optimizer.param_groups for p in group["params"]]
    module = unwrap(getattr(model, "module", None))
    return list(module.parameters()) if module is not None else []


def zero_grads(model: Any) -> None:
    """Drop the gradients of the parameters a train step updates."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
        return
    for p in trained_parameters(model):
        p.grad = None

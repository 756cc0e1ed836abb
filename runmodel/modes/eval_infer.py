"""Eval and infer modes: a step is the model's output without grad; eval mode feeds
pytorch-ignite metrics (``runmodel.models.metrics``) into ``state.metrics`` at each
epoch's end, infer mode collects the outputs (or leaves them to hooks). An eval run is
one evaluation pass: ``eval_start`` fires once after ``setup`` (before the first
``epoch_start``), ``eval_end`` once after the last ``epoch_end``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

from ..core import StepPlan
from ..models import MetricSet, TorchModel, inference, unwrap
from ..models.outputs import computes_loss, loss_of
from .base import Mode, check_steps_for, model_step

if TYPE_CHECKING:
    from ..core import BareEngine

__all__ = ["Eval", "Infer", "infer_plan"]


class Eval(Mode):
    """The model's metrics over its eval data, without grad: ``result.metrics``."""

    name: ClassVar[str] = "eval"

    def plan(self, engine: BareEngine, model: Any) -> StepPlan:
        if not isinstance(model, TorchModel):
            return StepPlan(
                {"runstep": model_step(model)}, context=lambda: _one_pass(engine, model)
            )
        check_steps_for("eval", model, "module")
        metrics = MetricSet(model.metrics())
        compute_output = model.interface.output_fn(model)
        target, compute_loss, has_loss = model.target, model.compute_loss, model.loss_fn is not None
        if not has_loss and type(model).compute_loss is TorchModel.compute_loss:
            # the loss the module computes, where it does (a batch without labels: none)
            has_loss = computes_loss(unwrap(model.module))
            compute_loss = _computed_loss

        def eval_step(engine: BareEngine) -> None:
            state = engine.state
            batch = state.batch
            state.output = output = compute_output(batch)
            if has_loss:
                state.loss = compute_loss(output, batch)
            metrics.update(output, target(batch))

        def reset(engine: BareEngine) -> None:
            metrics.reset()

        def compute(engine: BareEngine) -> None:
            engine.state.metrics.update(metrics.compute())

        return StepPlan(
            {"runstep": eval_step},
            before={"epoch_start": [reset], "epoch_end": [compute]},
            context=lambda: _one_pass(engine, model),
            writes=tuple(metrics.metrics),
        )


def _computed_loss(output: Any, batch: Any) -> Any:
    return loss_of(output)


@contextlib.contextmanager
def _one_pass(engine: BareEngine, model: Any) -> Iterator[None]:
    """An eval run's loop, without grad and the module in eval mode, between the
    ``eval_start`` and ``eval_end`` phases (the second when the loop ended without an
    error)."""
    with inference(model):
        engine.fire("eval_start")
        yield
        engine.fire("eval_end")


class Infer(Mode):
    """The model's outputs without grad, collected into ``result.outputs``, or with
    ``collect=False`` only handed to hooks (``state.output``), for outputs too large to
    keep."""

    name: ClassVar[str] = "infer"

    def __init__(self, collect: bool = True) -> None:
        if not isinstance(collect, bool):
            raise TypeError(f"Infer(collect=) takes True or False, got {collect!r}")
        self.collect = collect

    def plan(self, engine: BareEngine, model: Any) -> StepPlan:
        plan = infer_plan(model)
        if self.collect:
            outputs: list[Any] = []
            plan.after["runstep"] = [lambda engine: outputs.append(engine.state.output)]
            plan.finish = lambda engine: {"outputs": outputs}
        return plan


def infer_plan(model: Any) -> StepPlan:
    """An infer step for ``model``: its output for the batch, without grad."""
    if not isinstance(model, TorchModel):
        return StepPlan({"runstep": model_step(model)}, context=lambda: inference(model))
    check_steps_for("infer", model, "module")
    compute_output = model.interface.output_fn(model)

    def infer_step(engine: BareEngine) -> None:
        state = engine.state
        state.output = compute_output(state.batch)

    return StepPlan({"runstep": infer_step}, context=lambda: inference(model))

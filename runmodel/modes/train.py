"""Train mode: a step is the forward, backward and optimizer_step phases, each an action
that hooks follow and overrides wrap, fired through the engine's dispatch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from ..core import StepPlan
from ..models import TorchModel
from ..models.data import track
from .base import Mode, check_steps_for, model_step

if TYPE_CHECKING:
    from ..core import Engine

__all__ = ["Train"]


class Train(Mode):
    """Forward, backward and optimizer_step; the model's module in training mode."""

    name: ClassVar[str] = "train"

    def plan(self, engine: Engine, model: Any) -> StepPlan:
        return train_plan(engine, model)


def train_plan(engine: Engine, model: Any) -> StepPlan:
    """What a train step does for ``model``: its interface's three parts as the phases'
    actions; a custom interface's ``train_step``; a plain ``Model``'s ``step``."""
    interface = getattr(model, "interface", None)
    if interface is not None and not interface.phased:
        return StepPlan({"runstep": _interface_step(model, interface)},
                        data=track(getattr(model, "train_data", None)))
    if not isinstance(model, TorchModel):
        return StepPlan({"runstep": model_step(model)})
    mode = engine.state.mode
    if any(o.options.modes is None or mode in o.options.modes
           for o in engine.table.overrides["runstep"]):
        check_steps_for("train", model, "module")  # the override's step may use neither
    else:
        check_steps_for("train", model, "module", "optimizer", "loss_fn",
                        hint=" (from_parts: optimizer=, loss_fn=), or write the step yourself "
                             "with engine.override('runstep', ...)")
    assert model.module is not None and interface is not None  # checked: TorchModel has both
    model.module.train()
    forward, backward, optimizer_step = (interface.forward, interface.backward,
                                         interface.optimizer_step)
    dispatch = engine.dispatch

    def forward_action(engine: Engine) -> None:
        state = engine.state
        state.output, state.loss = forward(model, state.batch)

    def backward_action(engine: Engine) -> None:
        backward(model, engine.state.loss)

    def optimizer_step_action(engine: Engine) -> None:
        optimizer_step(model)

    def train_step(engine: Engine) -> None:
        if (dispatch.forward is forward_action and dispatch.backward is backward_action
                and dispatch.optimizer_step is optimizer_step_action):
            # no hook, override or instrument on the three phases (their dispatch is the
            # bare action): the same three parts, without three calls between them
            state = engine.state
            state.output, state.loss = forward(model, state.batch)
            backward(model, state.loss)
            optimizer_step(model)
            return
        dispatch.forward(engine)
        dispatch.backward(engine)
        dispatch.optimizer_step(engine)

    return StepPlan({"runstep": train_step, "forward": forward_action,
                     "backward": backward_action, "optimizer_step": optimizer_step_action},
                    data=track(model.train_data),
                    parts={"forward": forward, "backward": backward,
                           "optimizer_step": optimizer_step})


def _interface_step(model: Any, interface: Any) -> Any:
    train_step = interface.train_step

    def runstep(engine: Engine) -> None:
        state = engine.state
        state.output = result = train_step(model, state.batch)
        state.loss = result.get("loss") if isinstance(result, dict) else None
    return runstep

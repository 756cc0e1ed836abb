"""Train mode: a step is the forward, backward and optimizer_step phases, each an action
that hooks follow and overrides wrap, fired through the engine's dispatch.

With a closure optimizer (``torch.optim.LBFGS``, whose ``step`` calls a closure that
recomputes the loss), the step is the optimizer_step phase alone: its action is
``optimizer.step(closure)``, and the closure fires forward and backward at each call.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from ..core import StepPlan
from ..core.filters import past_once_hooks
from ..core.metric_names import declared_reads
from ..models import TorchModel
from ..models.data import track
from ..models.outputs import computes_loss
from ..models.torchutil import needs_closure, unwrap
from .base import Mode, check_steps_for, model_step

if TYPE_CHECKING:
    from ..core import BareEngine

__all__ = ["EPOCH_LOSS", "Train", "train_plan"]

#: The metric a train run puts into ``state.metrics`` at each epoch's end when a hook or
#: pack of the run declares reading it (``reads="loss"``): the mean loss of the epoch's
#: steps. ``state.loss`` stays the last step's.
EPOCH_LOSS = "loss"


class Train(Mode):
    """Forward, backward and optimizer_step; the model's module in training mode."""

    name: ClassVar[str] = "train"

    def plan(self, engine: BareEngine, model: Any) -> StepPlan:
        plan = train_plan(engine, model)
        if engine.resumed_from is not None:
            plan.before.setdefault("epoch_start", []).insert(0, _PastOnceHooks().say)
        return plan


def train_plan(engine: BareEngine, model: Any) -> StepPlan:
    """What a train step does for ``model``: its interface's three parts as the phases'
    actions; a custom interface's ``train_step``; a plain ``Model``'s ``step``."""
    interface = getattr(model, "interface", None)
    if interface is not None and not interface.phased:
        plan = StepPlan(
            {"runstep": _interface_step(model, interface)},
            data=track(getattr(model, "train_data", None)),
        )
    elif not isinstance(model, TorchModel):
        plan = StepPlan({"runstep": model_step(model)})
    else:
        _check_parts(engine, model)
        assert model.module is not None and interface is not None  # checked above
        model.module.train()
        closure = model.optimizer is not None and needs_closure(model.optimizer)
        plan = (_closure_plan if closure else _phased_plan)(engine, model, interface)
    if engine.state.mode == "train" and _loss_read(engine):
        _add_epoch_loss(plan, engine.state)
    return plan


def _loss_read(engine: BareEngine) -> bool:
    """Whether a hook or pack of the run declares reading the ``loss`` metric."""
    try:
        return EPOCH_LOSS in declared_reads(engine.table, engine.state.mode, engine.state.rank)
    except TypeError:  # a malformed declaration: the setup-time check refuses it
        return False


def _phased_plan(engine: BareEngine, model: TorchModel, interface: Any) -> StepPlan:
    forward, backward, optimizer_step = (
        interface.forward,
        interface.backward,
        interface.optimizer_step,
    )
    if model.optimizer is None:  # the update is an override's (checked): guard the default
        optimizer_step = _optimizer_wanted(optimizer_step)
    dispatch = engine.dispatch

    def forward_action(engine: BareEngine) -> None:
        state = engine.state
        state.output, state.loss = forward(model, state.batch)

    def backward_action(engine: BareEngine) -> None:
        backward(model, engine.state.loss)

    def optimizer_step_action(engine: BareEngine) -> None:
        optimizer_step(model)

    def train_step(engine: BareEngine) -> None:
        if (
            dispatch.forward is forward_action
            and dispatch.backward is backward_action
            and dispatch.optimizer_step is optimizer_step_action
        ):
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

    return _plan(
        model,
        (train_step, forward_action, backward_action, optimizer_step_action),
        (forward, backward, optimizer_step),
    )


def _closure_plan(engine: BareEngine, model: TorchModel, interface: Any) -> StepPlan:
    """A step of a closure optimizer: ``optimizer.step(closure)``, where the closure
    zeroes the gradients and fires forward and backward, as the hand-written loop's
    closure does. After the step ``state.loss`` is what ``step`` returned (LBFGS: the
    loss before the step, as for any optimizer)."""
    forward, backward = interface.forward, interface.backward
    dispatch, state = engine.dispatch, engine.state

    def forward_action(engine: BareEngine) -> None:
        state.output, state.loss = forward(model, state.batch)

    def backward_action(engine: BareEngine) -> None:
        backward(model, state.loss)

    def closure() -> Any:
        model.optimizer.zero_grad()  # type: ignore[union-attr]  # a closure optimizer's
        dispatch.forward(engine)
        dispatch.backward(engine)
        return state.loss

    def step_with_closure(model: TorchModel) -> None:
        loss = model.optimizer.step(closure)  # type: ignore[union-attr]
        if loss is not None:
            state.loss = loss

    def optimizer_step_action(engine: BareEngine) -> None:
        step_with_closure(model)

    def train_step(engine: BareEngine) -> None:
        dispatch.optimizer_step(engine)

    return _plan(
        model,
        (train_step, forward_action, backward_action, optimizer_step_action),
        (forward, backward, step_with_closure),
    )


def _plan(model: TorchModel, actions: tuple[Any, ...], parts: tuple[Any, ...]) -> StepPlan:
    """A train step's plan: its actions (``runstep``, ``forward``, ``backward``,
    ``optimizer_step``, in that order), the model's training data, and the parts the
    actions call (``forward``, ``backward``, ``optimizer_step``), which a custom step
    calls itself."""
    return StepPlan(
        dict(zip(("runstep", "forward", "backward", "optimizer_step"), actions, strict=True)),
        data=track(model.train_data),
        parts=dict(zip(("forward", "backward", "optimizer_step"), parts, strict=True)),
    )


# -- what a step needs ---------------------------------------------------------------------


def _check_parts(engine: BareEngine, model: TorchModel) -> None:
    """The parts of ``model`` the step will use: ``module`` always; ``optimizer`` unless
    an override of ``optimizer_step`` makes the update; ``loss_fn`` unless
    ``compute_loss`` is the model's own (or a ``runstep`` override is the whole step)."""
    overridden = {
        phase
        for phase in ("runstep", "optimizer_step")
        if any(
            o.options.modes is None or engine.state.mode in o.options.modes
            for o in engine.table.overrides[phase]
        )
    }
    if "runstep" in overridden:
        check_steps_for("train", model, "module")  # the override's step may use neither
        return
    needed = ["module"]
    if "optimizer_step" not in overridden:
        needed.append("optimizer")
    if getattr(model.compute_loss, "__func__", None) is TorchModel.compute_loss and not (
        computes_loss(unwrap(model.module))
    ):
        # the model's own compute_loss may do without, as a module that computes its loss
        needed.append("loss_fn")
    check_steps_for(
        "train",
        model,
        *needed,
        hint=" (from_parts: optimizer=, loss_fn=); to write the update yourself, "
        "engine.override('optimizer_step', ...), which needs no optimizer; "
        "the whole step, engine.override('runstep', ...)",
    )


def _optimizer_wanted(optimizer_step: Any) -> Any:
    """The built-in optimizer step of a model that has no optimizer, reached by an
    override that called ``default``: a clear error, unless a hook has set one since."""

    def step(model: Any) -> None:
        if model.optimizer is None:
            raise RuntimeError(
                f"an override of optimizer_step called default(engine), whose "
                f"built-in action steps {type(model).__name__}.optimizer, and "
                f"there is none: make the update in the override without "
                f"calling default, or set the optimizer in setup()"
            )
        optimizer_step(model)

    return step


# -- the epoch's mean loss -----------------------------------------------------------------


class _EpochLoss:
    """The sum of the epoch's step losses on their device, in float64 (no sync, no drift),
    read once at the epoch's end into ``state.metrics["loss"]``. A step only keeps its
    detached loss (``add``, a closure: the step's whole cost is a detach and an append);
    every ``FLUSH`` steps, at a checkpoint and at the epoch's end they are summed in order
    after the running total (a float64 ``cumsum``: on a CPU the same sum as a script's
    ``total += loss.item()``). The total and count are run state (``state.epoch_sums``):
    a run resumed in the middle of an epoch goes on from them."""

    __slots__ = ("add", "count", "pending", "total")

    FLUSH = 1024

    def __init__(self) -> None:
        self.total: torch.Tensor | None = None
        self.pending: list[torch.Tensor] = []
        self.count = 0
        append, pending, flush, most = self.pending.append, self.pending, self._flush, self.FLUSH

        def add(engine: BareEngine) -> None:
            loss = engine.state.loss
            if loss is not None:
                append(loss.detach())
                if len(pending) == most:
                    flush()

        self.add = add

    def reset(self, engine: BareEngine) -> None:
        if engine.state.epoch_step:  # a resumed epoch: its sum goes on
            return
        self.total, self.count = None, 0
        self.pending.clear()

    def _flush(self) -> None:
        pending = self.pending
        losses = torch.stack(pending) if len(pending) > 1 else pending[0].reshape(1)
        dtype = torch.float32 if losses.device.type == "mps" else torch.float64
        losses = losses.to(dtype)
        if self.total is not None:
            losses = torch.cat((self.total.to(losses.device, dtype).reshape(1), losses))
        self.total = losses.cumsum(0)[-1]
        self.count += len(pending)
        pending.clear()

    def publish(self, engine: BareEngine) -> None:
        if self.pending:
            self._flush()
        if self.count and self.total is not None:
            engine.state.metrics[EPOCH_LOSS] = self.total.item() / self.count

    def state_dict(self) -> dict[str, Any]:
        """The epoch's sum so far and its number of steps, as plain numbers."""
        if self.pending:
            self._flush()
        return {"total": 0.0 if self.total is None else self.total.item(), "count": self.count}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        self.pending.clear()
        self.count = int(saved.get("count", 0))
        self.total = torch.tensor(float(saved.get("total", 0.0)), dtype=torch.float64)


def _add_epoch_loss(plan: StepPlan, state: Any) -> None:
    """Accumulate the loss after each step (before the ``runstep`` hooks) and put the
    epoch's mean into ``state.metrics`` before the ``epoch_end`` hooks; the sum is run
    state, taken from the checkpoint a run resumes from."""
    mean = _EpochLoss()
    saved = state.epoch_sums.get(EPOCH_LOSS)
    if isinstance(saved, dict):
        mean.load_state_dict(saved)
    state.epoch_sums[EPOCH_LOSS] = mean
    plan.before.setdefault("epoch_start", []).append(mean.reset)
    plan.before.setdefault("runstep", []).append(mean.add)
    plan.before.setdefault("epoch_end", []).append(mean.publish)


# -- resuming --------------------------------------------------------------------------------


class _PastOnceHooks:
    """At a resume, one line on stderr (rank 0) naming the ``once=`` hooks of the setup
    and epoch phases that this run will not fire: their moment came before the
    checkpoint (what they did to the model is in it: weights, ``requires_grad``). Said
    at the resumed run's first ``epoch_start``, before its hooks, where the counters say
    whether the run goes on in the middle of an epoch or at the start of the next."""

    def __init__(self) -> None:
        self.said = False

    def say(self, engine: BareEngine) -> None:
        if self.said:
            return
        self.said = True
        state = engine.state
        past = past_once_hooks(engine.table, state, ("setup", "epoch_start", "epoch_end"))
        if past and state.rank == 0:
            names = ", ".join(
                f"{h.name!r} ({h.phase}, once={_as_written(h.options.once)})" for h in past
            )
            print(
                f"runmodel: resumed at epoch {state.epoch}, step {state.step}; the moment "
                f"of these once= hooks is past, so this run does not fire them: {names}",
                file=sys.stderr,
            )


def _as_written(once: Any) -> str:
    """A ``once=`` position as it was written: ``2``, ``'2ep'``, ``True``."""
    if once.text == "first":
        return "True"
    return once.text if once.unit == "own" else repr(once.text)


def _interface_step(model: Any, interface: Any) -> Any:
    train_step = interface.train_step

    def runstep(engine: BareEngine) -> None:
        state = engine.state
        state.output = result = train_step(model, state.batch)
        state.loss = result.get("loss") if isinstance(result, dict) else None

    return runstep

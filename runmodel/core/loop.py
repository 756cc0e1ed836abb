"""One run's loop: the runstep callable handed to the model, its epochs, the step budget,
the run controls (``stop``, ``end_epoch``, ``skip_step``), and how the run ends when an
error does: the ``exception`` phase, then teardown.

The model owns its loop and calls ``runstep(batch)`` once per step; a ``Loop`` decides
what each call does. Its fast path is one comparison: ``guard`` drops to -1 whenever the
slow path has something to do (the budget, a stop, opening or closing an epoch).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .options import describe_fn
from .position import BETWEEN, END, STEPS, Position
from .state import REFUSED, Interrupted, Preempted, RunStep, StopRun, signal_name

if TYPE_CHECKING:
    from .engine import BareEngine

__all__ = ["Loop"]

_NO_BUDGET = sys.maxsize


class Loop:
    """The loop of one run of ``engine``: at most ``steps`` steps, ``epochs`` epochs."""

    def __init__(self, engine: BareEngine, steps: int | None, epochs: int | None) -> None:
        self.engine, self.state = engine, engine.state
        self.budget = _NO_BUDGET if steps is None else steps
        # without epochs=, the model's loop decides: one epoch, or as many as steps= needs
        self.max_epochs: float = (
            epochs if epochs is not None else (1 if steps is None else float("inf"))
        )
        self.ended = "completed"
        self.reason: str | None = None  # what stop() was given
        self.interrupted = False  # engine.interrupt(): the run ends with Interrupted
        self.preempted_by: int | None = None  # ... with Preempted, by this signal
        self.stopping = self.epoch_open = self.epoch_ending = self.explicit_epochs = False
        self.skip = self.in_step_start = False
        self.refusing = False  # while packs' check() runs: a failure is a refusal
        self.first_epoch = True
        self.first_step: int | None = None  # the step this run's first runstep call found
        self.held: tuple[str | None, int] | None = None  # a preemption before its first step
        self.position = Position(self.state, None)  # the plan's data tracker joins later
        #: per epoch, the positions in its data of the batches left out (``leave_out``)
        self.left_out: dict[int, set[int]] = {}
        self.guard = -1  # runstep takes its slow path while step >= guard

    def _arm(self) -> None:
        """The fast path while an epoch runs with nothing to do but steps."""
        p = self.position
        busy = (
            self.stopping
            or self.held is not None
            or self.epoch_ending
            or not self.epoch_open
            or p.replay
            or (p.pending is not None)
        )
        self.guard = -1 if busy else self._next_stop()

    def _next_stop(self) -> int:
        """The budget, or the step at which the epoch's next batch to leave out comes, if
        sooner (the slow path drops it)."""
        left = self.left_out.get(self.state.epoch)
        if not left:
            return self.budget
        at = self.position.batches()
        ahead = [b for b in left if b >= at]
        return min(self.budget, self.state.step + min(ahead) - at) if ahead else self.budget

    def restart(self) -> None:
        """Before the model's loop starts again from a checkpoint (``engine.rewind``): the
        loop as at the run's start, its data tracker, budget, stop and left-out batches
        kept; the checkpoint then positions the data (``position.resume``)."""
        self.position = Position(self.state, self.position.tracker)
        self.epoch_open = self.epoch_ending = self.explicit_epochs = False
        self.skip = self.in_step_start = False
        self.first_epoch = True
        self.guard = -1

    # -- run controls -------------------------------------------------------------------

    def stop(self, reason: str | None = None, why: str = "stopped") -> None:
        if not self.stopping:
            self.reason = reason
        if self.state.stopping is None:
            self.state.stopping = why
        self.stopping, self.guard = True, -1

    def interrupt(self, reason: str | None, signal: int | None) -> None:
        """``engine.interrupt()``: stop after this step, then raise ``Interrupted``
        (``Preempted`` for a preemption ``signal``) once the model's loop has ended. A
        preemption before this run's first step is held until that step is done (a run
        that ends first, its budget spent, ends as it would have)."""
        if signal is not None and (self.first_step is None or self.state.step == self.first_step):
            # a preemption before this run's first step waits for that step: a job signalled
            # as it starts again (SLURM's time-limit signal comes up to a minute early) still
            # makes progress, instead of being requeued with none, again and again
            self.held, self.guard = (reason, signal), -1
            return
        if reason is None:
            reason = (
                "interrupted: Ctrl-C" if signal is None else f"preempted: {signal_name(signal)}"
            )
        self.stop(reason, "interrupted" if signal is None else "preempted")
        self.interrupted, self.preempted_by = True, signal

    def end_epoch(self) -> None:
        if not self.epoch_open:
            return  # no epoch to end (a setup hook, say)
        if not self.explicit_epochs:
            self.stop()
        else:
            self.epoch_ending, self.guard = True, -1

    def skip_step(self) -> None:
        if not self.in_step_start:
            raise RuntimeError(
                "skip_step() drops a batch before its step runs, so only a "
                "step_start hook may call it; use stop() or end_epoch() elsewhere"
            )
        self.skip = True

    def leave_out(self, epoch: int, batches: set[int]) -> None:
        self.left_out.setdefault(epoch, set()).update(batches)
        self.guard = -1  # the slow path arms the fast one again, with these in view

    # -- the runstep callable ---------------------------------------------------------------

    def runstep(self, kind: str) -> RunStep:
        """The callable handed to ``model.run``; one call is one step of ``kind``."""
        loop, engine, state, dispatch = self, self.engine, self.state, self.engine.table.dispatch
        slow_path = self._before_step

        def runstep(batch: Any = None) -> Any:
            if state.step >= loop.guard and not slow_path():
                return None
            state.batch = batch
            step_start = dispatch.step_start
            if step_start is not None:
                loop.in_step_start = True
                step_start(engine)
                loop.in_step_start = False
                if loop.skip:
                    loop.skip = False
                    state.skipped += 1
                    if loop.left_out:  # the data ran one batch ahead of the steps
                        loop.guard = -1
                    return None
            dispatch.runstep(engine)
            state.step += 1
            state.epoch_step += 1
            return state.output

        step: Any = runstep
        step.epochs, step.engine, step.mode, step.kind, step.steps = (
            self.epochs,
            engine,
            state.mode,
            kind,
            state.max_steps,
        )
        engine.table.where.add("runstep (engine)", runstep)
        return step

    def _before_step(self) -> bool:
        """The slow path of runstep: end the run, drop the call, open an epoch, or go on
        with a resumed epoch (drop a replayed batch; restore the generators); drop a batch
        left out; a preemption held until this run's first step is done stops it now."""
        if self.first_step is None:
            self.first_step = self.state.step
        elif self.held is not None and self.first_step < self.state.step < self.budget:
            (reason, signal), self.held = self.held, None
            self.interrupt(reason, signal)
        if self.stopping or self.state.step >= self.budget:
            self.ended = "stopped" if self.stopping else "budget"
            if self.state.stopping is None:
                self.state.stopping = self.ended
            raise StopRun
        if self.epoch_ending:
            return False
        if not self.epoch_open and not self.explicit_epochs:
            if self.state.epoch >= self.max_epochs:  # epochs=0, or a resume past the end
                raise StopRun
            self.begin_epoch()  # a loop without runstep.epochs() is one implicit epoch
        p = self.position
        if p.replay:
            p.replay -= 1  # drawn before the checkpoint: not run again
            return False
        if p.pending is not None:
            restore, p.pending = p.pending, None
            restore()
        left = self.left_out.get(self.state.epoch)
        if left and p.batches() in left:
            self.state.skipped += 1  # drawn, not run: counted as a skip_step's batch
            self._arm()
            return False
        self._arm()
        return True

    def epochs(self) -> Iterator[int]:
        """``runstep.epochs()``: the epochs of the run, each between its phases."""
        if self.epoch_open:
            raise RuntimeError(
                "runstep.epochs() was entered after steps already ran outside "
                "it; start the model's loop with `for epoch in runstep.epochs()`"
            )
        self.explicit_epochs = True
        s = self.state
        while s.epoch < self.max_epochs and not self.stopping and s.step < self.budget:
            steps_before, skipped_before = s.step, s.skipped
            resumed = self.first_epoch and self.position.pending is not None
            self.begin_epoch()
            if self.stopping:  # stop() from an epoch_start hook
                self.end_epoch_now(completed=False)
                break
            self.position.data_begins(first_epoch_begun=True)
            yield s.epoch
            ended_early = self.epoch_ending or self.stopping
            # no batch at all (skipped ones count: skip_step and NaNGuard drew them); a
            # resumed epoch may have had none left
            empty = (
                s.step == steps_before
                and s.skipped == skipped_before
                and not (ended_early or resumed or self.position.replay)
            )
            if empty:
                raise RuntimeError(
                    f"epoch {s.epoch} drew no batch: {_empty(self.engine)}, "
                    f"so the run would go on with nothing done; give it data "
                    f"(an empty dataset? drop_last=True with fewer samples "
                    f"than batch_size?)"
                )
            self.end_epoch_now(completed=True)
        if self.stopping:
            self.ended = "stopped"
        elif s.step >= self.budget and s.epoch < self.max_epochs:
            self.ended = "budget"

    def begin_epoch(self) -> None:
        resumed = self.first_epoch and self.position.pending is not None  # mid-epoch
        if not resumed:
            self.state.epoch_step = 0
        self.position.epoch_begins(resumed)
        if self.first_step is None:  # the fast path may take this run's first step
            self.first_step = self.state.step
        self.first_epoch = False
        self.epoch_open, self.epoch_ending = True, False
        self._arm()
        self.engine.fire("epoch_start")
        self.position.stage = STEPS

    def end_epoch_now(self, completed: bool) -> None:
        p = self.position
        if p.pending is not None:  # a resumed epoch with no batch left: restore now
            restore, p.pending, p.replay = p.pending, None, 0
            restore()
        self.state.epoch_complete = completed
        self.position.stage = END
        self.engine.fire("epoch_end")
        if completed:
            self.state.epoch += 1
        self.epoch_open = self.epoch_ending = False
        self.position.stage = BETWEEN
        self.guard = -1

    def finish(self) -> None:
        """After the model's loop returned (or the budget or stop() ended it); an
        interrupt's exception is raised now, the open epoch ended."""
        if self.stopping:
            self.ended = "stopped"
        if self.epoch_open:
            self.end_epoch_now(completed=self.ended == "completed")
        if self.interrupted:
            said = f"{self.reason} (after step {self.state.step})"
            raise (
                Interrupted(said)
                if self.preempted_by is None
                else Preempted(said, self.preempted_by)
            )

    # -- errors and teardown -------------------------------------------------------------

    def failed(self, error: BaseException, only: set[int] | None = None) -> None:
        """Note where ``error`` was raised, then fire the ``exception`` phase (only the
        hooks of the packs in ``only``, by id, when given: a refused run)."""
        s = self.state
        s.error = error
        self.ended = "interrupted" if isinstance(error, KeyboardInterrupt) else "failed"
        if only is not None:
            error.add_note(REFUSED)
        elif not isinstance(error, Interrupted):  # raised by the run itself: no place to name
            error.add_note(
                f"runmodel: raised in {self.engine.table.where.locate(error)} "
                f"({s.mode} mode, epoch {s.epoch}, step {s.step})"
            )
        self._fire_guarded("exception", error, only)

    def teardown(self, model: Any, only: set[int] | None = None) -> None:
        """The ``teardown`` hooks (those of the packs in ``only``, when given), then
        ``model.teardown()``, each even if the other raised; a failure of theirs is
        raised only when no error ended the run."""
        error, failure = self.state.error, None
        self.state.ended = self.ended
        try:
            failure = self._fire_guarded("teardown", error, only)
        finally:
            try:
                model.teardown()
            except Exception as teardown_error:
                if error is not None:
                    error.add_note(f"runmodel: model.teardown() also raised {teardown_error!r}")
                failure = failure or teardown_error
        if failure is not None and error is None:
            raise failure

    def _fire_guarded(
        self, phase: str, error: BaseException | None, only: set[int] | None = None
    ) -> BaseException | None:
        """Fire every hook of ``phase`` (of the packs in ``only``, when given) even if
        some raise; return the first failure."""
        first = None
        table = self.engine.table
        hooks = table.dispatch.hooks[phase] if only is None else table.compiled(phase, only)
        for hook in hooks:
            try:
                hook(self.engine)
            except Exception as failure:
                if error is not None:
                    error.add_note(
                        f"runmodel: {phase} hook {describe_fn(hook)} also raised {failure!r}"
                    )
                elif first is None:
                    first = failure
                    failure.add_note(f"runmodel: raised in phase {phase!r}")
        return first


def _empty(engine: BareEngine) -> str:
    """What yielded no batch, as an error names it: the model's loader, else the model."""
    model, kind = engine.model, engine.state.kind
    name = type(model).__name__
    data_for = getattr(model, "data_for", None)
    if not callable(data_for):
        return f"{name}.run() made no runstep call in it"
    try:
        data = data_for(kind)
    except Exception:
        return f"{name}'s {kind} data yielded nothing"
    dataset = getattr(data, "dataset", None)
    if dataset is None:
        size = len(data) if hasattr(data, "__len__") else "?"
        return f"{name}'s {kind} data ({type(data).__name__} of {size} batches) yielded nothing"
    try:
        samples = f"{len(dataset)} samples"
    except TypeError:
        samples = "samples"
    return (
        f"{name}'s {kind} data ({type(data).__name__} over {type(dataset).__name__} of "
        f"{samples}, batch_size={getattr(data, 'batch_size', None)}, "
        f"drop_last={getattr(data, 'drop_last', None)}) yielded nothing"
    )

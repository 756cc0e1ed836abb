"""``engine.ignite``: a real pytorch-ignite ``Engine`` that mirrors a runmodel engine's
runs, so that ignite's handlers and metrics attach to a runmodel run unchanged.

Built on the first read of ``engine.ignite`` (an engine that never reads it imports no
ignite and pays nothing). Seven hooks named ``"ignite"`` fire ignite's own events through
ignite's own ``_fire_event`` (so ``every=``, ``once=``, ``event_filter`` and
``last_event_name`` are ignite's), after setting ignite's ``state`` from runmodel's
counters; ignite's counters stay 1-based, as its handlers expect::

    runmodel phase   ignite event(s)                       ignite state set first
    setup            STARTED                               iteration = step, epoch = epoch,
                                                           max_epochs, epoch_length, metrics
    epoch_start      EPOCH_STARTED                         epoch = state.epoch + 1
    step_start       [GET_BATCH_STARTED, GET_BATCH_COMPLETED]  (only when handled)
                     ITERATION_STARTED                     iteration += 1, batch
    runstep          ITERATION_COMPLETED                   output = output_transform(engine)
                     [TERMINATE_SINGLE_EPOCH]              (after terminate_epoch())
    epoch_end        EPOCH_COMPLETED (unless the epoch was cut short or terminate() called)
    exception        EXCEPTION_RAISED(error)
    teardown         [TERMINATE], COMPLETED (when no error ended the run)

``ignite_engine.terminate()`` stops the runmodel run (``engine.stop()``), at once when
called before a step; ``terminate_epoch()`` ends the epoch (``engine.end_epoch()``).
Unlike ignite, an error is always raised again after the EXCEPTION_RAISED handlers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from ignite.engine import Engine as IgniteEngine
from ignite.engine import Events

__all__ = ["IgniteView", "MirrorEngine", "default_output"]

_PHASES = ("setup", "epoch_start", "step_start", "runstep", "epoch_end", "exception",
           "teardown")


def default_output(engine: Any) -> Any:
    """What the ignite engine's ``state.output`` holds after a step.

    For a model with ``target(batch)`` (a ``TorchModel``) outside infer steps: ignite's
    dict form ``{"y_pred", "y", "loss", "criterion_kwargs"}``, detached, which every
    ignite ``Metric`` reads unchanged and from which a logger takes
    ``output_transform=lambda o: o["loss"]``. Otherwise runmodel's ``state.output``.
    Set ``engine.ignite.output_transform`` to change it (ignite's own trainer puts
    ``loss.item()`` there: ``lambda e: e.state.loss.item()``, a sync per step on a GPU).
    """
    s = engine.state
    target = getattr(engine.model, "target", None)
    output = s.output
    if isinstance(output, dict) and "output" in output:  # an Interface's train_step result
        output = output["output"]
    if target is None or s.kind == "infer" or output is None:
        return output
    try:
        y = target(s.batch)
    except Exception:  # a batch without a target: runmodel's output as it is
        return output
    return {"y_pred": _detach(output), "y": y, "loss": _detach(s.loss), "criterion_kwargs": {}}


def _detach(value: Any) -> Any:
    return value.detach() if isinstance(value, torch.Tensor) else value


def _not_run_by_ignite(engine: IgniteEngine, batch: Any) -> Any:
    raise RuntimeError("engine.ignite mirrors runmodel's runs; it has no process function")


class MirrorEngine(IgniteEngine):
    """An ignite ``Engine`` whose events come from a runmodel engine's runs;
    ``output_transform(runmodel_engine)`` makes its ``state.output`` at each step."""

    def __init__(self) -> None:
        super().__init__(_not_run_by_ignite)
        self.output_transform: Callable[[Any], Any] = default_output

    def run(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("engine.ignite mirrors a runmodel engine's runs; start a run with "
                           "that engine's run(model, ...), not with ignite's run()")

    def interrupt(self) -> None:
        raise RuntimeError("engine.ignite cannot interrupt and resume a runmodel run; use "
                           "terminate(), or runmodel's checkpoints to resume later")


class IgniteView:
    """Hooks ``engine``'s phases and fires ``self.engine``'s (ignite's) events from them."""

    def __init__(self, engine: Any) -> None:
        self.engine = MirrorEngine()
        self._cut = False  # the last epoch ended before its data did (budget, stop())
        self._t_run = self._t_epoch = 0.0
        for phase in _PHASES:
            engine.on(phase, getattr(self, "_" + phase), name="ignite")

    # -- one hook per phase ------------------------------------------------------------

    def _setup(self, engine: Any) -> None:
        s, ie = engine.state, self.engine
        st = ie.state
        ie.should_terminate = ie.should_terminate_single_epoch = ie.should_interrupt = False
        st.iteration, st.epoch = s.step, s.epoch  # done so far: 0, or where a resume starts
        st.max_iters = s.max_steps
        st.max_epochs = s.max_epochs if s.max_epochs is not None else (
            1 if s.max_steps is None else None)  # runmodel's loop: one epoch unless steps=
        st.dataloader = _data_of(engine.model, s.kind)
        st.epoch_length = _length(st.dataloader)  # else set at the first epoch's end
        st.batch = st.output = None
        st.metrics = s.metrics  # one dict: ignite's metrics land in runmodel's result too
        st.times = {Events.EPOCH_COMPLETED.name: 0.0, Events.COMPLETED.name: 0.0}
        self._cut, self._t_run = False, time.time()
        self._fire(engine, Events.STARTED)
        self._no_epoch_to_end("STARTED")

    def _epoch_start(self, engine: Any) -> None:
        self.engine.state.epoch = engine.state.epoch + 1  # ignite counts epochs from 1
        self._t_epoch = time.time()
        self._fire(engine, Events.EPOCH_STARTED)
        self._no_epoch_to_end("EPOCH_STARTED")

    def _step_start(self, engine: Any) -> None:
        s, ie = engine.state, self.engine
        if ie.should_terminate:  # terminated where runmodel would still run a step
            engine.skip_step()
            return
        st = ie.state
        if ie._event_handlers.get(Events.GET_BATCH_STARTED) or ie._event_handlers.get(
                Events.GET_BATCH_COMPLETED):  # the model fetched it already: data time ~0
            st.batch = None
            if self._fire_in_step(engine, Events.GET_BATCH_STARTED):
                return
            st.batch, st.output = s.batch, None
            if self._fire_in_step(engine, Events.GET_BATCH_COMPLETED):
                return
        # ignite's own rule, +1 per batch started (step + 1 unless a batch was dropped
        # after ITERATION_STARTED, which ignite would have counted too)
        st.iteration, st.batch, st.output = st.iteration + 1, s.batch, None
        if self._fire_in_step(engine, Events.ITERATION_STARTED):
            return
        if st.batch is not s.batch:  # ignite lets ITERATION_STARTED handlers replace it
            s.batch = st.batch

    def _runstep(self, engine: Any) -> None:
        ie = self.engine
        if ie._event_handlers.get(Events.ITERATION_COMPLETED):  # no handler, no transform
            ie.state.output = ie.output_transform(engine)
        self._fire(engine, Events.ITERATION_COMPLETED)
        self._maybe_end_epoch(engine)

    def _epoch_end(self, engine: Any) -> None:
        s, ie = engine.state, self.engine
        st = ie.state
        self._cut = not s.epoch_complete
        if st.epoch_length is None and s.epoch_complete:
            st.epoch_length = s.epoch_step  # as ignite does for data without len()
        st.times[Events.EPOCH_COMPLETED.name] = time.time() - self._t_epoch
        if (s.epoch_complete and not ie.should_terminate
                and ie.should_terminate_single_epoch != "skip_epoch_completed"):
            self._fire(engine, Events.EPOCH_COMPLETED)
            st.times[Events.EPOCH_COMPLETED.name] = time.time() - self._t_epoch
        ie.should_terminate_single_epoch = False

    def _exception(self, engine: Any) -> None:
        # runmodel raises the error again in any case; ignite swallows it when handled
        self.engine._fire_event(Events.EXCEPTION_RAISED, engine.state.error)

    def _teardown(self, engine: Any) -> None:
        if engine.state.error is not None:
            return  # as in ignite: no COMPLETED after an exception
        ie = self.engine
        if not ie.should_terminate and (self._cut or engine.state.ended == "stopped"):
            ie.should_terminate = True  # stop() or the budget cut the run: as max_iters does
        ie.state.times[Events.COMPLETED.name] = time.time() - self._t_run
        if ie.should_terminate:
            ie._fire_event(Events.TERMINATE)
        if ie.should_terminate != "skip_completed":
            ie._fire_event(Events.COMPLETED)
            ie.state.times[Events.COMPLETED.name] = time.time() - self._t_run

    # -- helpers --------------------------------------------------------------------------

    def _fire(self, engine: Any, event: Events) -> None:
        ie = self.engine
        if ie._event_handlers.get(event):
            ie._fire_event(event)  # ignite's own: filters, last_event_name, its logging
        else:
            ie.last_event_name = event  # nothing listens: skip ignite's per-fire logging
        if ie.should_terminate:
            engine.stop("ignite: terminate()")

    def _fire_in_step(self, engine: Any, event: Events) -> bool:
        """Fire ``event`` before the step runs; True when a handler ended the run or the
        epoch: then the step is dropped, as ignite skips its process function."""
        self._fire(engine, event)
        ie = self.engine
        if not (ie.should_terminate or ie.should_terminate_single_epoch):
            return False
        engine.skip_step()
        self._maybe_end_epoch(engine)
        return True

    def _maybe_end_epoch(self, engine: Any) -> None:
        ie = self.engine
        if ie.should_terminate_single_epoch and not ie.should_terminate:
            ie._fire_event(Events.TERMINATE_SINGLE_EPOCH,
                           iter_counter=engine.state.epoch_step + 1)
            engine.end_epoch()  # without runstep.epochs() in the model, this ends the run

    def _no_epoch_to_end(self, event: str) -> None:
        if self.engine.should_terminate_single_epoch:
            self.engine.should_terminate_single_epoch = False
            raise RuntimeError(f"terminate_epoch() may not be called on {event} (as in ignite)")


def _data_of(model: Any, kind: str) -> Any:
    data_for = getattr(model, "data_for", None)
    if data_for is None:
        return None
    try:
        return data_for(kind)
    except Exception:
        return None


def _length(data: Any) -> int | None:
    try:
        return len(data) if data is not None else None
    except TypeError:
        return None

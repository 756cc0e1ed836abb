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

``state.output`` is made (``output_transform``) only when an event that has handlers
fires after the step, and at the run's end, so ITERATION_COMPLETED, EPOCH_COMPLETED and
COMPLETED handlers and a read after the run all see the last step's, as in ignite.

``ignite_engine.terminate()`` stops the runmodel run (``engine.stop()``), at once when
called before a step; ``terminate_epoch()`` ends the epoch (``engine.end_epoch()``).
Called from outside ignite's events (a runmodel hook, another engine's handler), they
take effect at the mirror's next event, dropping the batch that would start next.
In a train run, a handler that leaves the model's module in eval mode (an evaluator's
``run()``, which ignite's ``create_supervised_evaluator`` ends in eval mode) has it put
back in train mode before the next step, as ignite's trainer step does.
Unlike ignite, an error is always raised again after the EXCEPTION_RAISED handlers.
Its ``logger`` is ignite's ``Engine``'s, with ignite's lines (the run's start or resume,
each epoch's and the run's end, an error; at DEBUG each event fired).
``engine.ignite`` must be read before a run starts (its first read builds the hooks).
Guide: ``docs/ignite.md``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch
from ignite.engine import Engine as IgniteEngine
from ignite.engine import Events

__all__ = ["IgniteView", "MirrorEngine", "default_output"]

_PHASES = ("setup", "epoch_start", "step_start", "runstep", "epoch_end", "exception", "teardown")

# read once: reading an ignite event off ``Events`` and hashing it each cost ~0.2 µs,
# too much for the per-step path
_GET_BATCH_STARTED, _GET_BATCH_COMPLETED = Events.GET_BATCH_STARTED, Events.GET_BATCH_COMPLETED
_ITERATION_STARTED, _ITERATION_COMPLETED = Events.ITERATION_STARTED, Events.ITERATION_COMPLETED


def default_output(engine: Any) -> Any:
    """What the ignite engine's ``state.output`` holds after a step.

    For a model with ``target(batch)`` (a ``TorchModel``) outside infer steps: ignite's
    dict form ``{"y_pred", "y", "loss", "criterion_kwargs"}``, detached, which every
    ignite ``Metric`` reads unchanged and from which a logger takes
    ``output_transform=lambda o: o["loss"]``; with an ``Interface`` whose own
    ``train_step`` returns ``{"loss", "output"}``, ``y_pred`` is that ``"output"``.
    Otherwise runmodel's ``state.output`` as it is. Set ``engine.ignite.output_transform``
    to change it (ignite's own trainer puts ``loss.item()`` there:
    ``lambda e: e.state.loss.item()``, a sync per step on a GPU).
    """
    s = engine.state
    target = getattr(engine.model, "target", None)
    output = s.output
    if target is None or s.kind == "infer" or output is None:
        return output
    if s.kind == "train" and _own_train_step(engine.model):
        # the step was interface.train_step(model, batch): {"loss": ..., "output": ...}
        if not isinstance(output, dict) or output.get("output") is None:
            return output  # no model output in it to hand ignite as y_pred
        output = output["output"]
    try:
        y = target(s.batch)
    except Exception:  # a batch without a target: runmodel's output as it is
        return output
    return {"y_pred": _detach(output), "y": y, "loss": _detach(s.loss), "criterion_kwargs": {}}


def _own_train_step(model: Any) -> bool:
    """Whether a train step of ``model`` is its interface's own ``train_step``."""
    interface = getattr(model, "interface", None)
    return interface is not None and not interface.phased


def _detach(value: Any) -> Any:
    return value.detach() if isinstance(value, torch.Tensor) else value


def _not_run_by_ignite(engine: IgniteEngine, batch: Any) -> Any:
    raise RuntimeError("engine.ignite mirrors runmodel's runs; it has no process function")


class _Handled:
    """Which per-step events have handlers, as plain attributes the step path reads;
    with ``every_event`` (the engine's logger shows DEBUG lines), every event counts as
    handled, so that each fire logs ignite's "Firing handlers" line."""

    __slots__ = ("every_event", "get_batch", "iteration_completed", "iteration_started")

    def __init__(self) -> None:
        self.every_event = False
        self.get_batch = self.iteration_started = self.iteration_completed = False

    def update(self, handlers: dict[Any, list[Any]]) -> None:
        every = self.every_event
        self.get_batch = every or bool(
            handlers.get(_GET_BATCH_STARTED) or handlers.get(_GET_BATCH_COMPLETED)
        )
        self.iteration_started = every or bool(handlers.get(_ITERATION_STARTED))
        self.iteration_completed = every or bool(handlers.get(_ITERATION_COMPLETED))


class MirrorEngine(IgniteEngine):
    """An ignite ``Engine`` whose events come from a runmodel engine's runs;
    ``output_transform(runmodel_engine)`` makes its ``state.output`` at each step.
    Adding or removing a handler notes which step events have handlers, so that the
    step path skips the others' fire without looking them up.

    Its ``logger`` is ignite's ``Engine``'s (``ignite.engine.engine.Engine``), and it
    logs what ignite's ``Engine.run`` logs, at the same points of the run: the run's
    start (or resume), each epoch's and the run's end with their time, an exception; at
    DEBUG, each event fired."""

    def __init__(self) -> None:
        super().__init__(_not_run_by_ignite)
        # the logger of the Engine it stands in for: an ignite program's log, as it reads
        self.logger = logging.getLogger(IgniteEngine.__module__ + "." + IgniteEngine.__name__)
        self.output_transform: Callable[[Any], Any] = default_output
        self._handled = _Handled()

    def add_event_handler(
        self, event_name: Any, handler: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        handle = super().add_event_handler(event_name, handler, *args, **kwargs)
        self._handled.update(self._event_handlers)
        return handle

    def remove_event_handler(self, handler: Callable[..., Any], event_name: Any) -> None:
        super().remove_event_handler(handler, event_name)
        self._handled.update(self._event_handlers)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            "engine.ignite mirrors a runmodel engine's runs; start a run with "
            "that engine's run(model, ...), not with ignite's run()"
        )

    def interrupt(self) -> None:
        raise RuntimeError(
            "engine.ignite cannot interrupt and resume a runmodel run; use "
            "terminate(), or runmodel's checkpoints to resume later"
        )


class IgniteView:
    """Hooks ``engine``'s phases and fires ``self.engine``'s (ignite's) events from them."""

    def __init__(self, engine: Any) -> None:
        if engine.model is not None and engine.state.ended is None:  # a run is under way
            raise RuntimeError(
                "engine.ignite was first read during a run: its events start "
                "with a run's setup, so read it (and attach ignite's handlers) "
                "before engine.run()"
            )
        self.engine = MirrorEngine()
        self._cut = False  # the last epoch ended before its data did (budget, stop())
        # the last step's state.output is still to be made (output_transform): made when
        # an event that has handlers fires, so a step nobody reads it at costs nothing
        self._pending = False
        # a train run's module, and whether a handler (an evaluator's run) left it in eval
        # mode: put back in train mode before the next step, as ignite's trainer step does
        self._module: torch.nn.Module | None = None
        self._retrain = False
        self._t_run = self._t_epoch = 0.0
        self._in_epoch = False  # between an epoch's start and its end: an error there is a step's
        for phase in _PHASES:
            engine.on(phase, getattr(self, "_" + phase), name="ignite")

    def has_progress_bar(self) -> bool:
        """Whether an ignite ``ProgressBar`` is attached (runmodel then adds no bar)."""
        from ignite.handlers import ProgressBar

        return any(
            isinstance(getattr(handler, "__self__", None), ProgressBar)
            for handlers in self.engine._event_handlers.values()
            for handler, *_ in handlers
        )

    # -- one hook per phase ------------------------------------------------------------

    def _setup(self, engine: Any) -> None:
        s, ie = engine.state, self.engine
        st = ie.state
        ie.should_terminate = ie.should_terminate_single_epoch = ie.should_interrupt = False
        st.iteration, st.epoch = s.step, s.epoch  # done so far: 0, or where a resume starts
        st.max_iters = s.max_steps
        st.max_epochs = (
            s.max_epochs if s.max_epochs is not None else (1 if s.max_steps is None else None)
        )  # runmodel's loop: one epoch unless steps=
        st.dataloader = _data_of(engine.model, s.kind)
        st.epoch_length = _length(st.dataloader)  # else set at the first epoch's end
        st.batch = st.output = None
        self._pending = self._retrain = False
        module = getattr(engine.model, "module", None) if s.kind == "train" else None
        self._module = module if isinstance(module, torch.nn.Module) else None
        st.metrics = s.metrics  # one dict: ignite's metrics land in runmodel's result too
        st.times = {Events.EPOCH_COMPLETED.name: 0.0, Events.COMPLETED.name: 0.0}
        self._cut, self._t_run, self._in_epoch = False, time.time(), False
        ie._handled.every_event = ie.logger.isEnabledFor(logging.DEBUG)
        ie._handled.update(ie._event_handlers)
        self._log_start(engine)
        self._fire(engine, Events.STARTED)
        self._no_epoch_to_end("STARTED")

    def _log_start(self, engine: Any) -> None:
        """ignite's line as its run starts, or resumes from a saved state."""
        st, logger = self.engine.state, self.engine.logger
        by_iters = st.max_iters is not None
        if engine.state.step == 0:
            until = f"max_iters={st.max_iters}" if by_iters else f"max_epochs={st.max_epochs}"
            logger.info(f"Engine run starting with {until}.")
        else:
            until = f"{st.max_iters} iterations" if by_iters else f"{st.max_epochs} epochs"
            logger.info(
                f"Engine run resuming from iteration {st.iteration}, epoch {st.epoch} until {until}"
            )

    def _epoch_start(self, engine: Any) -> None:
        if self._terminated(engine):  # terminate() outside ignite's events: no new epoch
            return
        self.engine.state.epoch = engine.state.epoch + 1  # ignite counts epochs from 1
        self._t_epoch, self._in_epoch = time.time(), True
        self._fire(engine, Events.EPOCH_STARTED)
        self._no_epoch_to_end("EPOCH_STARTED")

    def _step_start(self, engine: Any) -> None:
        s, ie = engine.state, self.engine
        self._pending = False
        if ie.should_terminate or ie.should_terminate_single_epoch:
            # terminate() or terminate_epoch() called outside ignite's events (a runmodel
            # hook, another engine's handler): this batch is dropped, as ignite's next
            # check would, before its batch is counted
            self._terminated(engine)
            engine.skip_step()
            self._maybe_end_epoch(engine, counted=False)
            return
        st, handled = ie.state, ie._handled
        if handled.get_batch:  # the model fetched it already: data time ~0
            st.batch = None
            if self._fire_in_step(engine, _GET_BATCH_STARTED, counted=False):
                return
            st.batch, st.output = s.batch, None
            if self._fire_in_step(engine, _GET_BATCH_COMPLETED, counted=False):
                return
        # ignite's own rule, +1 per batch started (step + 1 unless a batch was dropped
        # after ITERATION_STARTED, which ignite would have counted too)
        st.iteration += 1
        st.batch = s.batch
        st.output = None
        if not handled.iteration_started:
            ie.last_event_name = _ITERATION_STARTED
        elif self._fire_in_step(engine, _ITERATION_STARTED, handled=True):
            return
        elif st.batch is not s.batch:  # ignite lets ITERATION_STARTED handlers replace it
            s.batch = st.batch
        if self._retrain:
            self._retrain = False
            self._module.train()  # type: ignore[union-attr]  # set with _retrain

    def _runstep(self, engine: Any) -> None:
        self._pending = True  # output_transform runs only if a handler may read it
        ie = self.engine
        if ie._handled.iteration_completed:
            self._fire(engine, _ITERATION_COMPLETED, True)
            if ie.should_terminate_single_epoch:
                self._maybe_end_epoch(engine)
        else:
            ie.last_event_name = _ITERATION_COMPLETED

    def _epoch_end(self, engine: Any) -> None:
        s, ie = engine.state, self.engine
        st = ie.state
        self._cut, self._in_epoch = not s.epoch_complete, False
        if st.epoch_length is None and s.epoch_complete:
            st.epoch_length = s.epoch_step  # as ignite does for data without len()
        st.times[Events.EPOCH_COMPLETED.name] = time.time() - self._t_epoch
        if s.epoch_complete and not self._terminated(engine):
            if ie.should_terminate_single_epoch != "skip_epoch_completed":
                self._fire(engine, Events.EPOCH_COMPLETED)
                st.times[Events.EPOCH_COMPLETED.name] = time.time() - self._t_epoch
            if not ie.should_terminate:  # as ignite: a terminate() there logs no epoch
                ie.logger.info(
                    f"Epoch[{st.epoch}] Complete. "
                    f"Time taken: {_hours_mins_secs(st.times[Events.EPOCH_COMPLETED.name])}"
                )
        ie.should_terminate_single_epoch = False

    def _exception(self, engine: Any) -> None:
        # runmodel raises the error again in any case; ignite swallows it when handled
        ie, error = self.engine, engine.state.error
        handled = bool(ie._event_handlers.get(Events.EXCEPTION_RAISED))
        # ignite's two lines: one for an error inside an epoch's steps, then, when no
        # handler takes it, one as the run ends
        if self._in_epoch:
            ie.logger.error(f"Current run is terminating due to exception: {error}")
        if not (handled and self._in_epoch):
            ie.logger.error(f"Engine run is terminating due to exception: {error}")
        self._fire_now(engine, Events.EXCEPTION_RAISED, error)

    def _teardown(self, engine: Any) -> None:
        if engine.state.error is not None:
            return  # as in ignite: no COMPLETED after an exception
        ie = self.engine
        if not ie.should_terminate and (self._cut or engine.state.ended == "stopped"):
            ie.should_terminate = True  # stop() or the budget cut the run: as max_iters does
        ie.state.times[Events.COMPLETED.name] = time.time() - self._t_run
        if self._pending:  # as after ignite's run(): the last step's output
            self._make_output(engine)
        if ie.should_terminate:
            self._fire_now(engine, Events.TERMINATE)
        if ie.should_terminate != "skip_completed":
            self._fire_now(engine, Events.COMPLETED)
            ie.state.times[Events.COMPLETED.name] = time.time() - self._t_run
        ie.logger.info(
            f"Engine run finished. Time taken: "
            f"{_hours_mins_secs(ie.state.times[Events.COMPLETED.name])}"
        )

    # -- helpers --------------------------------------------------------------------------

    def _fire(self, engine: Any, event: Events, handled: bool | None = None) -> None:
        """Fire ``event`` (``handled``: whether it has handlers, when known already)."""
        ie = self.engine
        if (handled if handled is not None else ie._event_handlers.get(event)) or (
            ie._handled.every_event
        ):
            self._dispatch(engine, event)
        else:
            ie.last_event_name = event  # nothing listens: skip ignite's per-fire logging
        if ie.should_terminate:
            engine.stop("ignite: terminate()")

    def _fire_now(self, engine: Any, event: Events, *args: Any, **kwargs: Any) -> None:
        """Fire ``event`` through ``_fire_event`` whether or not it has handlers."""
        if self.engine._event_handlers.get(event):
            self._dispatch(engine, event, *args, **kwargs)
        else:
            self.engine._fire_event(event, *args, **kwargs)

    def _dispatch(self, engine: Any, event: Events, *args: Any, **kwargs: Any) -> None:
        """Run ``event``'s handlers through ignite's own ``_fire_event`` (its filters,
        ``last_event_name``), with the last step's output made first."""
        if self._pending:
            self._make_output(engine)
        module = self._module
        training = module is not None and module.training
        self.engine._fire_event(event, *args, **kwargs)
        if training and not module.training:  # type: ignore[union-attr]
            self._retrain = True

    def _make_output(self, engine: Any) -> None:
        self._pending = False
        self.engine.state.output = self.engine.output_transform(engine)

    def _terminated(self, engine: Any) -> bool:
        """Whether ``terminate()`` was called; a call from outside ignite's events (a
        runmodel hook, another engine's handler) stops the run at the next event."""
        if self.engine.should_terminate:
            engine.stop("ignite: terminate()")
            return True
        return False

    def _fire_in_step(
        self, engine: Any, event: Events, counted: bool = True, handled: bool | None = None
    ) -> bool:
        """Fire ``event`` before the step runs; True when a handler ended the run or the
        epoch: then the step is dropped, as ignite skips its process function.
        ``counted``: whether ignite has counted this batch in its epoch by then."""
        self._fire(engine, event, handled)
        ie = self.engine
        if not (ie.should_terminate or ie.should_terminate_single_epoch):
            return False
        engine.skip_step()
        self._maybe_end_epoch(engine, counted)
        return True

    def _maybe_end_epoch(self, engine: Any, counted: bool = True) -> None:
        ie = self.engine
        if ie.should_terminate_single_epoch and not ie.should_terminate:
            # iter_counter: the batches ignite has taken in this epoch, as its own kwarg
            self._fire_now(
                engine,
                Events.TERMINATE_SINGLE_EPOCH,
                iter_counter=engine.state.epoch_step + counted,
            )
            engine.end_epoch()  # without runstep.epochs() in the model, this ends the run

    def _no_epoch_to_end(self, event: str) -> None:
        if self.engine.should_terminate_single_epoch:
            self.engine.should_terminate_single_epoch = False
            raise RuntimeError(f"terminate_epoch() may not be called on {event} (as in ignite)")


def _hours_mins_secs(seconds: float | None) -> str:
    """A time as ignite's Engine logs it: ``00:00:01.234``."""
    mins, secs = divmod(seconds or 0.0, 60)
    hours, mins = divmod(mins, 60)
    return f"{round(hours):02d}:{round(mins):02d}:{secs:06.3f}"


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

"""The engine: phases with ordered hooks and overridable actions, run state, the run.

``engine.run(model)`` calls ``model.setup()``, then ``model.run(runstep, steps)``, where
the model keeps its own loop and calls ``runstep(batch)`` once per step; the engine
decides what a step does, fires the phases around it, enforces the step budget and
always tears down. ``runmodel/phases.py`` has the loop as pseudocode.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .backends import Backend, FineTuneSpec
from .checkpoint import load_checkpoint
from .describe import describe_table
from .hooks import Hook, HookHandle, HookOrderError, resolve_order
from .model import _declared
from .modes import (
    DEFAULT_WARMUP,
    FUSED,
    ModeRun,
    build_mode,
    check_timed,
    step_kind,
    timed_steps,
)
from .pack import Pack, flatten_packs
from .phases import MODES, PHASES
from .registry import make_backend
from .state import RunResult, RunStep, State, StopRun
from .validate import describe_fn
from .where import Where

if TYPE_CHECKING:
    from .model import Model

__all__ = ["Engine"]

_NO_BUDGET = sys.maxsize
_ACTION_PHASES = tuple(p for p, spec in PHASES.items() if spec.has_action)
_INNER_PHASES = ("forward", "backward", "optimizer_step")


class _Tables:
    """What dispatch reads: per phase the tuple of hooks to call, per action phase the
    head of its override chain. Rebuilt whenever hooks change, never per call."""

    __slots__ = (*PHASES, *(f"{p}_action" for p in _ACTION_PHASES))


def _link(fn: Callable[[Engine, Callable[[Engine], Any]], Any],
          default: Callable[[Engine], Any]) -> Callable[[Engine], Any]:
    def link(engine: Engine) -> Any:
        return fn(engine, default)
    return link


def _current_rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


class Engine:
    """Owns the phases, their hooks and overrides, the run state and the run."""

    def __init__(self) -> None:
        self.state = State()
        self.model: Model | None = None
        self._hooks: dict[str, list[Hook]] = {p: [] for p in PHASES}
        self._overrides: dict[str, list[Hook]] = {p: [] for p in _ACTION_PHASES}
        self._packs: dict[str, Pack] = {}
        self._seq = itertools.count()
        self._tables = _Tables()
        self._mode = ModeRun("train", {})
        self._where = Where()
        self._running = self._resuming = False
        self._reset_controls()

    # -- registration --------------------------------------------------------------

    def on(self, phase: str, fn: Callable[[Engine], Any] | None = None, *,
           priority: float = 0, before: str | Iterable[str] | None = None,
           after: str | Iterable[str] | None = None, every: int | str | None = None,
           once: bool | int | str | None = None, when: Callable[[Engine], bool] | None = None,
           modes: str | Iterable[str] | None = None, rank: int | Iterable[int] | None = None,
           name: str | None = None) -> Any:
        """Hook ``fn(engine)`` on ``phase``; without ``fn``, a decorator.

        Returns a ``HookHandle`` (the decorator form returns it in place of the
        function; it stays callable). Everything is checked here, not at run time.
        """
        options = dict(priority=priority, before=before, after=after, every=every, once=once,
                       when=when, modes=modes, rank=rank, name=name)
        return self._register(phase, fn, override=False, options=options)

    def override(self, phase: str, fn: Callable[[Engine, Callable[[Engine], Any]], Any] | None
                 = None, **options: Any) -> Any:
        """Wrap or replace ``phase``'s action with ``fn(engine, default)``; calling
        ``default(engine)`` reaches the next override and, last, the built-in action.
        Takes the options of ``on``; overrides are ordered like hooks, first outermost."""
        return self._register(phase, fn, override=True, options=options)

    def attach(self, *packs: Pack) -> HookHandle:
        """Attach packs (and the packs they hold) as one unit; the handle detaches it."""
        flat = flatten_packs(packs, taken=set(self._packs))
        seen = {id(p) for p in self._packs.values()}
        for key, pack in flat:
            if id(pack) in seen:
                raise ValueError(f"pack {key!r} is attached already; make a new instance to "
                                 f"use a pack twice")
            seen.add(id(pack))
        hooks = [h for _, pack in flat for h in pack.hooks()]
        handle = self._add(hooks, packs=tuple(p for _, p in flat))
        self._packs.update(flat)
        return handle

    def _register(self, phase: str, fn: Callable[..., Any] | None, *, override: bool,
                  options: dict[str, Any]) -> Any:
        if fn is None:
            Hook((lambda e, d=None: None), phase, override=override, **options)  # check now
            return lambda f: self._add([Hook(f, phase, override=override, **options)], fn=f)
        return self._add([Hook(fn, phase, override=override, **options)], fn=fn)

    def _lists(self, hook: Hook) -> list[Hook]:
        return (self._overrides if hook.override else self._hooks)[hook.phase]

    def _add(self, hooks: list[Hook], fn: Callable[..., Any] | None = None,
             packs: tuple[Pack, ...] = ()) -> HookHandle:
        for h in hooks:
            h.seq = next(self._seq)
            self._lists(h).append(h)
            if self._running:
                h.prepare(self, self.state.mode, self.state.rank, self._mode.wrap_hook)
        try:
            self._changed({(h.phase, h.override) for h in hooks})
        except HookOrderError:
            for h in hooks:
                self._lists(h).remove(h)
            raise
        return HookHandle(self, hooks, fn, packs)

    def _detach(self, handle: HookHandle) -> None:
        for h in handle.hooks:
            hooks = self._lists(h)
            if h in hooks:
                hooks.remove(h)
        for key in [k for k, p in self._packs.items() if p in handle.packs]:
            del self._packs[key]
        self._changed({(h.phase, h.override) for h in handle.hooks})

    def _is_attached(self, handle: HookHandle) -> bool:
        return any(h in self._lists(h) for h in handle.hooks)

    def _changed(self, phases: set[tuple[str, bool]]) -> None:
        """Re-resolve the order of changed phases; while running, rebuild dispatch."""
        for phase, is_override in phases:
            hooks = (self._overrides if is_override else self._hooks)[phase]
            hooks[:] = resolve_order(hooks)
        if self._running:
            self._build_tables()

    # -- what is registered ----------------------------------------------------------

    def describe(self) -> str:
        """The resolved table: phase, position, hook, priority, filter, pack, source."""
        return describe_table(self._hooks, self._overrides,
                              {id(p): k for k, p in self._packs.items()})

    def state_dict(self) -> dict[str, Any]:
        """The run's counters and every attached pack's state, keyed by pack path."""
        s = self.state
        return {"counters": {"step": s.step, "epoch": s.epoch, "epoch_step": s.epoch_step,
                             "skipped": s.skipped},
                "packs": {key: pack.state_dict() for key, pack in self._packs.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore counters and pack states; the next run continues these counters."""
        for name, value in state.get("counters", {}).items():
            setattr(self.state, name, int(value))
        self._resuming = True
        saved = state.get("packs", {})
        for key, pack_state in saved.items():
            if key in self._packs:
                self._packs[key].load_state_dict(pack_state)
            else:
                warnings.warn(f"saved state of pack {key!r} has no attached pack to go to "
                              f"(attached: {sorted(self._packs) or 'none'})", stacklevel=2)

    # -- run controls -----------------------------------------------------------------

    def stop(self) -> None:
        """End the run once the current step is done; teardown follows."""
        self._stopping = True
        self._guard = -1

    def end_epoch(self) -> None:
        """End the current epoch once the current step is done: the model's remaining
        runstep calls in it do nothing. Without ``runstep.epochs()`` it ends the run."""
        if not self._epoch_open:
            return  # no epoch to end (a setup hook, say)
        if not self._explicit_epochs:
            self.stop()
        else:
            self._epoch_ending = True
            self._guard = -1

    def skip_step(self) -> None:
        """From a ``step_start`` hook: drop this batch. The step's action and ``runstep``
        hooks do not run, ``step`` does not advance, ``state.skipped`` does."""
        if not self._in_step_start:
            raise RuntimeError("skip_step() drops a batch before its step runs, so only a "
                               "step_start hook may call it; use stop() or end_epoch() elsewhere")
        self._skip = True

    def _reset_controls(self) -> None:
        self._stopping = self._epoch_open = self._epoch_ending = self._explicit_epochs = False
        self._skip = self._in_step_start = False
        self._guard = -1  # runstep takes its slow path while step >= _guard
        self._budget = _NO_BUDGET
        self._max_epochs: float = 1

    # -- the run ---------------------------------------------------------------------

    def run(self, model: Model, mode: str = "train", steps: int | None = None,
            epochs: int | None = None, setup_options: dict[str, Any] | None = None, *,
            measure: str = "train", warmup: int = DEFAULT_WARMUP, collect: bool = True,
            directory: str | os.PathLike[str] | None = None,
            backend: Backend | str | None = None,
            resume: str | os.PathLike[str] | None = None) -> RunResult:
        """Run ``model`` in ``mode`` for at most ``steps`` steps and ``epochs`` epochs.

        Without either, the model's loop decides (``runstep.epochs()`` yields one epoch).
        ``steps``/``epochs`` count from the start of training, so a resumed run given the
        same numbers finishes where one straight run would have. ``measure`` is the step
        (``"train"`` or ``"infer"``) that benchmark and profile modes time, after
        ``warmup`` steps (they default to ``warmup + 50`` steps); ``collect=False`` leaves
        infer mode's outputs to hooks; ``directory`` is where files go (profile traces).
        ``backend`` (a ``Backend`` or a registered name; default plain) prepares model and
        optimizer after ``model.setup()``; ``resume`` is a checkpoint file or a directory
        of them to continue from.
        """
        _check_count(steps, "steps")
        _check_count(epochs, "epochs")
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; valid modes: {', '.join(MODES)}")
        if mode in ("benchmark", "profile"):
            steps = timed_steps(steps, warmup)
            check_timed(mode, measure, warmup, steps)
        if setup_options is not None or getattr(model, "setup_defaults", None):
            setup_options = _declared(model, "setup", setup_options,
                                      getattr(model, "setup_defaults", {}))
        if self._running:
            raise RuntimeError("this engine is running already; an engine runs one model at "
                               "a time (make another Engine for a nested run)")
        if not isinstance(backend, Backend):
            backend = make_backend(backend or "plain")
        if resume is not None and not Path(resume).exists():
            raise FileNotFoundError(f"resume={str(resume)!r}: no such checkpoint file or "
                                    f"directory")
        s = self.state
        if not self._resuming:
            s.step = s.epoch = s.epoch_step = s.skipped = 0
        self._resuming = False  # load_state_dict() before run() carries counters over
        s.mode, s.max_steps, s.max_epochs, s.rank = mode, steps, epochs, _current_rank()
        s.batch = s.output = s.loss = s.error = None
        s.metrics = {}
        self._reset_controls()
        self._budget = _NO_BUDGET if steps is None else steps
        self._max_epochs = epochs if epochs is not None else (1 if steps is None else float("inf"))
        self.model, self._mode, self._ended = model, ModeRun(mode, {}), "completed"
        self._prepare_hooks()
        self._where = Where()
        places = {f"model.{m}": getattr(model, m, None) for m in ("setup", "run", "teardown")}
        places.update({"backend.initialize": backend.initialize,
                       "loading the checkpoint": load_checkpoint, "building the mode": build_mode})
        for name, fn in places.items():
            self._where.add(name, fn)
        self._build_tables()
        self._running = True
        started = time.perf_counter()
        backend_handle = None
        try:
            model.setup(setup_options)
            data = _data(model, step_kind(mode, measure))
            backend.initialize(model, FineTuneSpec.of(data, steps, epochs))
            if (pack := backend.pack()) is not None:
                backend_handle = self.attach(pack)
            if resume is not None:
                load_checkpoint(self, resume)
                self._resuming = False  # these counters are this run's, not the next one's
            self._mode = build_mode(  # after setup, which makes what the mode needs
                mode, model, self._tables, measure=measure, warmup=warmup, collect=collect,
                directory=None if directory is None else Path(directory), steps=steps)
            self._prepare_hooks()
            self._build_tables()
            self._fire("setup")
            with self._mode.context():
                with contextlib.suppress(StopRun):  # how the budget and stop() end a run
                    model.run(self._make_runstep(), steps)
                if self._stopping:
                    self._ended = "stopped"
                if self._epoch_open:
                    self._end_epoch(completed=self._ended == "completed")
            extras = self._mode.finish(self)
        except BaseException as error:
            self._failed(error)
            raise
        finally:
            try:
                self._teardown(model)
            finally:
                if backend_handle is not None:  # even when a teardown hook raised
                    backend_handle.detach()
        return RunResult(mode, self._ended, s.step, s.epoch, s.skipped,
                         time.perf_counter() - started, dict(s.metrics), **extras)

    def _prepare_hooks(self) -> None:
        s = self.state
        for hook in itertools.chain(*self._hooks.values(), *self._overrides.values()):
            hook.prepare(self, s.mode, s.rank, self._mode.wrap_hook)

    def _make_runstep(self) -> RunStep:
        engine, state, tables, slow_path = self, self.state, self._tables, self._before_step

        def runstep(batch: Any = None) -> Any:
            # One comparison on the fast path; _guard drops to -1 whenever the slow path
            # has something to do (budget, stop, epoch bookkeeping).
            if state.step >= engine._guard and not slow_path():
                return None
            state.batch = batch
            hooks = tables.step_start
            if hooks:
                engine._in_step_start = True
                for hook in hooks:
                    hook(engine)
                engine._in_step_start = False
                if engine._skip:
                    engine._skip = False
                    state.skipped += 1
                    return None
            tables.runstep_action(engine)
            for hook in tables.runstep:
                hook(engine)
            state.step += 1
            state.epoch_step += 1
            return state.output

        step: Any = runstep
        step.epochs, step.engine, step.mode, step.kind, step.steps = (
            self._epochs, self, state.mode, self._mode.kind, state.max_steps)
        self._where.add("runstep (engine)", runstep)
        return step

    def _before_step(self) -> bool:
        """The slow path of runstep: end the run, drop the call, or open an epoch."""
        if self._stopping or self.state.step >= self._budget:
            self._ended = "stopped" if self._stopping else "budget"
            raise StopRun
        if self._epoch_ending:
            return False
        if not self._epoch_open and not self._explicit_epochs:
            if self.state.epoch >= self._max_epochs:  # epochs=0, or a resume past the end
                raise StopRun
            self._begin_epoch()  # a loop without runstep.epochs() is one implicit epoch
        elif self._epoch_open:
            self._guard = self._budget
        return True

    def _epochs(self) -> Iterator[int]:
        if self._epoch_open:
            raise RuntimeError("runstep.epochs() was entered after steps already ran outside "
                               "it; start the model's loop with `for epoch in runstep.epochs()`")
        self._explicit_epochs = True
        s = self.state
        while s.epoch < self._max_epochs and not self._stopping and s.step < self._budget:
            steps_before = s.step
            self._begin_epoch()
            if self._stopping:  # stop() from an epoch_start hook
                self._end_epoch(completed=False)
                break
            yield s.epoch
            ended_early = self._epoch_ending
            self._end_epoch(completed=True)
            if s.step == steps_before and self._max_epochs == float("inf") and not ended_early:
                raise RuntimeError(f"epoch {s.epoch - 1} ran no steps, and with epochs=None the "
                                   f"run would never end; give the model data, or epochs=")
        if self._stopping:
            self._ended = "stopped"
        elif s.step >= self._budget and s.epoch < self._max_epochs:
            self._ended = "budget"

    def _begin_epoch(self) -> None:
        self.state.epoch_step = 0
        self._epoch_open, self._epoch_ending, self._guard = True, False, self._budget
        self._fire("epoch_start")

    def _end_epoch(self, completed: bool) -> None:
        self.state.epoch_complete = completed
        self._fire("epoch_end")
        if completed:
            self.state.epoch += 1
        self._epoch_open = self._epoch_ending = False
        self._guard = -1

    def _fire(self, phase: str) -> None:
        for hook in getattr(self._tables, phase):
            hook(self)

    def _build_tables(self) -> None:
        t, where, mode = self._tables, self._where, self._mode
        for phase, hooks in self._hooks.items():
            compiled = tuple(h.compiled for h in hooks if h.compiled is not None)
            # the mode's built-ins (metrics, timers) bracket the user's hooks
            setattr(t, phase, (*mode.before.get(phase, ()), *compiled, *mode.after.get(phase, ())))
            for h in hooks:
                where.add_hook(h, "hook")
        actions = mode.actions
        inner_bare = not any(self._hooks[p] or self._overrides[p] for p in _INNER_PHASES)
        for phase, overrides in self._overrides.items():
            chain = actions.get(phase) or _no_action(phase, self.state.mode)
            where.add(f"phase {phase!r} (built-in action)", chain)
            if phase == "runstep" and FUSED in actions:
                where.add("phase 'runstep' (built-in action, running forward, backward and "
                          "optimizer_step in one call while they have no hooks)", actions[FUSED])
                if inner_bare:
                    chain = actions[FUSED]
            for h in reversed(overrides):
                where.add_hook(h, "override")
                if h.compiled is not None:
                    chain = _link(h.compiled, chain)
            setattr(t, f"{phase}_action", chain)

    # -- errors and teardown -------------------------------------------------------------

    def _failed(self, error: BaseException) -> None:
        s = self.state
        s.error = error
        self._ended = "interrupted" if isinstance(error, KeyboardInterrupt) else "failed"
        error.add_note(f"runmodel: raised in {self._where.locate(error)} ({s.mode} mode, epoch "
                       f"{s.epoch}, step {s.step})")
        self._fire_guarded("exception", error)

    def _fire_guarded(self, phase: str, error: BaseException | None) -> BaseException | None:
        """Fire every hook of ``phase`` even if some raise; report the first failure."""
        first = None
        for hook in getattr(self._tables, phase):
            try:
                hook(self)
            except Exception as failure:
                note = f"runmodel: {phase} hook {describe_fn(hook)} also raised {failure!r}"
                if error is not None:
                    error.add_note(note)
                elif first is None:
                    first = failure
                    failure.add_note(f"runmodel: raised in phase {phase!r}")
        return first

    def _teardown(self, model: Model) -> None:
        error, failure = self.state.error, None
        try:
            failure = self._fire_guarded("teardown", error)
        finally:
            try:
                model.teardown()
            except Exception as teardown_error:
                if error is not None:
                    error.add_note(f"runmodel: model.teardown() also raised {teardown_error!r}")
                failure = failure or teardown_error
            self._running = False
        if failure is not None and error is None:
            raise failure


def _data(model: Model, kind: str) -> Any:
    data_for = getattr(model, "data_for", None)
    try:
        return data_for(kind) if data_for is not None else None
    except ValueError:
        return None


def _no_action(phase: str, mode: str) -> Callable[[Engine], Any]:
    def missing(engine: Engine) -> Any:
        raise RuntimeError(f"phase {phase!r} has no action in {mode} mode")
    return missing


def _check_count(value: int | None, name: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"{name}= must be a whole number >= 0 or None, got {value!r}")

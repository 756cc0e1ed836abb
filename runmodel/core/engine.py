"""The engine: phases with ordered hooks and overridable actions, run state, the run.

``engine.run(model, mode)`` calls ``model.setup()``, then ``model.run(runstep, steps)``,
where the model keeps its own loop and calls ``runstep(batch)`` once per step; the engine
decides what a step does (the mode's ``StepPlan``), fires the phases around it, enforces
the step budget (``loop.py``) and always tears down. ``phases.py`` has the run as
pseudocode. This core engine takes a mode and a backend as objects;
``runmodel.Engine`` adds them by name, and the ignite view.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .controls import RunControls
from .describe import describe_table
from .hooks import Hook, HookHandle
from .loop import Loop
from .options import HookOptions, check_phase
from .pack import Pack, steps_per_iteration
from .plan import BackendLike, CheckpointStorage, ModeLike, StepPlan, Wrapper
from .setup import check, set_up_and_plan
from .snapshot import Snapshots
from .state import Rewind, RunResult, State, StopRun, run_lengths
from .table import Dispatch, HookTable
from .where import Where

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from .options import HookArgs

__all__ = ["BareEngine"]


class BareEngine(RunControls, Snapshots):
    """Owns the phases, their hooks and overrides, the run state and the run; a mode and a
    backend are given as objects (``runmodel.Engine`` takes them by name too)."""

    def __init__(self, storage: CheckpointStorage | None = None) -> None:
        self.state = State()
        #: how this run's checkpoints are written and read: its backend's (sharded under
        #: fsdp), else the engine's own (``storage=``; runmodel.Engine's: plain files)
        self.storage = self._own_storage = storage
        self.model: Any = None
        self.table = HookTable()
        self._loop: Loop | None = None
        self._for_run: list[HookHandle] = []  # attached for one run (a backend's pack)
        super().__init__()  # what the run resumed from

    # -- registration ------------------------------------------------------------------

    def on(
        self, phase: str, fn: Callable[[Any], Any] | None = None, **options: Unpack[HookArgs]
    ) -> Any:
        """Hook ``fn(engine)`` on ``phase``; without ``fn``, a decorator. ``options`` are
        ``HookOptions`` (``priority``, ``before``, ``after``, ``every``, ``from_zero``,
        ``once``, ``when``, ``modes``, ``rank``, ``name``, ``reads``/``writes``), checked
        here, not at run time.
        Returns a ``HookHandle`` (the decorator form: in place of the function, callable)."""
        return self._register(phase, fn, False, HookOptions.of(**options))

    def override(
        self,
        phase: str,
        fn: Callable[[Any, Callable[[Any], Any]], Any] | None = None,
        **options: Unpack[HookArgs],
    ) -> Any:
        """Wrap or replace ``phase``'s action with ``fn(engine, default)``; calling
        ``default(engine)`` reaches the next override and, last, the built-in action.
        Takes the options of ``on``; overrides are ordered like hooks, first outermost."""
        return self._register(phase, fn, True, HookOptions.of(**options))

    def _register(
        self, phase: str, fn: Callable[..., Any] | None, override: bool, options: HookOptions
    ) -> Any:
        check_phase(phase, override=override)
        if fn is None:
            return lambda f: self.table.add([Hook(f, phase, options, override=override)], fn=f)
        return self.table.add([Hook(fn, phase, options, override=override)], fn=fn)

    def attach(self, *packs: Pack) -> HookHandle:
        """Attach packs (and the packs they hold) as one unit; the handle detaches it."""
        return self.table.attach(packs)

    def describe(self) -> str:
        """The resolved table: phase, position, hook, priority, filter, pack, source."""
        return describe_table(
            self.table.hooks, self.table.overrides, {id(p): k for k, p in self.table.packs.items()}
        )

    # -- dispatch ------------------------------------------------------

    @property
    def dispatch(self) -> Dispatch:
        """``fire`` made ahead: ``dispatch.<phase>(engine)`` runs the phase's action chain
        and hooks (None: nothing to do); rebuilt whenever hooks change."""
        return self.table.dispatch

    def instrument(self, wrapper: Wrapper) -> Callable[[], None]:
        """Put ``wrapper(phase, hook, fn) -> fn`` around every hook (``hook`` given) and
        every phase as a whole (``hook`` is None): what the ``Timer`` pack times with.
        Returns a function that removes it."""
        return self.table.instrument(wrapper)

    def fire(self, phase: str) -> None:
        """Run ``phase`` now: its action through its overrides, then its hooks."""
        try:
            fire = getattr(self.table.dispatch, phase)
        except AttributeError:
            check_phase(phase, override=False)
            raise
        if fire is not None:
            fire(self)

    # -- the run -------------------------------------------------------------------------

    def run(
        self,
        model: Any,
        mode: ModeLike,
        *,
        steps: int | None = None,
        epochs: int | None = None,
        setup_options: dict[str, Any] | None = None,
        backend: BackendLike | None = None,
        resume: str | os.PathLike[str] | None = None,
        iterations: int | None = None,
    ) -> RunResult:
        """Run ``model`` in ``mode`` for at most ``steps`` steps and ``epochs`` epochs.

        Without either, the model's loop decides (``runstep.epochs()`` yields one epoch).
        ``iterations`` is the step budget in optimizer steps instead of ``steps`` (``k``
        steps each under ``GradAccumulation(k)``; one of the two).
        ``steps``/``epochs`` count from the start of training, so a resumed run given the
        same numbers ends where one straight run would. ``backend`` prepares model and
        optimizer after ``model.setup()``; ``resume`` is a checkpoint file or a folder of
        them to continue from.
        """
        steps, epochs, iterations = run_lengths(steps, epochs, iterations)
        if self._loop is not None:
            raise RuntimeError(
                "this engine is running already; an engine runs one model at "
                "a time (make another Engine for a nested run)"
            )
        if resume is not None and not Path(resume).exists():
            raise FileNotFoundError(f"resume={str(resume)!r}: no such checkpoint file or directory")
        loop = self._start(model, mode, steps, epochs, backend, iterations)
        started = time.perf_counter()
        try:
            plan, saved = self._prepare(model, mode, setup_options, backend, resume)
            check(self, loop, plan, saved)
            self.fire("setup")
            if saved is not None:  # after the setup hooks, which may regroup the optimizer
                self._restore_model(saved)
            with plan.context():
                self._run_model(model, mode.kind, loop, plan)
                loop.finish()  # raises Interrupted where engine.interrupt() ended the run
            extras = plan.finish(self)
        except BaseException as error:
            loop.failed(error, self._run_packs() if loop.refusing else None)
            raise
        finally:
            self.announce_resume = False
            self._end(loop, model)
        return self.state.result(loop.ended, loop.reason, time.perf_counter() - started, extras)

    def _run_model(self, model: Any, kind: str, loop: Loop, plan: StepPlan) -> None:
        """``model.run`` until the budget, ``stop()`` or the model's loop ends it, started
        again from the checkpoint after each ``rewind``."""
        while True:
            loop.position.data_begins(first_epoch_begun=False)
            try:
                with contextlib.suppress(StopRun):  # how the budget and stop() end a run
                    model.run(loop.runstep(kind), self.state.max_steps)
                return
            except Rewind as rewind:
                self._rewind_to(rewind.checkpoint, loop, plan)

    def _start(
        self,
        model: Any,
        mode: ModeLike,
        steps: int | None,
        epochs: int | None,
        backend: BackendLike | None,
        iterations: int | None = None,
    ) -> Loop:
        """Fresh run state (counters carried over from ``load_state_dict``/``restore``);
        ``iterations`` (instead of ``steps``): the step budget in optimizer steps."""
        # GradAccumulation's k (train runs only): what state.iteration divides by
        accumulation = steps_per_iteration(self.table.packs.values()) if mode.kind == "train" else 1
        steps = mode.budget(steps if iterations is None else iterations * accumulation)
        self.state.start(mode.name, mode.kind, steps, epochs, keep_counters=self._run_begins())
        self.state.accumulation, self.state.max_iterations = accumulation, iterations
        self.model, self._loop = model, Loop(self, steps, epochs)
        self.table.where = Where.of_run(model, mode, backend, self._restore_model)
        self.table.start(self.state, StepPlan({}))  # exception and teardown can fire
        return self._loop

    def _end(self, loop: Loop, model: Any) -> None:
        """Tear down, whatever happened; then the engine is free for another run."""
        try:
            loop.teardown(model, self._run_packs() if loop.refusing else None)
        finally:  # even when a teardown hook raised
            while self._for_run:
                self._for_run.pop().detach()
            loop.position.close()
            self._loop, self.storage = None, self._own_storage
            self.table.stop()

    def _prepare(self, model: Any, *args: Any) -> tuple[StepPlan, dict[str, Any] | None]:
        """Before the first step: ``setup.set_up_and_plan`` (what a subclass may add to);
        ``args``: the mode, setup options, backend and checkpoint, as it takes them."""
        return set_up_and_plan(self, model, *args)

    def _run_packs(self) -> set[int]:
        """The ids of the packs attached for this run alone (a backend's)."""
        return {id(p) for handle in self._for_run for p in handle.packs}

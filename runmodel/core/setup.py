"""What a run does before its first step, in order (``engine.run`` calls these):

    set_up_and_plan:
             model.setup(options); the backend prepares the model (and may give the run
             its pack and its checkpoint storage); the checkpoint to resume from is read
             through that storage (counters and packs' state now: weights, optimizer and
             random generators once the setup hooks ran); the run's record; the mode's
             plan
    check:   the checkpoint fits the model and the length asked of the run; every
             attached pack's ``check_setup``; the metrics read against those declared

Anything these raise about what they were given (a checkpoint that does not fit or
cannot be read, a pack's refusal, a metric no one writes) is a refusal: bad input found
before the first step, raised as it was written, with no ``exception`` or ``teardown``
hook but those of the packs attached for the run (a backend's cleanup).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from .continuing import check_length, check_world, run_record
from .metric_names import STEP_WRITES, check_metric_names
from .plan import BackendLike, ModeLike, RunHorizon, StepPlan
from .state import current_rank

if TYPE_CHECKING:
    from .engine import BareEngine
    from .loop import Loop

__all__ = ["check", "set_up_and_plan"]


def set_up_and_plan(
    engine: BareEngine,
    model: Any,
    mode: ModeLike,
    setup_options: dict[str, Any] | None,
    backend: BackendLike | None,
    resume: str | os.PathLike[str] | None,
) -> tuple[StepPlan, dict[str, Any] | None]:
    """Set the model up, let the backend prepare it, read the checkpoint to resume from,
    build the mode's plan; returns the plan and the checkpoint's snapshot (or None)."""
    model.setup(setup_options)
    if backend is not None:
        backend.initialize(model, RunHorizon.of_model(model, mode.kind, engine.state))
        if (pack := backend.pack()) is not None:
            engine._for_run.append(engine.attach(pack))
    given = backend.storage() if backend is not None else None
    engine.storage = given if given is not None else engine._own_storage
    saved = _read_checkpoint(engine, model, resume) if resume is not None else None
    engine.run_record = run_record(engine._loaded_run)
    plan = mode.plan(engine, model)  # after setup, which makes what the mode needs
    if engine._loop is not None:
        engine._loop.position.tracker = plan.data
    engine.table.start(engine.state, plan)  # filters start counting here
    return plan, saved


def _read_checkpoint(
    engine: BareEngine, model: Any, resume: str | os.PathLike[str]
) -> dict[str, Any]:
    """The snapshot to resume from; its counters and packs' state loaded now. A
    checkpoint that cannot be read is a refusal: nothing of the run has begun."""
    if engine.storage is None:
        raise ValueError(
            "resume= reads the checkpoint through the engine's checkpoint "
            "storage, and this engine has none: use runmodel.Engine, or give "
            "runmodel.core.BareEngine(storage=...)"
        )
    loop = engine._loop
    if loop is not None:
        loop.refusing = True
    engine.resumed_from, saved = engine.storage.load(resume, model)
    if loop is not None:
        loop.refusing = False
    if engine.announce_resume and current_rank() == 0:  # once, not once per process
        print(f"runmodel: resuming from {engine.resumed_from}", file=sys.stderr)
    engine.load_state_dict(saved["engine"])
    engine._resuming = False  # these counters are this run's, not the next one's
    return saved


def check(engine: BareEngine, loop: Loop, plan: StepPlan, saved: dict[str, Any] | None) -> None:
    """The run's setup-time checks, before any hook runs: a resumed run's checkpoint fits
    the model and the length asked for, then every attached pack's ``check_setup``, in
    attach order, then the metric names read against those declared
    (``metric_names.py``)."""
    loop.refusing = True
    model, state = engine.model, engine.state
    check_state = getattr(model, "check_state_dict", None)
    if saved is not None and isinstance(saved.get("model"), dict) and callable(check_state):
        check_state(saved["model"])  # before the setup hooks, not when restoring
    if engine._loaded_run is not None and state.kind == "train":
        check_world(state, engine._loaded_run, engine.resumed_from)
        engine.extension = check_length(
            state, loop.budget, loop.max_epochs, engine._loaded_run, engine.resumed_from
        )
    for pack in list(engine.table.packs.values()):
        pack.check_setup(engine)
    check_metric_names(engine.table, state.mode, state.rank, (*STEP_WRITES, *plan.writes))
    loop.refusing = False

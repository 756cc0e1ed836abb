"""The core: phases, hook options, filters, hooks and their table, packs, run state and
the engine's loop. It imports nothing else of runmodel (``tests/test_layers.py``).

The names below are imported on first use (``exports.py``), so that ``import runmodel``
stays fast."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .exports import lazy_exports

__all__ = [
    "ACTION_PHASES",
    "MODES",
    "PHASES",
    "BackendLike",
    "BareEngine",
    "CheckpointStorage",
    "Dispatch",
    "Duration",
    "Hook",
    "HookArgs",
    "HookHandle",
    "HookOptions",
    "HookOrderError",
    "Interrupted",
    "ModeLike",
    "Pack",
    "Phase",
    "Preempted",
    "Rewind",
    "RunHorizon",
    "RunResult",
    "RunStep",
    "State",
    "StepPlan",
    "StopRun",
    "hook",
    "override",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "BareEngine": ".engine",
        **dict.fromkeys(("Hook", "HookHandle", "HookOrderError"), ".hooks"),
        **dict.fromkeys(("Duration", "HookArgs", "HookOptions"), ".options"),
        **dict.fromkeys(("Pack", "hook", "override"), ".pack"),
        **dict.fromkeys(("ACTION_PHASES", "MODES", "PHASES", "Phase"), ".phases"),
        **dict.fromkeys(
            ("BackendLike", "CheckpointStorage", "ModeLike", "RunHorizon", "StepPlan"), ".plan"
        ),
        **dict.fromkeys(
            ("Interrupted", "Preempted", "Rewind", "RunResult", "RunStep", "State", "StopRun"),
            ".state",
        ),
        "Dispatch": ".table",
    },
    deprecated={
        "Backend": "runmodel.core.BackendLike",
        "Engine": "runmodel.core.BareEngine",
        "FineTuneSpec": "runmodel.core.RunHorizon",
        "Mode": "runmodel.core.ModeLike",
    },
)

if TYPE_CHECKING:
    from .engine import BareEngine
    from .engine import BareEngine as Engine  # noqa: F401  (deprecated: docs/changelog.md)
    from .hooks import Hook, HookHandle, HookOrderError
    from .options import Duration, HookArgs, HookOptions
    from .pack import Pack, hook, override
    from .phases import ACTION_PHASES, MODES, PHASES, Phase
    from .plan import BackendLike, CheckpointStorage, ModeLike, RunHorizon, StepPlan
    from .plan import BackendLike as Backend  # noqa: F401  (deprecated)
    from .plan import ModeLike as Mode  # noqa: F401  (deprecated)
    from .plan import RunHorizon as FineTuneSpec  # noqa: F401  (deprecated)
    from .state import Interrupted, Preempted, Rewind, RunResult, RunStep, State, StopRun
    from .table import Dispatch

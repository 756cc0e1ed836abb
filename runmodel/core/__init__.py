"""The core: phases, hook options, filters, hooks and their table, packs, run state and
the engine's loop. It imports nothing else of runmodel (``tests/test_layers.py``)."""

from __future__ import annotations

from .engine import Engine
from .hooks import Hook, HookHandle, HookOrderError
from .options import Duration, HookArgs, HookOptions
from .pack import Pack, hook, override
from .phases import ACTION_PHASES, MODES, PHASES, Phase
from .plan import Backend, CheckpointStorage, FineTuneSpec, Mode, StepPlan
from .state import Interrupted, Preempted, RunResult, RunStep, State, StopRun
from .table import Dispatch

__all__ = [
    "ACTION_PHASES",
    "MODES",
    "PHASES",
    "Backend",
    "CheckpointStorage",
    "Dispatch",
    "Duration",
    "Engine",
    "FineTuneSpec",
    "Hook",
    "HookArgs",
    "HookHandle",
    "HookOptions",
    "HookOrderError",
    "Interrupted",
    "Mode",
    "Pack",
    "Phase",
    "Preempted",
    "RunResult",
    "RunStep",
    "State",
    "StepPlan",
    "StopRun",
    "hook",
    "override",
]

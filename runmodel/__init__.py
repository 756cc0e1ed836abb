"""runmodel: a hook-driven engine for running PyTorch models."""

from .engine import Engine, RunResult, RunStep, State, StopRun
from .hooks import Duration, HookHandle, HookOrderError, Pack, hook, override
from .model import Model, TorchModel
from .phases import MODES, PHASES, Phase

__version__ = "0.1.0"

__all__ = [
    "MODES",
    "PHASES",
    "Duration",
    "Engine",
    "HookHandle",
    "HookOrderError",
    "Model",
    "Pack",
    "Phase",
    "RunResult",
    "RunStep",
    "State",
    "StopRun",
    "TorchModel",
    "hook",
    "override",
]

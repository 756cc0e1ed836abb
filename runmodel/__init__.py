"""runmodel: a hook-driven engine for running PyTorch models."""

from .engine import Engine
from .filters import Duration
from .hooks import HookHandle, HookOrderError
from .loader import load_model
from .model import Model, TorchModel
from .modes import evaluate
from .pack import Pack, hook, override
from .phases import MODES, PHASES, Phase
from .state import RunResult, RunStep, State, StopRun

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
    "evaluate",
    "hook",
    "load_model",
    "override",
]

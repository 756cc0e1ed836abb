"""runmodel: a hook-driven engine for running PyTorch models."""

from .backends import Backend, FineTuneSpec
from .config import RunConfig, load_config
from .engine import Engine
from .filters import Duration
from .hooks import HookHandle, HookOrderError
from .interface import Interface, Supervised
from .loader import load_model
from .model import Model, TorchModel
from .modes import evaluate
from .pack import Pack, hook, override
from .phases import MODES, PHASES, Phase
from .registry import (
    Spec,
    make_backend,
    make_interface,
    make_loss,
    make_model,
    make_optimizer,
    make_pack,
    register_backend,
    register_interface,
    register_loss,
    register_model,
    register_optimizer,
    register_pack,
)
from .runs import execute
from .state import RunResult, RunStep, State, StopRun

__version__ = "0.1.0"

__all__ = [
    "MODES",
    "PHASES",
    "Backend",
    "Duration",
    "Engine",
    "FineTuneSpec",
    "HookHandle",
    "HookOrderError",
    "Interface",
    "Model",
    "Pack",
    "Phase",
    "RunConfig",
    "RunResult",
    "RunStep",
    "Spec",
    "State",
    "StopRun",
    "Supervised",
    "TorchModel",
    "evaluate",
    "execute",
    "hook",
    "load_config",
    "load_model",
    "make_backend",
    "make_interface",
    "make_loss",
    "make_model",
    "make_optimizer",
    "make_pack",
    "override",
    "register_backend",
    "register_interface",
    "register_loss",
    "register_model",
    "register_optimizer",
    "register_pack",
]

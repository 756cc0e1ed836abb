"""runmodel: a hook-driven engine for running PyTorch models.

The public names below are imported on first use, so that ``import runmodel`` (and
``runmodel --help``) stays fast; torch is imported when a name that needs it is.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("runmodel")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

#: Each public name and the module that defines it.
_EXPORTS = {
    "Engine": "engine",
    **dict.fromkeys(
        (
            "Duration",
            "Hook",
            "HookHandle",
            "HookOptions",
            "HookOrderError",
            "MODES",
            "PHASES",
            "Pack",
            "Phase",
            "RunResult",
            "RunStep",
            "State",
            "StopRun",
            "Interrupted",
            "Preempted",
            "hook",
            "override",
            "FineTuneSpec",
        ),
        "core",
    ),
    **dict.fromkeys(
        ("Interface", "Model", "Supervised", "TorchModel", "evaluate", "load_model"), "models"
    ),
    **dict.fromkeys(("Benchmark", "Eval", "Infer", "Profile", "Train"), "modes"),
    "Backend": "backends",
    **dict.fromkeys(
        (
            "Spec",
            "make_backend",
            "make_interface",
            "make_loss",
            "make_model",
            "make_optimizer",
            "make_pack",
            "register_backend",
            "register_interface",
            "register_loss",
            "register_model",
            "register_optimizer",
            "register_pack",
        ),
        "config.registry",
    ),
    **dict.fromkeys(("RunConfig", "load_config"), "config.runconfig"),
    "execute": "runs",
    "lr_find": "runs.lr_find",
    "seed": "models.seeding",
    "sweep": "sweeps",  # the function; its module is runmodel.sweeps (no clash)
    "end_distributed": "backends.distributed.env",
}
_SUBPACKAGES = (
    "backends",
    "checkpoint",
    "cli",
    "config",
    "core",
    "integrations",
    "models",
    "modes",
    "packs",
    "runs",
    "sweeps",
)

__all__ = [
    "MODES",
    "PHASES",
    "Backend",
    "Benchmark",
    "Duration",
    "Engine",
    "Eval",
    "FineTuneSpec",
    "Hook",
    "HookHandle",
    "HookOptions",
    "HookOrderError",
    "Infer",
    "Interface",
    "Interrupted",
    "Model",
    "Pack",
    "Phase",
    "Preempted",
    "Profile",
    "RunConfig",
    "RunResult",
    "RunStep",
    "Spec",
    "State",
    "StopRun",
    "Supervised",
    "TorchModel",
    "Train",
    "end_distributed",
    "evaluate",
    "execute",
    "hook",
    "load_config",
    "load_model",
    "lr_find",
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
    "seed",
    "sweep",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"runmodel.{_EXPORTS[name]}"), name)
        globals()[name] = value  # once: the next access is a plain attribute
        return value
    if name in _SUBPACKAGES:
        return importlib.import_module(f"runmodel.{name}")
    raise AttributeError(f"module 'runmodel' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *_SUBPACKAGES})


if TYPE_CHECKING:
    from .backends import Backend
    from .backends.distributed.env import end_distributed
    from .config.registry import (
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
    from .config.runconfig import RunConfig, load_config
    from .core import (
        MODES,
        PHASES,
        Duration,
        FineTuneSpec,
        Hook,
        HookHandle,
        HookOptions,
        HookOrderError,
        Interrupted,
        Pack,
        Phase,
        Preempted,
        RunResult,
        RunStep,
        State,
        StopRun,
        hook,
        override,
    )
    from .engine import Engine
    from .models import Interface, Model, Supervised, TorchModel, evaluate, load_model
    from .models.seeding import seed
    from .modes import Benchmark, Eval, Infer, Profile, Train
    from .runs import execute
    from .runs.lr_find import lr_find
    from .sweeps import sweep

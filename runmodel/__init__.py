"""runmodel: a hook-driven engine for running PyTorch models.

The public names below are imported on first use, so that ``import runmodel`` (and
``runmodel --help``) stays fast; torch is imported when a name that needs it is.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

from .core.exports import lazy_exports

try:
    __version__ = version("runmodel")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "MODES",
    "PHASES",
    "Backend",
    "Benchmark",
    "Engine",
    "Eval",
    "Hook",
    "HookHandle",
    "HookOptions",
    "HookOrderError",
    "Infer",
    "Interface",
    "Interrupted",
    "Model",
    "Pack",
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
    "param_groups",
    "register_backend",
    "register_interface",
    "register_loss",
    "register_model",
    "register_optimizer",
    "register_pack",
    "register_schedule",
    "seed",
    "sweep",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Engine": ".engine",
        **dict.fromkeys(
            (
                "Hook",
                "HookHandle",
                "HookOptions",
                "HookOrderError",
                "MODES",
                "PHASES",
                "Pack",
                "RunResult",
                "RunStep",
                "State",
                "StopRun",
                "Interrupted",
                "Preempted",
                "hook",
                "override",
            ),
            ".core",
        ),
        **dict.fromkeys(
            ("Interface", "Model", "Supervised", "TorchModel", "evaluate", "load_model"),
            ".models",
        ),
        **dict.fromkeys(("Benchmark", "Eval", "Infer", "Profile", "Train"), ".modes"),
        "Backend": ".backends",
        # the registries: register_* names a thing, make_* builds one from its Spec
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
                "register_schedule",
            ),
            ".config.registry",
        ),
        **dict.fromkeys(("RunConfig", "load_config"), ".config.runconfig"),
        "execute": ".runs",
        "lr_find": ".runs.lr_find",
        "seed": ".models.seeding",
        "param_groups": ".models.param_groups",
        "sweep": ".sweeps",  # the function; its module is runmodel.sweeps (no clash)
        "end_distributed": ".backends.distributed.env",
    },
    # the core's parts, not a user's (docs/changelog.md)
    deprecated={
        "Duration": "runmodel.core.Duration",
        "FineTuneSpec": "runmodel.core.RunHorizon",
        "Phase": "runmodel.core.Phase",
    },
    submodules=(
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
    ),
)


if TYPE_CHECKING:
    from . import core
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
        register_schedule,
    )
    from .config.runconfig import RunConfig, load_config
    from .core import (
        MODES,
        PHASES,
        Hook,
        HookHandle,
        HookOptions,
        HookOrderError,
        Interrupted,
        Pack,
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
    from .models.param_groups import param_groups
    from .models.seeding import seed
    from .modes import Benchmark, Eval, Infer, Profile, Train
    from .runs import execute
    from .runs.lr_find import lr_find
    from .sweeps import sweep

    # deprecated names (docs/changelog.md)
    Duration = core.Duration
    FineTuneSpec = core.RunHorizon
    Phase = core.Phase

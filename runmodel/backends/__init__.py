"""Backends prepare a model and its optimizer for a run: ``initialize(model, spec)``.

The names below are imported on first use, so that ``runmodel.backends.distributed.env``
(where this process stands among a distributed run's) is read without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ..core import FineTuneSpec

__all__ = [
    "AMP",
    "BACKEND_TYPES",
    "DDP",
    "FSDP",
    "Backend",
    "Compile",
    "FineTuneSpec",
    "OptimizerFactory",
    "Plain",
]

_EXPORTS = {
    "AMP": "amp",
    "Backend": "base",
    "OptimizerFactory": "base",
    "Plain": "base",
    "Compile": "compile",
    "DDP": "distributed",
    "FSDP": "distributed",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    if name == "BACKEND_TYPES":
        types = _backend_types()
        globals()[name] = types  # once: the next access is a plain attribute
        return types
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _backend_types() -> dict[str, type[Backend]]:
    from .amp import AMP
    from .base import Plain
    from .compile import Compile
    from .distributed import DDP, FSDP

    return {"plain": Plain, "amp": AMP, "compile": Compile, "ddp": DDP, "fsdp": FSDP}


if TYPE_CHECKING:
    from .amp import AMP
    from .base import Backend, OptimizerFactory, Plain
    from .compile import Compile
    from .distributed import DDP, FSDP

    #: The built-in backends by name (``runmodel.register_backend`` adds others).
    BACKEND_TYPES: dict[str, type[Backend]]

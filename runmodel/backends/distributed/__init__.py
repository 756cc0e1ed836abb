"""Backends of a run in several processes (launched by torchrun): ``ddp`` and ``fsdp``.

``env`` answers where this process stands (launched by torchrun, rank, world, store) and
keeps the process group; ``data`` deals the data out, ``agreement`` has the processes end
a run together, ``failures`` records why a process failed for the launcher. The backends
are imported on first use: ``env`` and ``failures`` are read before torch is imported
(the command line asks whether torchrun started it).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["DDP", "FSDP"]

_EXPORTS = {"DDP": "ddp", "FSDP": "fsdp"}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if TYPE_CHECKING:
    from .ddp import DDP
    from .fsdp import FSDP

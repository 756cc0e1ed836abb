"""Backends of a run in several processes (launched by torchrun): ``ddp`` and ``fsdp``.

``env`` answers where this process stands (launched by torchrun, rank, world, store) and
keeps the process group; ``data`` deals the data out, ``agreement`` has the processes end
a run together, ``failures`` records why a process failed for the launcher. The backends
are imported on first use: ``env`` and ``failures`` are read before torch is imported
(the command line asks whether torchrun started it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...core.exports import lazy_exports

__all__ = [
    "DDP",
    "FSDP",
]

__getattr__, __dir__ = lazy_exports(__name__, {"DDP": ".ddp", "FSDP": ".fsdp"})

if TYPE_CHECKING:
    from .ddp import DDP
    from .fsdp import FSDP

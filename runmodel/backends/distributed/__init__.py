"""Backends of a run in several processes (launched by torchrun): ``ddp`` and ``fsdp``."""

from __future__ import annotations

from .ddp import DDP
from .fsdp import FSDP

__all__ = ["DDP", "FSDP"]

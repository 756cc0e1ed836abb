"""The built-in backends by the name a config or ``backend="..."`` gives them."""

from __future__ import annotations

from .amp import AMP
from .base import Backend, Plain
from .compile import Compile
from .distributed import DDP, FSDP

__all__ = ["BACKEND_TYPES"]

#: The built-in backends by name (``runmodel.register_backend`` adds others).
BACKEND_TYPES: dict[str, type[Backend]] = {
    "plain": Plain,
    "amp": AMP,
    "compile": Compile,
    "ddp": DDP,
    "fsdp": FSDP,
}

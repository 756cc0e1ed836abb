"""Built-in packs: reusable bundles of hooks. Each uses only the engine's public API."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .checkpoint import Checkpoint
from .tensorboard import TensorBoard

__all__ = ["Checkpoint", "TensorBoard", "register_builtins"]


def register_builtins(register: Callable[[str, Any], Any]) -> None:
    register("checkpoint", Checkpoint)
    register("tensorboard", TensorBoard)

"""Built-in packs: reusable bundles of hooks, one a file. Each uses only the engine's
public API, and is registered by a snake_case name for configs (``config/builtins.py``)."""

from __future__ import annotations

from .checkpoint import Checkpoint
from .run_log import RunLog
from .tensorboard import TensorBoard

__all__ = ["PACK_TYPES", "Checkpoint", "RunLog", "TensorBoard"]

#: The built-in packs by the name a config gives them.
PACK_TYPES: dict[str, type] = {"checkpoint": Checkpoint, "tensorboard": TensorBoard}

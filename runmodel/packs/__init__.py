"""Built-in packs: reusable bundles of hooks, one a file. Each uses only the engine's
public API, and is registered by a snake_case name for configs (``config/builtins.py``)."""

from __future__ import annotations

from .checkpoint import Checkpoint
from .progress import Progress
from .run_log import RunLog
from .tensorboard import TensorBoard
from .timer import Timer

__all__ = ["PACK_TYPES", "Checkpoint", "Progress", "RunLog", "TensorBoard", "Timer"]

#: The built-in packs by the name a config gives them.
PACK_TYPES: dict[str, type] = {"checkpoint": Checkpoint, "progress": Progress,
                               "tensorboard": TensorBoard, "timer": Timer}

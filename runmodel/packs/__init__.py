"""Built-in packs: reusable bundles of hooks, one a file. Each uses only the engine's
public API, and is registered by a snake_case name for configs (``config/builtins.py``)."""

from __future__ import annotations

from .checkpoint import Checkpoint
from .csv_log import CSV
from .early_stopping import EarlyStopping
from .ema import EMA
from .evaluate import Evaluate
from .grad_accumulation import GradAccumulation
from .grad_clip import GradClip
from .lr_schedule import LRSchedule
from .mlflow import MLflow
from .nan_guard import NaNGuard
from .progress import Progress
from .run_log import RunLog
from .spike_guard import SpikeGuard
from .swa import SWA
from .tensorboard import TensorBoard
from .throughput import Throughput
from .timer import Timer
from .unfreeze import Unfreeze

__all__ = [
    "CSV",
    "EMA",
    "PACK_TYPES",
    "SWA",
    "Checkpoint",
    "EarlyStopping",
    "Evaluate",
    "GradAccumulation",
    "GradClip",
    "LRSchedule",
    "MLflow",
    "NaNGuard",
    "Progress",
    "RunLog",
    "SpikeGuard",
    "TensorBoard",
    "Throughput",
    "Timer",
    "Unfreeze",
]

#: The built-in packs by the name a config gives them.
PACK_TYPES: dict[str, type] = {
    "checkpoint": Checkpoint,
    "csv": CSV,
    "early_stopping": EarlyStopping,
    "ema": EMA,
    "evaluate": Evaluate,
    "grad_accumulation": GradAccumulation,
    "grad_clip": GradClip,
    "lr_schedule": LRSchedule,
    "mlflow": MLflow,
    "nan_guard": NaNGuard,
    "progress": Progress,
    "spike_guard": SpikeGuard,
    "swa": SWA,
    "tensorboard": TensorBoard,
    "throughput": Throughput,
    "timer": Timer,
    "unfreeze": Unfreeze,
}

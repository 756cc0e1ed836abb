"""Sharded checkpoints: one folder per save, every process of an ``fsdp`` run writing
its own shard of the model and optimizer with ``torch.distributed.checkpoint`` (DCP),
beside its own run state.

A folder ``ckpt-EEEEE-SSSSSSSSSS/`` holds:

- ``.metadata``: DCP's index of every shard (which process wrote which part of which
  tensor, where in which file);
- ``__R_0.distcp``: process R's shards of the module's weights and the optimizer's state
  (and the optimizer's hyperparameters);
- ``run-R.pt``: process R's run state, a plain checkpoint file (``format.py``): the
  counters, the last loss and metrics, every pack's state, R's random generators, where
  R's data stands, and the world size.

``saving.py`` writes it (a staging folder made visible by one rename once every process
wrote; ``ShardedWriter`` in the background, from the writer processes of ``process.py``),
``loading.py`` reads it back in as many
processes as wrote it or another number (resharding), ``safe_reader.py`` reads it without
running code, and ``storage.py`` is the ``fsdp`` backend's storage over them.
"""

from __future__ import annotations

from .loading import FullModelState, ShardedModelState, read, read_whole
from .safe_reader import SafeReader, UnsafeCheckpointError, checked_reader
from .saving import Sharded, ShardedWriter, save
from .storage import ShardedStorage

__all__ = [
    "FullModelState",
    "SafeReader",
    "Sharded",
    "ShardedModelState",
    "ShardedStorage",
    "ShardedWriter",
    "UnsafeCheckpointError",
    "checked_reader",
    "read",
    "read_whole",
    "save",
]

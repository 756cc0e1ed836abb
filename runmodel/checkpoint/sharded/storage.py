"""The ``fsdp`` backend's checkpoint storage: one folder of shards per save, written by
every process (``saving.py``), read back in any number of processes (``loading.py``)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..._io import atomic_write
from ..names import BEST_RECORD, folder_name
from .loading import load
from .saving import Sharded, ShardedWriter, save

__all__ = ["ShardedStorage"]


class ShardedStorage:
    """Checkpoints of a sharded run (``Sharded``): every process writes its shards of
    each save, with collectives on the run's checkpoint group; rank 0 makes the folder
    visible, then finishes the save. A folder cannot be linked: the best-K are the
    folders themselves, kept, and listed in ``best.json``."""

    #: a save reads the model's and optimizer's shards itself (DCP's state), so
    #: ``engine.snapshot()`` leaves the model's part out (None)
    writes_model_state = True

    def __init__(self, sharded: Sharded) -> None:
        self.sharded = sharded

    @property
    def leads(self) -> bool:
        return self.sharded.rank == 0

    @property
    def group(self) -> Any:
        return self.sharded.group

    @property
    def ended_together(self) -> bool:
        return self.sharded.ended_together

    def writes_here(self, rank: int) -> bool:
        return True  # every process writes its shards

    def name(self, epoch: int, step: int) -> str:
        return folder_name(epoch, step)

    def best_name(self, metric: str, value: float, epoch: int, step: int) -> str:
        return folder_name(epoch, step)  # the save itself is kept

    def save(
        self, path: Path, snapshot: dict[str, Any], then: Callable[[], None] | None = None
    ) -> None:
        save(path, snapshot, self.sharded)
        if self.leads and then is not None:
            then()

    def writer(self) -> ShardedWriter:
        return ShardedWriter(self.sharded)

    def mark_best(self, path: Path, best: Path | None, ranking: dict[str, Any] | None) -> None:
        if ranking is not None:
            with atomic_write(path.parent / BEST_RECORD, "w") as file:
                file.write(json.dumps(ranking, indent=1))

    def remove(self, path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def load(self, path: str | os.PathLike[str], model: Any) -> tuple[Path, dict[str, Any]]:
        return load(path, model, self.sharded)

    def full_model_state(self, model: Any) -> dict[str, Any] | None:
        """Collective: every process takes part in gathering the module's shards (on the
        run's own process group); rank 0 gets the whole state on the CPU."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        state = get_model_state_dict(
            model.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        return dict(state) if self.sharded.rank == 0 else None

    def __repr__(self) -> str:
        return f"ShardedStorage(rank {self.sharded.rank} of {self.sharded.world})"

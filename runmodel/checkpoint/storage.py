"""Where a run's checkpoints go and how: the storage a run's backend gives it.

The ``Checkpoint`` pack keeps the policy (when to save, which to keep, the best-K,
putting its lists back when a background write fails); a ``Storage`` does the rest: the
name of a checkpoint, which processes write it, writing it (now, or in the background)
and what is done once it is on disk, reading one back to resume, and the model's full
state for a run folder's ``model.pt``. There are two:

* ``FileStorage``: one checkpoint file of plain values, written by process rank 0 (every
  process holds the whole state); the best-K are second names of the files (hard links);
* ``ShardedStorage`` (``sharded.storage``, the ``fsdp`` backend's): one folder of shards
  per save, written by every process; the best-K are the folders themselves, listed in
  ``best.json``.

The engine holds the run's storage as ``engine.storage``: the backend's
(``Backend.storage()``), else the engine's own, a ``FileStorage``. It is the only way the
engine reads a checkpoint (``runmodel.core.CheckpointStorage``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from .._io import atomic_write, hold_lock, raise_if_disk_full, temporary_name
from .format import save
from .names import best_file_name, file_name
from .sharded.loading import load
from .writer import Writer

__all__ = ["AsyncWriter", "FileStorage", "Storage", "link"]


class AsyncWriter(Protocol):
    """Writes one checkpoint at a time in the background (``Checkpoint(async_save=True)``)."""

    #: ``submit`` refuses, before anything is written, a state whose model parameters
    #: hold NaN or inf (``FloatingPointError`` naming them), checked on its copy: the
    #: ``Checkpoint`` pack does not check them first
    checks_finite: bool
    #: the least the last ``submit`` could have stalled (its copy's bytes over the best
    #: copy bandwidth measured), or None where the writer does not measure it
    floor_s: float | None
    #: ``submit`` takes the model's part of the snapshot from the module and optimizer it
    #: is given (``model_parts``), so the ``Checkpoint`` pack's snapshot leaves it out: the
    #: plain writer's (the pack reads it only where the storage does not write the
    #: model's state itself)
    writes_model_state: bool

    @property
    def busy(self) -> bool:
        """Whether a checkpoint is being written now."""
        ...

    def submit(
        self,
        path: str | os.PathLike[str],
        snapshot: dict[str, Any],
        then: Callable[[], None] | None = None,
        module: Any = None,
        model_parts: Any = None,
    ) -> None:
        """Write ``snapshot`` at ``path`` in the background, then call ``then`` (where the
        storage ``leads``); waits for the write before, and raises its error. ``module``:
        the model's network, whose parameters a writer that ``checks_finite`` checks (the
        sharded one checks its run's own). ``model_parts``: for a writer that
        ``writes_model_state``, the module and optimizer whose state is the snapshot's
        model part (``checkpoint.format.torch_state``)."""
        ...

    def wait(self) -> None:
        """Block until the write under way is done; raise the error it met, naming it."""
        ...


class Storage(Protocol):
    """What the ``Checkpoint`` pack asks of a run's checkpoints."""

    #: a save reads the model's state itself, so ``engine.snapshot()`` leaves the model's
    #: part out (None): the sharded storage's, which writes DCP's state
    writes_model_state: bool

    @property
    def leads(self) -> bool:
        """Whether this process cleans the folder and finishes a save (best-K, pruning)."""
        ...

    @property
    def group(self) -> Any:
        """The process group whose processes' verdicts on their parameters a save
        all-reduces (each sees its own shards), or None: each process sees all."""
        ...

    @property
    def ended_together(self) -> bool:
        """False once the processes failed to agree at the end: no collective save."""
        ...

    def writes_here(self, rank: int) -> bool:
        """Whether process ``rank`` writes (takes part in) each save."""
        ...

    def name(self, epoch: int, step: int) -> str:
        """A checkpoint's name: where a run resumed from it starts."""
        ...

    def best_name(self, metric: str, value: float, epoch: int, step: int) -> str:
        """The name under which a checkpoint counts among the best-K."""
        ...

    def save(
        self, path: Path, snapshot: dict[str, Any], then: Callable[[], None] | None = None
    ) -> None:
        """Write ``snapshot`` at ``path`` now, then call ``then`` where this storage leads."""
        ...

    def writer(self) -> AsyncWriter:
        """A background writer of this storage's checkpoints (one per Checkpoint pack)."""
        ...

    def mark_best(self, path: Path, best: Path | None, ranking: dict[str, Any] | None) -> None:
        """Once ``path`` is on disk: record the best-K. ``best`` is its best-K name when it
        is among them; ``ranking`` the whole list (metric, mode, names and values)."""
        ...

    def remove(self, path: Path) -> None:
        """Delete a checkpoint this storage wrote."""
        ...

    def load(self, path: str | os.PathLike[str], model: Any) -> tuple[Path, dict[str, Any]]:
        """The checkpoint at ``path`` (a file, a sharded folder, or a folder of them: its
        newest readable one) as a snapshot to restore into ``model``."""
        ...

    def full_model_state(self, model: Any) -> dict[str, Any] | None:
        """Every process calls it (under fsdp it is a collective): the module's full
        state dict, its tensors whole; None on a process that does not get it (under
        fsdp, all but rank 0, which gets it gathered onto the CPU)."""
        ...


class FileStorage:
    """Checkpoint files of plain values (``format.py``), written atomically by process
    rank 0: every process holds the whole state. The best-K are second names of the
    checkpoint files (hard links, or copies where the file system has none)."""

    leads = True  # rank 0, the one process that writes
    group = None
    ended_together = True
    writes_model_state = False  # the snapshot holds the model's state_dict()

    def writes_here(self, rank: int) -> bool:
        return rank == 0

    def name(self, epoch: int, step: int) -> str:
        return file_name(epoch, step)

    def best_name(self, metric: str, value: float, epoch: int, step: int) -> str:
        return best_file_name(metric, value, epoch, step)

    def save(
        self, path: Path, snapshot: dict[str, Any], then: Callable[[], None] | None = None
    ) -> None:
        save(path, snapshot)
        if then is not None:
            then()

    def writer(self) -> Writer:
        return Writer()

    def mark_best(self, path: Path, best: Path | None, ranking: dict[str, Any] | None) -> None:
        if best is not None:
            link(path, best)

    def remove(self, path: Path) -> None:
        path.unlink(missing_ok=True)

    def load(self, path: str | os.PathLike[str], model: Any) -> tuple[Path, dict[str, Any]]:
        return load(path, model)

    def full_model_state(self, model: Any) -> dict[str, Any] | None:
        # the model's own view, what its checkpoints hold: the module unwrapped from
        # torch.compile or DistributedDataParallel (TorchModel.state_dict)
        state = model.state_dict()
        module = state.get("module") if isinstance(state, dict) else None
        if not isinstance(module, dict):
            raise ValueError(
                f"{type(model).__name__}.state_dict() has no 'module' state: "
                f"there are no module weights to write"
            )
        return module

    def __repr__(self) -> str:
        return "FileStorage()"


def link(source: Path, target: Path) -> None:
    """``target`` as a second name of the file ``source`` (a copy where the file system
    has no hard links), put in place atomically."""
    try:
        with open(source, "rb") as held:  # the temporary name shares its lock: a
            hold_lock(held.fileno())  # cleaner leaves it while it is in use
            temporary = target.with_name(f"{temporary_name(target)}{os.getpid()}")
            temporary.unlink(missing_ok=True)
            try:
                os.link(source, temporary)
                os.replace(temporary, target)
                return
            except OSError:
                temporary.unlink(missing_ok=True)
    except OSError as error:
        raise_if_disk_full(error, target)
        raise
    with atomic_write(target) as file, open(source, "rb") as copied:  # no hard links
        shutil.copyfileobj(copied, file)

"""How checkpoints are named and found: the one module that knows it.

A checkpoint is named after where a run resumed from it starts: ``ckpt-EEEEE-SSSSSSSSSS``
(the epoch, then the step, zero-padded so that names sort as positions do), a file
``.pt`` of plain values, or under ``fsdp`` a folder of shards (``.metadata`` and each
process's ``run-R.pt`` make it whole). The best-K by a metric are
``best-<metric>=<value>-EEEEE-SSSSSSSSSS.pt`` beside them (a sharded run keeps the best
folders themselves and lists them in ``best.json``).

``checkpoints_in(folder)`` lists a folder's checkpoints newest first;
``first_readable(path, read)`` reads the newest one that reads, skipping unreadable ones
(``Unreadable``) with a warning that says what is wrong with each. Standard library only:
the runs table lists run folders without importing torch.
"""

from __future__ import annotations

import fnmatch
import os
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

__all__ = [
    "BEST_PATTERN",
    "BEST_RECORD",
    "METADATA",
    "PATTERN",
    "RUN_STATE",
    "Unreadable",
    "best_file_name",
    "best_in",
    "checkpoints_in",
    "file_name",
    "first_readable",
    "folder_name",
    "is_best",
    "is_checkpoint",
    "is_sharded",
    "newest",
    "position",
    "saved_entries",
    "saved_world",
]

PATTERN = "ckpt-*.pt"
BEST_PATTERN = "best-*.pt"
#: a sharded checkpoint's index (``torch.distributed.checkpoint``'s), and each process's
#: run state beside its shards
METADATA = ".metadata"
RUN_STATE = "run-{rank}.pt"
#: a sharded run's best-K: the folders kept, with their metric values
BEST_RECORD = "best.json"

_POSITION = re.compile(r"-(\d+)-(\d+)(?:\.pt)?$")

T = TypeVar("T")


class Unreadable(ValueError):
    """A checkpoint that cannot be read: cut short, damaged, not runmodel's, or holding
    something whose loading would run code. ``why`` says which, in words; ``foreign`` is
    True for a file that loads but holds no runmodel checkpoint."""

    def __init__(self, path: str | os.PathLike[str], why: str, foreign: bool = False) -> None:
        what = "a runmodel" if foreign else "a readable"
        super().__init__(f"{str(path)!r} is not {what} checkpoint: {why}")
        self.path, self.why, self.foreign = Path(path), why, foreign


def file_name(epoch: int, step: int) -> str:
    """A checkpoint file's name: where a run resumed from it starts."""
    return f"ckpt-{epoch:05d}-{step:010d}.pt"


def folder_name(epoch: int, step: int) -> str:
    """A sharded checkpoint's folder name."""
    return file_name(epoch, step)[:-3]


def best_file_name(metric: str, value: float, epoch: int, step: int) -> str:
    """The name of a best-K checkpoint file (a second name of the checkpoint file)."""
    return f"best-{metric}={value:.6g}-{epoch:05d}-{step:010d}.pt"


def is_best(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a best-K checkpoint (``best_file_name``'s form)."""
    return fnmatch.fnmatch(Path(path).name, BEST_PATTERN)


def position(path: str | os.PathLike[str]) -> tuple[int, int]:
    """``(epoch, step)`` a checkpoint's name records; ``(-1, -1)`` for another name."""
    found = _POSITION.search(Path(path).name)
    return (int(found.group(1)), int(found.group(2))) if found else (-1, -1)


def _order(path: Path) -> tuple[int, int, str]:
    return (*position(path), path.name)


def is_sharded(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a whole sharded checkpoint folder (a staging folder or one
    that lost its index is not)."""
    path = Path(path)
    return (
        path.is_dir()
        and (path / METADATA).is_file()
        and (path / RUN_STATE.format(rank=0)).is_file()
    )


def saved_world(folder: Path) -> int:
    """How many processes wrote the sharded checkpoint ``folder``: one run state each."""
    world = 0
    while (folder / RUN_STATE.format(rank=world)).is_file():
        world += 1
    return world


def is_checkpoint(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a file, or a whole sharded checkpoint folder."""
    return Path(path).is_file() or is_sharded(path)


def checkpoints_in(directory: str | os.PathLike[str], *, best: bool = True) -> list[Path]:
    """The checkpoints in ``directory`` (or in its ``checkpoint/`` folder), files and
    whole sharded folders alike, newest first; where there are none but best ones
    (``Checkpoint(keep=0, best=...)``), those (unless ``best`` is False)."""
    directory = Path(directory)
    for folder in (directory, directory / "checkpoint"):
        found = {
            *(p for p in folder.glob(PATTERN) if p.is_file()),
            *(p for p in folder.glob("ckpt-*") if is_sharded(p)),
        }
        if found:
            return sorted(found, key=_order, reverse=True)
    return best_in(directory) if best else []


def best_in(directory: str | os.PathLike[str]) -> list[Path]:
    """The best-K checkpoint files in ``directory`` (or in its ``checkpoint/`` folder),
    newest first (a sharded run's best are among its checkpoints: ``best.json``)."""
    directory = Path(directory)
    for folder in (directory, directory / "checkpoint"):
        best = [p for p in folder.glob(BEST_PATTERN) if p.is_file()]
        if best:
            return sorted(best, key=_order, reverse=True)
    return []


def newest(paths: list[Path]) -> Path | None:
    """The newest of ``paths`` by the positions their names record."""
    return max(paths, key=_order, default=None)


def saved_entries(directory: Path) -> list[Path]:
    """What a Checkpoint pack saved in ``directory``: checkpoint files and best files by
    their names, sharded checkpoint folders and the best record (what ``overwrite=`` moves
    aside or deletes); the folder's other files (a script's ``ckpt.pt``, its exported
    weights, its logs) are not among them."""
    return sorted(
        p
        for p in directory.iterdir()
        if (p.is_file() and (_named_checkpoint(p) or p.name == BEST_RECORD))
        or (p.is_dir() and p.name.startswith("ckpt-") and position(p) != (-1, -1))
    )


def _named_checkpoint(path: Path) -> bool:
    """Whether ``path``'s name is a checkpoint file's or a best-K file's."""
    return (
        path.suffix == ".pt"
        and path.name.startswith(("ckpt-", "best-"))
        and position(path) != (-1, -1)
    )


def first_readable(
    path: str | os.PathLike[str], read: Callable[[Path], T], doing: str = "resume from"
) -> tuple[Path, T]:
    """``(checkpoint, read(checkpoint))`` for the checkpoint at ``path``: a checkpoint file
    or a sharded folder itself, else the newest of the folder's checkpoints that reads.
    ``read`` raises ``Unreadable`` for one that does not: given alone it is the error;
    in a folder it is skipped with a warning saying why (any other error is raised: a
    checkpoint of a newer format is no torn one, and skipping it would resume from an
    older state). ``doing`` says what for, in the error for a folder without any."""
    path = Path(path)
    if path.is_file() or is_sharded(path):
        return path, read(path)
    candidates = checkpoints_in(path)
    if not candidates:
        raise FileNotFoundError(
            f"no checkpoint to {doing} at {str(path)!r} (a checkpoint "
            f"file, a sharded checkpoint folder, or a folder holding "
            f"{PATTERN} files or sharded checkpoint folders)"
        )
    for n, candidate in enumerate(candidates, 1):
        try:
            return candidate, read(candidate)
        except Unreadable as error:
            older = "; trying an older one" if n < len(candidates) else ""
            warnings.warn(
                f"skipping unreadable checkpoint {str(candidate)!r}: {error.why}{older}",
                stacklevel=3,
            )
    raise FileNotFoundError(
        f"no readable checkpoint in {str(path)!r}: all "
        f"{len(candidates)} are damaged (see the warnings above)"
    )

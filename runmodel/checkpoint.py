"""Checkpoint files: plain values (dicts, lists, numbers, strings, tensors) written
atomically and read without running code.

A checkpoint holds what ``engine.snapshot()`` returns: the engine's counters and every
attached pack's state, the model's state (weights, optimizer) and the random number
generators' states. It is written to a temporary file, flushed and fsynced, then renamed
over its name, so a crash leaves either the old file or the new one, never half of one;
it is read with ``torch.load(weights_only=True)``, so a checkpoint never runs code.
"""

from __future__ import annotations

import os
import random
import warnings
from pathlib import Path
from typing import Any, cast

import torch

__all__ = ["FORMAT", "PATTERN", "FormatError", "checkpoints_in", "load", "read", "rng_state",
           "save", "set_rng_state"]

FORMAT = 2
PATTERN = "ckpt-*.pt"


class _Foreign(ValueError):
    """A file that loads, but holds no runmodel checkpoint."""


class FormatError(ValueError):
    """A checkpoint written by a newer runmodel, in a format this one cannot read."""


def rng_state() -> dict[str, Any]:
    """The states of Python's, NumPy's and torch's (CPU and every CUDA device's) random
    number generators."""
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {"torch": torch.get_rng_state(),  # Python's 625 words as a tensor:
                             "python": (version, torch.tensor(internal), gauss)}  # one record
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy

        name, keys, pos, has_gauss, cached = cast("tuple[str, Any, int, int, float]",
                                                  numpy.random.get_state())
        state["numpy"] = (name, torch.from_numpy(keys.copy()), pos, has_gauss, cached)
    except ImportError:
        pass
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state()`` returned."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    internal = internal.tolist() if isinstance(internal, torch.Tensor) else internal
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy

        name, keys, pos, has_gauss, cached = state["numpy"]
        numpy.random.set_state((name, keys.numpy(), pos, has_gauss, cached))


def save(path: str | os.PathLike[str], snapshot: dict[str, Any]) -> Path:
    """Write ``snapshot`` to ``path`` atomically, refusing anything that ``read`` could
    not load back."""
    path = Path(path)
    for key, pack_state in snapshot.get("engine", {}).get("packs", {}).items():
        _check_loadable(pack_state, f"pack {key!r} state_dict()")
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(temporary, "wb") as file:
            torch.save({"format": FORMAT, **snapshot}, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # the rename itself is durable too
    finally:
        os.close(directory)
    return path


_PLAIN = (str, int, float, bool, type(None), torch.Tensor)


def _check_loadable(value: Any, where: str) -> None:
    """Refuse, when saving, what ``torch.load(weights_only=True)`` would refuse when
    resuming: only dicts, lists, tuples, numbers, strings, None and tensors."""
    if isinstance(value, dict):
        for key, item in value.items():
            _check_loadable(key, where)
            _check_loadable(item, f"{where}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_loadable(item, f"{where}[{i}]")
    elif not isinstance(value, _PLAIN):
        raise TypeError(f"{where} holds {type(value).__name__} {value!r}, which a checkpoint "
                        f"cannot load back safely; keep dicts, lists, tuples, numbers, strings "
                        f"and tensors (e.g. str(path) for a path)")


def checkpoints_in(directory: str | os.PathLike[str]) -> list[Path]:
    """The checkpoint files in ``directory`` (or in its ``checkpoint/`` folder), newest
    first."""
    directory = Path(directory)
    found = sorted(directory.glob(PATTERN)) or sorted((directory / "checkpoint").glob(PATTERN))
    return found[::-1]  # names sort by epoch, then step


def read(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The snapshot in the checkpoint file ``path``."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or not isinstance(state.get("format"), int):
        raise _Foreign("it holds no runmodel checkpoint")
    if state["format"] == 1:  # weights and optimizer were kept beside the engine's state
        state["model"] = {"module": state["model"], "optimizer": state.pop("optimizer")}
    elif state["format"] != FORMAT:
        raise FormatError(f"{str(path)!r} was written in checkpoint format {state['format']} "
                          f"by a newer runmodel; this one reads formats 1 to {FORMAT}: "
                          f"upgrade runmodel to resume it")
    return state


def load(path: str | os.PathLike[str]) -> tuple[Path, dict[str, Any]]:
    """The checkpoint at ``path``: a checkpoint file, or a directory, whose newest
    readable checkpoint is used (an unreadable one is skipped with a warning)."""
    path = Path(path)
    candidates = [path] if path.is_file() else checkpoints_in(path)
    if not candidates:
        raise FileNotFoundError(f"no checkpoint to resume from at {str(path)!r} (a checkpoint "
                                f"file, or a directory holding {PATTERN} files)")
    for candidate in candidates:
        try:
            return candidate, read(candidate)
        except FormatError:
            raise  # not torn: skipping it would resume from an older state
        except Exception as error:  # a torn or foreign file: try the next one
            if path.is_file():
                what = "a runmodel" if isinstance(error, _Foreign) else "a readable"
                raise ValueError(f"{str(candidate)!r} is not {what} checkpoint: {error}"
                                 ) from error
            warnings.warn(f"skipping unreadable checkpoint {str(candidate)!r}: {error}",
                          stacklevel=2)
    raise FileNotFoundError(f"no readable checkpoint in {str(path)!r}")

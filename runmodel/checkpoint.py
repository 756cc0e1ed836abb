"""Checkpoint files: what a run needs to go on, written atomically, read without code.

A checkpoint holds the engine's state (counters and every attached pack's state), the
model's weights, the optimizer's state and the random number generators' states. It is
written to a temporary file, flushed and fsynced, then renamed over its name, so a crash
leaves either the old file or the new one, never half of one; it is read with
``torch.load(weights_only=True)``, so a checkpoint never runs code.
"""

from __future__ import annotations

import os
import random
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .model import unwrap

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["checkpoints_in", "load_checkpoint", "save_checkpoint"]

FORMAT = 1
PATTERN = "ckpt-*.pt"


class _Foreign(ValueError):
    """A file that loads, but holds no runmodel checkpoint."""


def _module(model: Any) -> torch.nn.Module | None:
    return unwrap(getattr(model, "module", None))


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy

        name, keys, pos, has_gauss, cached = numpy.random.get_state()
        state["numpy"] = (name, torch.from_numpy(keys.copy()), pos, has_gauss, cached)
    except ImportError:
        pass
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy

        name, keys, pos, has_gauss, cached = state["numpy"]
        numpy.random.set_state((name, keys.numpy(), pos, has_gauss, cached))


def save_checkpoint(engine: Engine, path: str | os.PathLike[str],
                    counters: dict[str, int] | None = None) -> Path:
    """Write the run's state to ``path`` atomically. ``counters`` replaces the engine's
    counters (a hook saving mid-phase passes where a resumed run should start)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    engine_state = engine.state_dict()
    for key, pack_state in engine_state["packs"].items():
        _check_loadable(pack_state, f"pack {key!r} state_dict()")
    if counters is not None:
        engine_state["counters"] = {**engine_state["counters"], **counters}
    model = engine.model
    module = _module(model)
    state = {"format": FORMAT, "engine": engine_state, "rng": _rng_state(),
             "model": module.state_dict() if module is not None else (
                 model.state_dict() if hasattr(model, "state_dict") else None),
             "optimizer": None}
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        state["optimizer"] = optimizer.state_dict()
    temporary = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(temporary, "wb") as file:
            torch.save(state, file)
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


def load_checkpoint(engine: Engine, path: str | os.PathLike[str]) -> Path:
    """Restore the run state saved at ``path``: a checkpoint file, or a directory, whose
    newest readable checkpoint is used (an unreadable one is skipped with a warning)."""
    path = Path(path)
    candidates = [path] if path.is_file() else checkpoints_in(path)
    if not candidates:
        raise FileNotFoundError(f"no checkpoint to resume from at {str(path)!r} (a checkpoint "
                                f"file, or a directory holding {PATTERN} files)")
    for candidate in candidates:
        try:
            state = torch.load(candidate, map_location="cpu", weights_only=True)
            if not isinstance(state, dict) or state.get("format") != FORMAT:
                raise _Foreign(f"no runmodel checkpoint (format {FORMAT}) inside")
        except Exception as error:  # a torn or foreign file: try the next one
            if path.is_file():
                what = "a runmodel" if isinstance(error, _Foreign) else "a readable"
                raise ValueError(f"{str(candidate)!r} is not {what} checkpoint: {error}"
                                 ) from error
            warnings.warn(f"skipping unreadable checkpoint {str(candidate)!r}: {error}",
                          stacklevel=2)
            continue
        _apply(engine, state)
        return candidate
    raise FileNotFoundError(f"no readable checkpoint in {str(path)!r}")


def _apply(engine: Engine, state: dict[str, Any]) -> None:
    model = engine.model
    module = _module(model)
    if state["model"] is not None:
        if module is not None:
            module.load_state_dict(state["model"])
        elif hasattr(model, "load_state_dict"):
            model.load_state_dict(state["model"])
    optimizer = getattr(model, "optimizer", None)
    if state["optimizer"] is not None and optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    engine.load_state_dict(state["engine"])
    _set_rng_state(state["rng"])

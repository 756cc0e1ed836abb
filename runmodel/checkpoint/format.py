"""Checkpoint files: plain values (dicts, lists, numbers, strings, tensors) written
atomically and read without running code.

A checkpoint holds what ``engine.snapshot()`` returns: the engine's counters and every
attached pack's state, the model's state (weights, optimizer) and the random number
generators' states. It is written to a temporary file, flushed and fsynced, then renamed
over its name (``runmodel._io.atomic_write``), so a crash leaves either the old file or
the new one, never half of one; it is read with ``torch.load(weights_only=True)``, so a
checkpoint never runs code, and a file that does not read is one ``Unreadable`` error
that says what is wrong with it.
"""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path
from typing import Any

import torch

from .._io import atomic_write, remove_stale
from ..core.snapshot import rng_state, set_rng_state
from .names import RUN_STATE, Unreadable, first_readable, saved_world

__all__ = [
    "FORMAT",
    "FormatError",
    "check_loadable",
    "check_same_optimizer",
    "load",
    "load_values",
    "qualified_name",
    "ranked_best",
    "read",
    "remove_stale_in",
    "rng_state",
    "run_of",
    "save",
    "set_rng_state",
    "torch_state",
    "trainable",
    "trainable_parameters",
    "weights",
    "write",
]

FORMAT = 2


class FormatError(ValueError):
    """A checkpoint written by a newer runmodel, in a format this one cannot read."""


def save(path: str | os.PathLike[str], snapshot: dict[str, Any]) -> Path:
    """Write ``snapshot`` to ``path`` atomically, refusing anything that ``read`` could
    not load back."""
    check_loadable(snapshot)
    return write(Path(path), snapshot)


def check_loadable(snapshot: dict[str, Any]) -> None:
    """Refuse a snapshot whose pack states ``read`` could not load back, naming the pack
    and the key."""
    for key, pack_state in snapshot.get("engine", {}).get("packs", {}).items():
        _check_plain(pack_state, f"pack {key!r} state_dict()")


def write(path: Path, snapshot: dict[str, Any]) -> Path:
    """``snapshot`` (checked already) to a locked temporary file, fsynced, renamed over
    ``path``; a full disk is one ``DiskFullError`` naming ``path``."""
    with atomic_write(path) as file:
        torch.save({"format": FORMAT, **snapshot}, file)
    return path


_PLAIN = (str, int, float, bool, type(None), torch.Tensor)


def _check_plain(value: Any, where: str) -> None:
    """Refuse, when saving, what ``torch.load(weights_only=True)`` would refuse when
    resuming: only dicts, lists, tuples, numbers, strings, None and tensors."""
    if isinstance(value, dict):
        for key, item in value.items():
            _check_plain(key, where)
            _check_plain(item, f"{where}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_plain(item, f"{where}[{i}]")
    elif not isinstance(value, _PLAIN):
        raise TypeError(
            f"{where} holds {type(value).__name__} {value!r}, which a checkpoint "
            f"cannot load back safely; keep dicts, lists, tuples, numbers, strings "
            f"and tensors (e.g. str(path) for a path)"
        )


def read(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The snapshot in the checkpoint file ``path``. A file that does not read as one is
    one ``Unreadable`` (a ``ValueError``) saying what is wrong with it: empty, cut short
    or damaged, not a torch file, not runmodel's, or holding an object whose loading
    would run code (refused unread); a missing file is ``FileNotFoundError``."""
    path = Path(path)
    state = load_values(path)
    if (
        not isinstance(state, dict)
        or not isinstance(state.get("format"), int)
        or (isinstance(state["format"], bool))
    ):
        raise Unreadable(path, "it holds no runmodel checkpoint", foreign=True) from None
    if state["format"] < 1 or (
        state["format"] <= FORMAT and not isinstance(state.get("engine"), dict)
    ):
        raise Unreadable(
            path,
            f"it holds no runmodel checkpoint (a 'format' of "
            f"{state['format']}, but no engine state)",
            foreign=True,
        ) from None
    if state["format"] == 1:  # weights and optimizer were kept beside the engine's state
        state["model"] = {"module": state["model"], "optimizer": state.pop("optimizer")}
    elif state["format"] != FORMAT:
        raise FormatError(
            f"{str(path)!r} was written in checkpoint format {state['format']} "
            f"by a newer runmodel; this one reads formats 1 to {FORMAT}: "
            f"upgrade runmodel to resume it"
        )
    return state


def load_values(path: Path, mmap: bool = False) -> Any:
    """What ``path`` holds, read with ``torch.load(weights_only=True)`` (plain values
    only: nothing a file names is ever called); a file that does not load is one
    ``Unreadable`` saying what is wrong with it."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        raise
    except Exception as error:  # torch raises what its reader met: name it in words
        why = _why_unreadable(path, error)
    raise Unreadable(path, why) from None  # one error: nothing chained, no context


def _why_unreadable(path: Path, error: BaseException) -> str:
    """What is wrong with a checkpoint file that ``torch.load`` refused, in words."""
    found = re.search(r"GLOBAL ([\w.]+)", str(error))
    if isinstance(error, pickle.UnpicklingError) and found:  # weights_only refused a name
        return (
            f"it holds an object whose loading would run code ({found.group(1)}), which "
            f"no runmodel checkpoint holds; it was refused unread. Delete it unless you "
            f"know where it came from"
        )
    try:
        size = path.stat().st_size
        with open(path, "rb") as file:
            zipped = file.read(4) == b"PK\x03\x04"  # what torch.save writes: a zip archive
    except OSError:
        size, zipped = -1, True
    if size == 0:
        return "it is empty (0 bytes): its write was cut short"
    if not zipped:
        return (
            f"its {size} bytes are not a file torch.save writes (a zip archive): another "
            f"kind of file, or overwritten"
        )
    text = str(error).strip()
    first = text.splitlines()[0] if text else type(error).__name__
    return (
        f"it is cut short or damaged ({size} bytes), not a whole checkpoint "
        f"({type(error).__name__}: {first[:160]})"
    )


def run_of(path: str | os.PathLike[str], rank: int = 0) -> dict[str, Any] | None:
    """The run record in the checkpoint at ``path``, a file or a sharded folder
    (``{"id": ..., "started": ..., "max_epochs": ..., "max_steps": ...}``; ``{}`` for one
    written before runs had records; None for no readable checkpoint), read without
    loading the tensors' bytes (memory-mapped). A sharded one holds each process's:
    process ``rank`` of a run resumed from it takes saved rank ``rank`` mod N's."""
    path = Path(path)
    if path.is_dir():
        path = path / RUN_STATE.format(rank=rank % max(saved_world(path), 1))
    try:
        state = load_values(path, mmap=True)
    except (OSError, Unreadable):  # a torn or foreign file: not a checkpoint of any run
        return None
    if not isinstance(state, dict) or not isinstance(state.get("engine"), dict):
        return None
    return dict(state["engine"].get("run") or {})


def ranked_best(path: str | os.PathLike[str]) -> list[str]:
    """The best-K checkpoints' names, best first, as the ``Checkpoint`` packs of the
    checkpoint file at ``path`` had ranked them when it was saved (read without loading
    the tensors' bytes); ``[]`` where it cannot be read or ranks none."""
    try:
        state = load_values(Path(path), mmap=True)
        packs = state["engine"]["packs"]
        return [str(name) for pack in packs.values() for _, name in pack.get("best_saved", [])]
    except (OSError, Unreadable, KeyError, TypeError, AttributeError, ValueError):
        return []


def load(path: str | os.PathLike[str]) -> tuple[Path, dict[str, Any]]:
    """The checkpoint file at ``path``, or the newest readable one of a folder (an
    unreadable one is skipped with a warning saying why); first, what saves killed
    mid-write left in the folder goes (``runmodel._io.remove_stale``)."""
    remove_stale_in(path)
    return first_readable(path, read)


def remove_stale_in(path: str | os.PathLike[str]) -> None:
    """Before a resume from a folder (or its ``checkpoint/`` folder): remove what saves
    killed mid-write left there, temporary files and staging folders whose writers are
    gone (a live writer's is locked, and stays)."""
    path = Path(path)
    if path.is_dir():
        remove_stale(path)
        remove_stale(path / "checkpoint")


def weights(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The module weights (``state_dict``) in a checkpoint file, or in the newest readable
    checkpoint of a folder: to start a new run from them alone, with a fresh optimizer,
    counters and data order (``module.load_state_dict(weights(path))`` in ``setup()``)."""
    where, state = load(path)
    model = state.get("model")
    module = model.get("module") if isinstance(model, dict) else None
    if not isinstance(module, dict):
        raise ValueError(
            f"{str(where)!r} holds no module weights (its model's state_dict() has no 'module')"
        )
    return module


def torch_state(
    module: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None
) -> dict[str, Any]:
    """What a checkpoint keeps of a torch model (``TorchModel.state_dict()``): the
    module's weights, which of its parameters train (``requires_grad``: the trainable set
    is part of the run's state), the optimizer's state and its class (what a resume
    checks the run's optimizer against, with the groups' sizes)."""
    return {
        "module": None if module is None else module.state_dict(),
        "requires_grad": None if module is None else trainable(module),
        "optimizer": None if optimizer is None else optimizer.state_dict(),
        "optimizer_class": None if optimizer is None else qualified_name(type(optimizer)),
    }


def trainable(module: torch.nn.Module) -> dict[str, bool]:
    """Each parameter's ``requires_grad``, by name: what a checkpoint records, so that a
    resumed run trains the parameters the run trained (a layer a hook froze or unfroze)."""
    return {name: p.requires_grad for name, p in trainable_parameters(module)}


def trainable_parameters(module: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """``named_parameters()``'s names and parameters, in its order, a shared parameter
    once (read from each module's own table: a third of its time, at every save)."""
    if type(module).named_parameters is not torch.nn.Module.named_parameters:  # its own
        return list(module.named_parameters())
    named: list[tuple[str, torch.nn.Parameter]] = []
    seen: set[int] = set()
    for prefix, owner in module.named_modules():
        for name, p in owner._parameters.items():
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                named.append((f"{prefix}.{name}" if prefix else name, p))
    return named


def qualified_name(kind: type) -> str:
    """``module.QualName`` of a class, as checkpoints record the optimizer's."""
    return f"{kind.__module__}.{kind.__qualname__}"


def check_same_optimizer(
    optimizer: torch.optim.Optimizer, state: dict[str, Any], name: str
) -> None:
    """Refuse a checkpoint of another optimizer class or parameter-group layout (torch
    would fail a step later, or load another optimizer's state), naming both."""
    saved_class = state.get("optimizer_class")  # None: a checkpoint from before it was kept
    saved_groups = [len(g.get("params", ())) for g in state["optimizer"].get("param_groups", [])]
    own_class = qualified_name(type(optimizer))
    own_groups = [len(g["params"]) for g in optimizer.param_groups]
    if (saved_class is None or saved_class == own_class) and saved_groups == own_groups:
        return
    raise ValueError(
        f"the checkpoint's optimizer is {saved_class or 'unrecorded'} with parameter groups of "
        f"{saved_groups} parameters; {name}'s is {own_class} with {own_groups}: a resume "
        f"continues the optimizer it was saved with. To train on from the checkpoint's weights "
        f"with this optimizer, start a new run from its weights only: "
        f"module.load_state_dict(runmodel.checkpoint.weights(path)) in setup(), without resume= "
        f"(docs/packs/checkpoint.md, 'Starting from a checkpoint's weights')"
    )

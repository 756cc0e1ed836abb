"""Checkpoint files: plain values (dicts, lists, numbers, strings, tensors) written
atomically and read without running code.

A checkpoint holds what ``engine.snapshot()`` returns: the engine's counters and every
attached pack's state, the model's state (weights, optimizer) and the random number
generators' states. It is written to a temporary file, flushed and fsynced, then renamed
over its name, so a crash leaves either the old file or the new one, never half of one;
it is read with ``torch.load(weights_only=True)``, so a checkpoint never runs code.

``Writer`` writes them in a background thread: the snapshot's tensors are copied into CPU
buffers kept from one save to the next (the training goes on changing the originals), and
the thread writes the copy as ``save`` does.
"""

from __future__ import annotations

import copy
import os
import pickle
import random
import re
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch

from .._io import DiskFullError, atomic_write, remove_stale

__all__ = ["BEST_PATTERN", "FORMAT", "PATTERN", "DiskFullError", "FormatError", "Writer",
           "check_same_optimizer", "checkpoints_in", "load", "qualified_name", "read",
           "rng_state", "run_of", "save", "set_rng_state", "weights"]

FORMAT = 2
PATTERN = "ckpt-*.pt"
BEST_PATTERN = "best-*.pt"  # the best-K by a metric: best-<metric>=<value>-<epoch>-<step>.pt


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
    _check_snapshot(snapshot)
    return _write(Path(path), snapshot)


def _check_snapshot(snapshot: dict[str, Any]) -> None:
    """Refuse a snapshot whose pack states ``read`` could not load back, naming the pack
    and the key."""
    for key, pack_state in snapshot.get("engine", {}).get("packs", {}).items():
        _check_loadable(pack_state, f"pack {key!r} state_dict()")


def _write(path: Path, snapshot: dict[str, Any]) -> Path:
    """To a locked temporary file, fsynced, renamed over ``path`` (``_files.py``)."""
    with atomic_write(path) as file:
        torch.save({"format": FORMAT, **snapshot}, file)
    return path


class Writer:
    """Write checkpoints in a background thread, one at a time.

    ``submit`` copies the snapshot's tensors (on the caller's thread: the copy is the
    state at that moment, whatever the training changes next) into CPU buffers reused
    from the previous save (pinned, and copied without waiting, for CUDA tensors), and
    starts a thread that writes the copy as ``save`` does, then calls ``then``. A
    ``submit`` while a write is under way waits for it first; ``wait`` waits for it and
    raises the error it met, naming the file. The buffers hold one more copy of the
    state in CPU memory.
    """

    __slots__ = ("_buffers", "_error", "_path", "_thread")

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, int, int], torch.UntypedStorage] = {}
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._path: Path | None = None

    @property
    def busy(self) -> bool:
        """Whether a checkpoint is being written now."""
        return self._thread is not None and self._thread.is_alive()

    def submit(self, path: str | os.PathLike[str], snapshot: dict[str, Any],
               then: Callable[[], None] | None = None) -> None:
        """Write ``snapshot`` to ``path`` in the background, then call ``then`` there;
        waits for the write before, and raises its error."""
        self.wait()
        _check_snapshot(snapshot)
        fresh: dict[tuple[str, int, int], torch.UntypedStorage] = {}
        devices: set[torch.device] = set()
        staged = _stage(snapshot, self._buffers, fresh, devices)
        self._buffers = fresh  # buffers this snapshot did not use are freed
        events = []
        for device in devices:  # the copies are queued on the device's stream
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(device))
            events.append(event)
        self._path = Path(path)
        self._thread = threading.Thread(target=self._run, args=(self._path, staged, events, then),
                                        name=f"runmodel checkpoint writer {self._path.name}",
                                        daemon=True)
        self._thread.start()

    def _run(self, path: Path, staged: dict[str, Any], events: list[Any],
             then: Callable[[], None] | None) -> None:
        try:
            for event in events:
                event.synchronize()
            _write(path, staged)
            if then is not None:
                then()
        except BaseException as error:  # raised on the training thread by wait()
            self._error = error

    def wait(self) -> None:
        """Block until the checkpoint being written is on disk; raise the error that
        writing it met (once), naming the file."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        try:
            thread.join()
        except BaseException:  # interrupted: still under way, wait again next time
            self._thread = thread
            raise
        error, self._error = self._error, None
        if isinstance(error, DiskFullError):  # it names the file already
            raise error
        if error is not None:
            raise RuntimeError(f"writing checkpoint {str(self._path)!r} in the background "
                               f"failed: {type(error).__name__}: {error}") from error


def _stage(value: Any, buffers: dict[tuple[str, int, int], torch.UntypedStorage],
           fresh: dict[tuple[str, int, int], torch.UntypedStorage],
           devices: set[torch.device]) -> Any:
    """``value`` with every container rebuilt and every tensor copied to the CPU, into
    ``buffers`` where one fits (moved to ``fresh``). Tensors that shared a storage share
    the copy, so the file is the one ``save`` writes."""
    if isinstance(value, torch.Tensor):
        return _stage_tensor(value, buffers, fresh, devices)
    if isinstance(value, dict):
        staged = copy.copy(value)  # keeps an OrderedDict's _metadata (module versions)
        for key, item in value.items():
            staged[key] = _stage(item, buffers, fresh, devices)
        return staged
    if isinstance(value, list):
        return [_stage(item, buffers, fresh, devices) for item in value]
    if isinstance(value, tuple):
        items = [_stage(item, buffers, fresh, devices) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, (str, int, float, bool, type(None), bytes)):
        return value
    return copy.deepcopy(value)


def _stage_tensor(tensor: torch.Tensor,
                  buffers: dict[tuple[str, int, int], torch.UntypedStorage],
                  fresh: dict[tuple[str, int, int], torch.UntypedStorage],
                  devices: set[torch.device]) -> torch.Tensor:
    if (type(tensor) not in (torch.Tensor, torch.nn.Parameter) or tensor.layout != torch.strided
            or tensor.is_quantized or tensor.is_conj() or tensor.is_neg()
            or tensor.device.type == "meta"):
        return tensor.detach().to("cpu", copy=True)  # rare kinds: a plain blocking copy
    storage = tensor.untyped_storage()
    nbytes = storage.nbytes()
    if nbytes == 0:
        return torch.empty_strided(tensor.size(), tensor.stride(), dtype=tensor.dtype)
    key = (str(tensor.device), storage.data_ptr(), nbytes)
    buffer = fresh.get(key)
    if buffer is None:  # the first tensor of this storage: copy the whole storage
        buffer = buffers.pop(key, None)
        cuda = tensor.device.type == "cuda"
        if buffer is None:
            buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda).untyped_storage()
        source = torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(storage)
        torch.empty(0, dtype=torch.uint8).set_(buffer).copy_(source, non_blocking=cuda)
        if cuda:
            devices.add(tensor.device)
        fresh[key] = buffer
    staged = torch.empty(0, dtype=tensor.dtype).set_(buffer, tensor.storage_offset(),
                                                     tensor.size(), tensor.stride())
    return staged.requires_grad_() if tensor.requires_grad else staged


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
    first; where there are none but best ones (``Checkpoint(keep=0, best=...)``), those."""
    directory = Path(directory)
    for folder in (directory, directory / "checkpoint"):
        found = sorted(folder.glob(PATTERN))  # names sort by epoch, then step
        if found:
            return found[::-1]
    for folder in (directory, directory / "checkpoint"):
        best = sorted(folder.glob(BEST_PATTERN), key=lambda p: p.stem.rsplit("-", 2)[1:])
        if best:
            return best[::-1]
    return []


def read(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The snapshot in the checkpoint file ``path``."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or not isinstance(state.get("format"), int) or (
            isinstance(state["format"], bool)):
        raise _Foreign("it holds no runmodel checkpoint")
    if state["format"] < 1 or (state["format"] <= FORMAT
                               and not isinstance(state.get("engine"), dict)):
        raise _Foreign(f"it holds no runmodel checkpoint (a 'format' of {state['format']}, but "
                       f"no engine state)")
    if state["format"] == 1:  # weights and optimizer were kept beside the engine's state
        state["model"] = {"module": state["model"], "optimizer": state.pop("optimizer")}
    elif state["format"] != FORMAT:
        raise FormatError(f"{str(path)!r} was written in checkpoint format {state['format']} "
                          f"by a newer runmodel; this one reads formats 1 to {FORMAT}: "
                          f"upgrade runmodel to resume it")
    return state


def _why_unreadable(path: Path, error: BaseException) -> str:
    """What is wrong with a checkpoint file that ``read`` refused, in words."""
    if isinstance(error, _Foreign):
        return str(error)
    if isinstance(error, pickle.UnpicklingError) and "weights_only" in str(error).lower():
        found = re.search(r"GLOBAL ([\w.]+)", str(error))
        what = f" ({found.group(1)})" if found else ""
        return (f"it holds an object whose loading would run code{what}, which no runmodel "
                f"checkpoint holds; it was refused unread. Delete it unless you know where it "
                f"came from")
    try:
        size = path.stat().st_size
    except OSError:
        size = -1
    if size == 0:
        return "it is empty (0 bytes): its write was cut short"
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return (f"it is cut short or damaged ({size} bytes), not a whole checkpoint "
            f"({type(error).__name__}: {first[:160]})")


def run_of(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The run record in the checkpoint file ``path`` (``{"id": ..., "started": ...,
    "max_epochs": ..., "max_steps": ...}``; ``{}`` for one written before runs had
    records; None for a file that is no readable checkpoint), read without loading the
    tensors' bytes (memory-mapped)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # a torn or foreign file: not a checkpoint of any run
        return None
    if not isinstance(state, dict) or not isinstance(state.get("engine"), dict):
        return None
    return dict(state["engine"].get("run") or {})


def load(path: str | os.PathLike[str]) -> tuple[Path, dict[str, Any]]:
    """The checkpoint at ``path``: a checkpoint file, or a directory, whose newest
    readable checkpoint is used (an unreadable one is skipped with a warning)."""
    path = Path(path)
    if path.is_dir():  # what saves killed mid-write left behind
        remove_stale(path)
        remove_stale(path / "checkpoint")
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
            why = _why_unreadable(candidate, error)
            if path.is_file():
                what = "a runmodel" if isinstance(error, _Foreign) else "a readable"
                raise ValueError(f"{str(candidate)!r} is not {what} checkpoint: {why}"
                                 ) from None
            warnings.warn(f"skipping unreadable checkpoint {str(candidate)!r}: {why}; resuming "
                          f"from an older one", stacklevel=2)
    raise FileNotFoundError(f"no readable checkpoint in {str(path)!r}")


def weights(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The module weights (``state_dict``) in a checkpoint file, or in the newest readable
    checkpoint of a folder: to start a new run from them alone, with a fresh optimizer,
    counters and data order (``module.load_state_dict(weights(path))`` in ``setup()``)."""
    where, state = load(path)
    model = state.get("model")
    module = model.get("module") if isinstance(model, dict) else None
    if not isinstance(module, dict):
        raise ValueError(f"{str(where)!r} holds no module weights (its model's state_dict() "
                         f"has no 'module')")
    return module


def qualified_name(kind: type) -> str:
    """``module.QualName`` of a class, as checkpoints record the optimizer's."""
    return f"{kind.__module__}.{kind.__qualname__}"


def check_same_optimizer(optimizer: torch.optim.Optimizer, state: dict[str, Any],
                         name: str) -> None:
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
        f"(docs/packs/checkpoint.md, 'Starting from a checkpoint's weights')")

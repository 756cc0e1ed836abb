"""Sharded checkpoints: one folder per save, every process writing its own shard of the
model and optimizer with ``torch.distributed.checkpoint`` (DCP), beside its own run state.

A folder ``ckpt-EEEEE-SSSSSSSSSS/`` holds:

- ``.metadata``: DCP's index of every shard (which process wrote which part of which
  tensor, where in which file);
- ``__R_0.distcp``: process R's shards of the module's weights and the optimizer's state
  (and the optimizer's hyperparameters);
- ``run-R.pt``: process R's run state, a plain checkpoint file (``checkpoint.py``): the
  counters, the last loss and metrics, every pack's state, R's random generators, where
  R's data stands, and the world size.

Every process writes into a hidden staging folder (``.ckpt-...tmp-TOKEN``); once all of
them wrote and DCP's metadata exists (DCP's last collective of the save), rank 0 renames
it to its name in one step: a folder with a checkpoint's name is always whole, so
``resume="auto"`` never picks a half-written save.

A folder resumes in as many processes as wrote it, or in another number under ``fsdp``
(DCP reshards; rank r takes saved rank r mod N's run state), or whole in one process or
under ``ddp`` (the optimizer's state numbered again by parameter order); a plain file
resumes under ``fsdp`` too (``docs/distributed.md``, "Resuming in another number of
processes").

Loading never runs code. DCP reads its metadata with plain ``pickle`` and its non-tensor
items (the optimizer's hyperparameters) with ``torch.load(weights_only=False)``;
``SafeReader`` reads the metadata through an allow-list of DCP's own record classes and
every item with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import pickle
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch

from .._io import atomic_write, remove_stale, shared_lock
from . import format as checkpoint

__all__ = ["METADATA", "SafeReader", "Sharded", "ShardedModelState", "ShardedWriter",
           "UnsafeCheckpointError", "all_checkpoints_in", "folder_name", "is_checkpoint",
           "load", "of", "read_model_state", "read_whole", "register", "save", "unregister"]

METADATA = ".metadata"
RUN_STATE = "run-{rank}.pt"


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A sharded checkpoint's metadata names something outside the allow-list."""


# -- the run being sharded -----------------------------------------------------------------


class Sharded:
    """What a sharded save needs of a run under the ``fsdp`` backend: the model (its
    ``module`` and ``optimizer``), the process group checkpoints use (its own, so that
    an async save's collectives never interleave with training's), this process's rank,
    the world size, and a token shared by all processes that names this run's staging
    folders. ``ended_together`` is False once the processes failed to agree at the end:
    then no collective save is attempted."""

    def __init__(self, model: Any, group: Any, rank: int, world: int, token: str) -> None:
        self.model, self.group, self.rank, self.world, self.token = (
            model, group, rank, world, token)
        self.ended_together = True

    def state(self) -> dict[str, Any]:
        """The model's and optimizer's sharded state, as DCP saves and loads it."""
        from torch.distributed.checkpoint.state_dict import (
            get_model_state_dict,
            get_state_dict,
        )

        module, optimizer = self.model.module, getattr(self.model, "optimizer", None)
        if optimizer is None:
            return {"module": get_model_state_dict(module)}
        model_state, optimizer_state = get_state_dict(module, optimizer)
        return {"module": model_state, "optimizer": optimizer_state}

    def set_state(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        module, optimizer = self.model.module, getattr(self.model, "optimizer", None)
        if optimizer is None or "optimizer" not in state:
            set_model_state_dict(module, state["module"])
        else:
            set_state_dict(module, optimizer, model_state_dict=state["module"],
                           optim_state_dict=state["optimizer"])


_active: dict[int, Sharded] = {}


def register(model: Any, sharded: Sharded) -> None:
    """``model`` is sharded for a run (the ``fsdp`` backend): checkpoints of it are
    sharded."""
    _active[id(model)] = sharded


def unregister(model: Any) -> None:
    _active.pop(id(model), None)


def of(model: Any) -> Sharded | None:
    """How ``model`` is sharded in the run under way, or None (a plain checkpoint)."""
    return _active.get(id(model))


# -- names -----------------------------------------------------------------------------------


def folder_name(file_name: str) -> str:
    """A sharded checkpoint's folder name, from the file name a plain one would have."""
    return file_name[:-3] if file_name.endswith(".pt") else file_name


def is_checkpoint(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a whole sharded checkpoint folder."""
    path = Path(path)
    return path.is_dir() and (path / METADATA).is_file() and (
        path / RUN_STATE.format(rank=0)).is_file()


def all_checkpoints_in(directory: str | os.PathLike[str]) -> list[Path]:
    """The checkpoints in ``directory`` (or its ``checkpoint/`` folder), files and whole
    sharded folders alike, newest first (names sort by epoch, then step)."""
    directory = Path(directory)
    for folder in (directory, directory / "checkpoint"):
        if not folder.is_dir():
            continue
        found = [*folder.glob(checkpoint.PATTERN),
                 *(p for p in folder.glob("ckpt-*") if is_checkpoint(p))]
        if found:
            return sorted(set(found), key=lambda p: folder_name(p.name), reverse=True)
    return checkpoint.checkpoints_in(directory)  # the best alone (keep=0 with best=), if any


# -- saving ----------------------------------------------------------------------------------


def save(path: str | os.PathLike[str], snapshot: dict[str, Any], sharded: Sharded) -> Path:
    """Write a sharded checkpoint at ``path`` (a folder): every process calls it at the
    same point, with its own ``snapshot`` (``engine.snapshot()``; its ``model`` part is
    replaced by the sharded state). Collective, on the checkpoint group."""
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    staging = _staging(path, sharded)
    with shared_lock(staging):  # held while this process writes: it is alive
        _write_run_state(staging, _run_state(snapshot, sharded), sharded.rank)
        dcp.save(sharded.state(), storage_writer=_writer(staging), process_group=sharded.group)
        if sharded.rank == 0:  # every process wrote, and the metadata is there
            publish(staging, path, sharded.world)
    return path


def _staging(path: Path, sharded: Sharded) -> Path:
    return path.with_name(f".{path.name}.tmp-{sharded.token}")


def _run_state(snapshot: dict[str, Any], sharded: Sharded) -> dict[str, Any]:
    return {**{key: value for key, value in snapshot.items() if key != "model"},
            "world_size": sharded.world,
            "optimizer_layout": optimizer_layout(snapshot.get("model"))}


def _write_run_state(staging: Path, run_state: dict[str, Any], rank: int) -> None:
    staging.mkdir(parents=True, exist_ok=True)
    checkpoint.save(staging / RUN_STATE.format(rank=rank), run_state)


def _writer(staging: Path) -> Any:
    from torch.distributed.checkpoint import FileSystemWriter

    return FileSystemWriter(staging, sync_files=True, overwrite=True)


def publish(staging: Path, path: Path, world: int, timeout: float = 60.0) -> None:
    """Rank 0, once every process wrote its shards: when every process's run state is
    there too (an async save writes them beside its shards, each process in its own
    thread: a bounded wait), the staging folder becomes ``path`` in one rename (a
    folder already there, from an earlier run, is moved aside first)."""
    if not (staging / METADATA).is_file():
        raise RuntimeError(f"the sharded checkpoint {str(path)!r} has no {METADATA} after "
                           f"every process wrote it")
    deadline = time.monotonic() + timeout
    while missing := [r for r in range(world)
                      if not (staging / RUN_STATE.format(rank=r)).is_file()]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the sharded checkpoint {str(path)!r} lacks the run state of "
                               f"rank(s) {missing} {timeout:g} s after its shards were written")
        time.sleep(0.01)
    old = None
    if path.exists():
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        os.replace(path, old)
    os.replace(staging, path)
    _fsync_directory(path.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def remove(path: Path) -> None:
    """Delete a checkpoint, a file or a sharded folder."""
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def remove_stale_staging(directory: Path) -> list[Path]:
    """Rank 0, at a run's start and before each save: the staging folders (and temporary
    files) of writers that died mid-save, found by their locks: a folder goes once no
    process holds its shared lock (``_files.shared_lock``). Returns what was removed."""
    return remove_stale(directory)


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


class ShardedWriter:
    """``async_save=True`` for sharded checkpoints: DCP's ``async_save`` copies the shards
    into CPU memory (buffers kept from one save to the next: the training waits for this
    copy alone), then a background thread writes them, with the process's run state,
    its collectives on the checkpoint group; rank 0 makes the folder visible when every
    process's part is there, then calls ``then``. Same interface as
    ``checkpoint.Writer``: ``submit`` waits for the write before; ``wait`` waits for the
    one under way and raises its error, naming the folder."""

    def __init__(self, sharded: Sharded) -> None:
        self.sharded = sharded
        self._stager: Any = None  # made at the first save, its CPU buffers reused after
        self._future: Future[Any] | None = None
        self._done: threading.Thread | None = None
        self._error: BaseException | None = None
        self._path: Path | None = None

    @property
    def busy(self) -> bool:
        return self._done is not None and self._done.is_alive()

    def submit(self, path: str | os.PathLike[str], snapshot: dict[str, Any],
               then: Callable[[], None] | None = None) -> None:
        import torch.distributed.checkpoint as dcp

        self.wait()
        path = self._path = Path(path)
        staging = _staging(path, self.sharded)
        lock = contextlib.ExitStack()  # held until this process's part is written
        lock.enter_context(shared_lock(staging))
        try:
            # the run state is small: copied now, written in the background with the shards
            run_state = copy.deepcopy(_run_state(snapshot, self.sharded))
            if self._stager is None:
                from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

                # DCP's default stager, kept: it copies into the CPU storages of the
                # previous save (a fresh one per save allocates and faults in every byte)
                self._stager = DefaultStager(StagingOptions(False, False, False, False))
            future = dcp.async_save(self.sharded.state(), storage_writer=_writer(staging),
                                    process_group=self.sharded.group,
                                    async_stager=self._stager)
            assert isinstance(future, Future)
            self._done = threading.Thread(target=self._finish,
                                          args=(future, staging, run_state, path, then, lock),
                                          name=f"runmodel sharded checkpoint {path.name}",
                                          daemon=True)
            self._done.start()
        except BaseException:
            lock.close()
            raise

    def _finish(self, future: Future[Any], staging: Path, run_state: dict[str, Any],
                path: Path, then: Callable[[], None] | None, lock: contextlib.ExitStack
                ) -> None:
        try:
            _write_run_state(staging, run_state, self.sharded.rank)
            future.result()
            if self.sharded.rank == 0:
                publish(staging, path, self.sharded.world)
                if then is not None:
                    then()
        except BaseException as error:  # raised on the training thread by wait()
            self._error = error
        finally:
            lock.close()

    def wait(self) -> None:
        done, self._done = self._done, None
        if done is None:
            return
        try:
            done.join()
        except BaseException:
            self._done = done
            raise
        error, self._error = self._error, None
        if error is not None:
            raise RuntimeError(f"writing sharded checkpoint {str(self._path)!r} in the "
                               f"background failed: {type(error).__name__}: {error}") from error


# -- loading ---------------------------------------------------------------------------------


class ShardedModelState:
    """A sharded checkpoint's model part, loaded into the model where the engine restores
    it (after the setup hooks). Under ``fsdp`` every process reads its own shards
    (collective), in as many processes as wrote it or another number: DCP reshards.
    Otherwise (one process, ``ddp``) every process reads the whole state and loads it as
    a plain checkpoint's, the optimizer's state numbered again by parameter order.
    ``layout``: the optimizer's class and group sizes the save recorded (checked first)."""

    def __init__(self, folder: Path, layout: dict[str, Any] | None = None) -> None:
        self.folder, self.layout = folder, layout or {}

    def restore_into(self, model: Any) -> None:
        import torch.distributed.checkpoint as dcp

        sharded, optimizer = of(model), getattr(model, "optimizer", None)
        if sharded is None:
            self._restore_whole(model)
            return
        if isinstance(optimizer, torch.optim.Optimizer):
            groups = self.layout.get("groups")
            _check_optimizer(model, optimizer, {
                "optimizer_class": self.layout.get("class"), "optimizer": {"param_groups": [
                    {"params": range(n)} for n in (
                        groups if groups is not None else
                        [len(g["params"]) for g in optimizer.param_groups])]}})
        state = sharded.state()
        dcp.load(state, storage_reader=checked_reader(self.folder), process_group=sharded.group)
        sharded.set_state(state)

    def _restore_whole(self, model: Any) -> None:
        optimizer = getattr(model, "optimizer", None)
        whole = read_whole(self.folder, optimizer=optimizer is not None)
        saved = whole.get("optimizer")
        model.load_state_dict({"module": whole["module"],
                               "optimizer": None if saved is None else _by_number(saved),
                               "optimizer_class": self.layout.get("class")})

    def __repr__(self) -> str:
        return f"ShardedModelState({str(self.folder)!r})"


class FullModelState:
    """A plain checkpoint's model part (whole tensors: a one-process or ``ddp`` run's),
    loaded into a sharded model, each process keeping its shard of every tensor; the
    optimizer's state, saved by parameter number, is matched to the parameters by their
    order in the parameter groups, as ``Optimizer.load_state_dict`` does, after the
    optimizer's class and group layout are checked as a plain resume checks them."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def restore_into(self, model: Any) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        module, optimizer = model.module, getattr(model, "optimizer", None)
        saved = self.state.get("optimizer")
        if saved is not None and isinstance(optimizer, torch.optim.Optimizer):
            _check_optimizer(model, optimizer, self.state)  # before anything is loaded
        options = StateDictOptions(full_state_dict=True)
        if self.state.get("module") is not None:
            set_model_state_dict(module, self.state["module"], options=options)
        if saved is not None and optimizer is not None:
            set_optimizer_state_dict(module, optimizer, _by_name(saved, module, optimizer),
                                     options=options)


def _check_optimizer(model: Any, optimizer: torch.optim.Optimizer,
                     state: dict[str, Any]) -> None:
    """The plain resume's check (``TorchModel.load_state_dict``): the same optimizer
    class and parameter-group layout, or an error naming both."""
    checkpoint.check_same_optimizer(optimizer, state, type(model).__name__)


def optimizer_layout(model_state: Any) -> dict[str, Any] | None:
    """What a sharded save records of the optimizer beside its state, for the check at
    resume: its class and the sizes of its parameter groups (from the model's
    ``state_dict()``: ``TorchModel``'s ``optimizer_class`` and ``optimizer``)."""
    if not isinstance(model_state, dict) or not isinstance(model_state.get("optimizer"), dict):
        return None
    return {"class": model_state.get("optimizer_class"),
            "groups": [len(g.get("params", ())) for g in
                       model_state["optimizer"].get("param_groups", [])]}


def _by_name(saved: dict[str, Any], module: Any, optimizer: Any) -> dict[str, Any]:
    """An optimizer state dict keyed by parameter number, keyed by parameter name."""
    names = {id(p): n for n, p in module.named_parameters()}
    groups = saved.get("param_groups", [])
    if len(groups) != len(optimizer.param_groups) or any(
            len(g["params"]) != len(o["params"]) for g, o in zip(groups, optimizer.param_groups,
                                                                 strict=True)):
        raise ValueError("the checkpoint's optimizer has other parameter groups than this "
                         "run's optimizer: it cannot be loaded into the sharded one")
    fqn = {number: names[id(p)] for g, o in zip(groups, optimizer.param_groups, strict=True)
           for number, p in zip(g["params"], o["params"], strict=True)}
    return {"state": {fqn[number]: state for number, state in saved.get("state", {}).items()},
            "param_groups": [{**g, "params": [fqn[n] for n in g["params"]]} for g in groups]}


def _by_number(saved: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state dict keyed by parameter name (DCP's), keyed by parameter
    number as ``Optimizer.state_dict`` numbers them: in group order."""
    groups = saved.get("param_groups", [])
    number = {name: i for i, name in enumerate(n for g in groups for n in g["params"])}
    return {"state": {number[name]: state for name, state in saved.get("state", {}).items()},
            "param_groups": [{**g, "params": [number[n] for n in g["params"]]}
                             for g in groups]}


def saved_world(folder: Path) -> int:
    """How many processes wrote the sharded checkpoint ``folder``: one run state each."""
    world = 0
    while (folder / RUN_STATE.format(rank=world)).is_file():
        world += 1
    return world


def read(folder: str | os.PathLike[str], rank: int | None = None) -> dict[str, Any]:
    """This process's snapshot from the sharded checkpoint ``folder``: its run state,
    and the model's part to load into the model. In another number of processes than
    wrote it, rank r takes the run state (random generators, packs' state) of saved
    rank r mod N; ``check_world`` (``core/continuing.py``) says so, or refuses a
    checkpoint taken mid-epoch."""
    import torch.distributed as dist

    folder = Path(folder)
    if rank is None:
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    saved = saved_world(folder)
    if saved == 0:
        raise ValueError(f"{str(folder)!r} holds no run state ({RUN_STATE.format(rank=0)})")
    state = checkpoint.read(folder / RUN_STATE.format(rank=rank % saved))
    state.pop("world_size", None)
    run = state.get("engine", {}).get("run")
    if isinstance(run, dict):  # what check_world compares the run's size with
        run["world_size"], run["sharded"] = saved, True
    state["model"] = ShardedModelState(folder, state.pop("optimizer_layout", None))
    return state


def read_whole(folder: str | os.PathLike[str], optimizer: bool = True) -> dict[str, Any]:
    """The full model state dict (every tensor whole, on the CPU) and, with
    ``optimizer``, the optimizer's (keyed by parameter name) from a sharded checkpoint,
    read in this one process, without a process group."""
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    reader = checked_reader(folder)
    keys = {"module"}
    if optimizer and any(k.startswith("optimizer.") or k == "optimizer"
                         for k in reader.read_metadata().state_dict_metadata):
        keys.add("optimizer")
    state: dict[str, Any] = {}
    _load_state_dict(state, storage_reader=reader,
                     planner=_EmptyStateDictLoadPlanner(keys=keys), no_dist=True)
    if not isinstance(state.get("module"), dict):
        raise ValueError(f"{str(folder)!r} holds no model weights")
    return {key: _whole(value) for key, value in state.items()}


def _whole(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _whole(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_whole(item) for item in value]
    return value.full_tensor() if hasattr(value, "full_tensor") else value


def load(path: str | os.PathLike[str], model: Any = None) -> tuple[Path, dict[str, Any]]:
    """``checkpoint.load`` for sharded checkpoints too: ``path`` is a checkpoint file, a
    sharded checkpoint folder, or a folder of them (its newest readable one). A plain
    checkpoint to restore into ``model`` sharded (the fsdp backend) is read whole by every
    process, each keeping its shards (``FullModelState``)."""
    found, snapshot = _load(path)
    state = snapshot.get("model")
    if model is not None and of(model) is not None and isinstance(state, dict):
        snapshot["model"] = FullModelState(state)
    packs = snapshot.get("engine", {}).get("packs")
    if model is not None and isinstance(packs, dict):
        _to_own_backend(packs, model)
    return found, snapshot


def _to_own_backend(packs: dict[str, Any], model: Any) -> None:
    """The data-parallel backend's pack state (its sampler's seed) goes to this run's
    backend's pack: a ``ddp`` checkpoint's under ``fsdp``, and the other way; a run in
    one process has no sampler to give it to (the resume's line says the data differ)."""
    from torch.nn.parallel import DistributedDataParallel

    own = "fsdp" if of(model) is not None else "ddp" if isinstance(
        getattr(model, "module", None), DistributedDataParallel) else None
    for key in ("ddp", "fsdp"):
        if key != own and key in packs:
            state = packs.pop(key)
            if own is not None and own not in packs:
                packs[own] = state


def _load(path: str | os.PathLike[str]) -> tuple[Path, dict[str, Any]]:
    import warnings

    path = Path(path)
    if is_checkpoint(path):
        return path, read(path)
    if path.is_file():
        return checkpoint.load(path)
    candidates = all_checkpoints_in(path)
    if not any(c.is_dir() for c in candidates):
        return checkpoint.load(path)  # its messages, for files alone
    for candidate in candidates:
        try:
            return candidate, (read(candidate) if candidate.is_dir() else
                               checkpoint.read(candidate))
        except checkpoint.FormatError:
            raise
        except Exception as error:
            warnings.warn(f"skipping unreadable checkpoint {str(candidate)!r}: {error}",
                          stacklevel=2)
    raise FileNotFoundError(f"no readable checkpoint in {str(path)!r}")


def read_model_state(folder: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """The full model state dict (every tensor whole, on the CPU) from a sharded
    checkpoint, read in this one process, without a process group."""
    module: dict[str, torch.Tensor] = read_whole(folder, optimizer=False)["module"]
    return module


# -- reading without running code ------------------------------------------------------------

_ALLOWED = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
        "TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath", "Path"},
    "collections": {"OrderedDict"},
}


class _AllowListUnpickler(pickle.Unpickler):
    """Unpickles DCP's metadata records and nothing else, as ``torch.load``'s
    ``weights_only`` does for checkpoints: any other global is refused before it is
    looked up, so no function a file names is ever called."""

    def find_class(self, module: str, name: str) -> Any:
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnsafeCheckpointError(
            f"the checkpoint's metadata names {module}.{name}, which is not among the "
            f"records a torch.distributed.checkpoint index holds; it was not loaded (a "
            f"checkpoint from an untrusted source, or one written by another library)")


_safe_reader: type | None = None


def SafeReader(path: str | os.PathLike[str]) -> Any:  # a class, made on first use
    """DCP's ``FileSystemReader`` of ``path``, reading the metadata through an allow-list
    and every non-tensor item with ``torch.load(weights_only=True)``. (The class is made
    on first use: importing torch.distributed.checkpoint costs time.)"""
    global _safe_reader
    if _safe_reader is None:
        from torch.distributed.checkpoint import FileSystemReader
        from torch.distributed.checkpoint.metadata import StorageMeta

        class _SafeReader(FileSystemReader):
            def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
                path = self._get_metadata_path(kwargs.get("rank"))
                with self.fs.create_stream(path, "rb") as stream:
                    metadata = _AllowListUnpickler(stream).load()
                if getattr(metadata, "storage_meta", None) is None:
                    metadata.storage_meta = StorageMeta()
                metadata.storage_meta.load_id = self.load_id
                return metadata

            def read_data(self, plan: Any, planner: Any) -> Any:
                return super().read_data(plan, _SafeBytes(planner))  # type: ignore[arg-type]

        _safe_reader = _SafeReader
    return _safe_reader(path)


def checked_reader(path: str | os.PathLike[str]) -> Any:
    """``SafeReader(path)``, its metadata read once first: DCP's loader would take an
    unsafe metadata file's error for a missing file and report that instead."""
    reader = SafeReader(path)
    reader.read_metadata()
    return reader


class _SafeBytes:
    """A planner seen through: bytes items are loaded with ``weights_only=True``, then
    handed on as the plain values they are."""

    def __init__(self, planner: Any) -> None:
        self._planner = planner

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        plain = torch.load(value, weights_only=True)
        again = io.BytesIO()
        torch.save(plain, again)  # plain values only: loading them back runs nothing
        again.seek(0)
        self._planner.load_bytes(read_item, again)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._planner, name)


# -- export ----------------------------------------------------------------------------------


def export(path: str | os.PathLike[str], out: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Write the full model state dict of the checkpoint at ``path`` to ``out``, one
    plain ``torch.save`` file that ``torch.load(weights_only=True)`` loads into the bare
    module. ``path`` is a checkpoint file, a sharded checkpoint folder, or a folder of
    checkpoints (a Checkpoint pack's, or a run folder's): its newest readable one.
    Returns the checkpoint used and ``out``."""
    import warnings

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{str(path)!r}: no such checkpoint file or folder")
    candidates = [path] if path.is_file() or is_checkpoint(path) else all_checkpoints_in(path)
    if not candidates:
        raise FileNotFoundError(f"no checkpoint in {str(path)!r} (a checkpoint file, a "
                                f"sharded checkpoint folder, or a folder holding them)")
    for candidate in candidates:
        try:
            state = _model_state(candidate)
            break
        except checkpoint.FormatError:
            raise
        except Exception as error:
            if len(candidates) == 1:
                raise ValueError(f"{str(candidate)!r} is not a readable checkpoint: "
                                 f"{error}") from None
            warnings.warn(f"skipping unreadable checkpoint {str(candidate)!r}: {error}",
                          stacklevel=2)
    else:
        raise FileNotFoundError(f"no readable checkpoint in {str(path)!r}")
    out = Path(out)
    with atomic_write(out) as file:
        torch.save(state, file)
    return candidate, out


def _model_state(candidate: Path) -> dict[str, torch.Tensor]:
    if candidate.is_dir():
        return read_model_state(candidate)
    model = checkpoint.read(candidate).get("model")
    module = model.get("module") if isinstance(model, dict) else None
    if not isinstance(module, dict):
        raise ValueError("it holds no module weights (a model without a module state)")
    return {key: value.detach().clone() if isinstance(value, torch.Tensor) else value
            for key, value in module.items()}

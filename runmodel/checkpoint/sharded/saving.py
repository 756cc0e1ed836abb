"""Saving a sharded checkpoint: every process of an ``fsdp`` run writes its shard of the
model and optimizer with ``torch.distributed.checkpoint`` (DCP), beside its own run state.

Every process writes into a hidden staging folder (``.ckpt-...tmp-TOKEN``), holding a
shared lock on it while it writes (so that a cleaner removes it only once every writer is
done or dead). Then the processes agree on the outcome (one all-reduce): once all of them
wrote, rank 0 renames the staging folder to its name in one step, so a folder with a
checkpoint's name is always whole and ``resume="auto"`` never picks a half-written save.
A failure on any process fails the save on every process, together: a full disk is one
``DiskFullError`` naming the checkpoint (whatever DCP wrapped it in), the staging folder
goes, and the checkpoints before it stay.
"""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..._io import DiskFullError, disk_full, fsync_folder, shared_lock
from ..format import save as save_file
from ..names import METADATA, RUN_STATE
from ..writer import Stager, raise_background_error

__all__ = ["Sharded", "ShardedWriter", "optimizer_layout", "publish", "save"]


class Sharded:
    """What a sharded save needs of a run under the ``fsdp`` backend: the model (its
    ``module`` and ``optimizer``), the process group checkpoints use (its own, so that
    an async save's collectives never interleave with training's), this process's rank,
    the world size, and a token shared by all processes that names this run's staging
    folders. ``ended_together`` is False once the processes failed to agree at the end:
    then no collective save is attempted."""

    def __init__(self, model: Any, group: Any, rank: int, world: int, token: str) -> None:
        self.model, self.group, self.rank, self.world, self.token = (
            model,
            group,
            rank,
            world,
            token,
        )
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
            set_state_dict(
                module,
                optimizer,
                model_state_dict=state["module"],
                optim_state_dict=state["optimizer"],
            )


def save(path: str | os.PathLike[str], snapshot: dict[str, Any], sharded: Sharded) -> Path:
    """Write a sharded checkpoint at ``path`` (a folder): every process calls it at the
    same point, with its own ``snapshot`` (``engine.snapshot()``; its ``model`` part is
    replaced by the sharded state). Collective, on the checkpoint group; every process
    takes part in each collective even once its own part failed, and all raise
    together."""
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    staging = _staging(path, sharded)
    with contextlib.ExitStack() as lock:  # held while this process writes: it is alive
        failure = _attempt(lock.enter_context, shared_lock(staging))
        failure = failure or _attempt(
            _write_run_state, staging, _run_state(snapshot, sharded), sharded.rank
        )
        failure = (
            _attempt(
                dcp.save,
                sharded.state(),
                storage_writer=_writer(staging),
                process_group=sharded.group,
            )
            or failure
        )
        agree(failure, sharded, staging, path)
        if sharded.rank == 0:  # every process wrote, and the metadata is there
            publish(staging, path, sharded.world)
    return path


def _attempt(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> BaseException | None:
    """``fn(*args, **kwargs)``; the error it raised (DCP's ``CheckpointException`` is a
    ``BaseException``), else None. Ctrl-C and exit are raised at once."""
    try:
        fn(*args, **kwargs)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as error:
        return error
    return None


def agree(failure: BaseException | None, sharded: Sharded, staging: Path, path: Path) -> None:
    """Every process, after its part of a save: the processes' outcomes, all-reduced.
    Where any failed, rank 0 removes the staging folder and every process raises: a full
    disk anywhere as one ``DiskFullError`` naming the checkpoint, else this process's
    own error, or one saying that another process failed."""
    import torch.distributed as dist

    full = _full_disk(failure)  # its errno (ENOSPC, EFBIG) is the code: 0 is no failure
    code = 0 if failure is None else (full.errno or 1) if full is not None else 1
    verdict = torch.tensor([code], dtype=torch.int32)  # the group is gloo: CPU
    dist.all_reduce(verdict, op=dist.ReduceOp.MAX, group=sharded.group)
    worst = int(verdict.item())
    if worst == 0:
        return
    if sharded.rank == 0:  # every process is past its writes: the failed save goes
        shutil.rmtree(staging, ignore_errors=True)
    if worst > 1:
        raise DiskFullError(worst, str(path)) from None
    if failure is not None:
        raise failure
    raise RuntimeError(
        f"the sharded checkpoint {str(path)!r} was not saved: another process "
        f"failed to write its part (its error says why); the checkpoints "
        f"before it are kept"
    )


def _full_disk(error: BaseException | None) -> OSError | None:
    """The ``ENOSPC``/``EFBIG`` error in ``error``: itself, what it wraps, or (DCP's
    ``CheckpointException``) any process's failure it gathered."""
    found = disk_full(error)
    failures = getattr(error, "failures", None)
    if found is None and isinstance(failures, dict):
        for failure in failures.values():  # (the exception, its traceback summary)
            failed = failure[0] if isinstance(failure, tuple) else failure
            if isinstance(failed, BaseException) and (found := disk_full(failed)) is not None:
                break
    return found


def _staging(path: Path, sharded: Sharded) -> Path:
    return path.with_name(f".{path.name}.tmp-{sharded.token}")


def _run_state(snapshot: dict[str, Any], sharded: Sharded) -> dict[str, Any]:
    return {
        **{key: value for key, value in snapshot.items() if key != "model"},
        "world_size": sharded.world,
        "optimizer_layout": optimizer_layout(snapshot.get("model")),
    }


def _write_run_state(staging: Path, run_state: dict[str, Any], rank: int) -> None:
    staging.mkdir(parents=True, exist_ok=True)
    save_file(staging / RUN_STATE.format(rank=rank), run_state)


def optimizer_layout(model_state: Any) -> dict[str, Any] | None:
    """What a sharded save records of the optimizer beside its state, for the check at
    resume: its class and the sizes of its parameter groups (from the model's
    ``state_dict()``: ``TorchModel``'s ``optimizer_class`` and ``optimizer``)."""
    if not isinstance(model_state, dict) or not isinstance(model_state.get("optimizer"), dict):
        return None
    return {
        "class": model_state.get("optimizer_class"),
        "groups": [
            len(g.get("params", ())) for g in model_state["optimizer"].get("param_groups", [])
        ],
    }


def _writer(staging: Path) -> Any:
    from torch.distributed.checkpoint import FileSystemWriter

    return FileSystemWriter(staging, sync_files=True, overwrite=True)


def publish(staging: Path, path: Path, world: int, timeout: float = 60.0) -> None:
    """Rank 0, once every process wrote its shards: when every process's run state is
    there too (a shared file system may show them late: a bounded wait), the staging
    folder becomes ``path`` in one rename (a folder already there, from an earlier run,
    is moved aside first)."""
    if not (staging / METADATA).is_file():
        raise RuntimeError(
            f"the sharded checkpoint {str(path)!r} has no {METADATA} after every process wrote it"
        )
    deadline = time.monotonic() + timeout
    while missing := [
        r for r in range(world) if not (staging / RUN_STATE.format(rank=r)).is_file()
    ]:
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the sharded checkpoint {str(path)!r} lacks the run state of "
                f"rank(s) {missing} {timeout:g} s after its shards were written"
            )
        time.sleep(0.01)
    old = None
    if path.exists():
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        os.replace(path, old)
    os.replace(staging, path)
    fsync_folder(path.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


class ShardedWriter:
    """``async_save=True`` for sharded checkpoints: ``submit`` copies this process's shards
    of the state into CPU buffers kept from one save to the next (``writer.Stager``: the
    training waits for this copy alone; a DTensor's copy is its local shard's, under a
    DTensor kept as well), then a background thread writes them with DCP's ``save``, with
    the process's run state, its collectives on the checkpoint group; the processes
    agree on the outcome there, and rank 0 makes the folder visible, then calls
    ``then``. Same interface as ``writer.Writer``: ``submit`` waits for the write
    before; ``wait`` waits for the one under way and raises its error, naming the folder
    (a full disk as one ``DiskFullError``). (DCP's own ``async_save`` staged each
    DTensor anew, through DTensor's dispatch: in one process, a state of 4,096 tensors,
    204 MB, took 267 ms, 10 times a bare copy of its bytes; this copy takes 48 ms.)"""

    def __init__(self, sharded: Sharded) -> None:
        from torch.distributed.tensor import DTensor

        self.sharded = sharded
        self._dtensor = DTensor  # (imported once: staging asks it of every tensor)
        self._stager = Stager(self._stage_dtensor)
        self._wrappers: dict[tuple[Any, ...], torch.Tensor] = {}  # this save's DTensors
        self._previous: dict[tuple[Any, ...], torch.Tensor] = {}  # the save before's
        self._done: threading.Thread | None = None
        self._error: BaseException | None = None
        self._path: Path | None = None

    @property
    def busy(self) -> bool:
        return self._done is not None and self._done.is_alive()

    def submit(
        self,
        path: str | os.PathLike[str],
        snapshot: dict[str, Any],
        then: Callable[[], None] | None = None,
    ) -> None:
        self.wait()
        path = self._path = Path(path)
        staging = _staging(path, self.sharded)
        lock = contextlib.ExitStack()  # held until this process's part is written
        failure = _attempt(lock.enter_context, shared_lock(staging))
        try:
            # the run state is small: copied now, written in the background with the shards
            run_state = copy.deepcopy(_run_state(snapshot, self.sharded))
            self._previous, self._wrappers = self._wrappers, {}
            staged, events = self._stager.stage(self.sharded.state())
            self._previous = {}
            self._done = threading.Thread(
                target=self._finish,
                args=(staged, events, staging, run_state, path, then, lock, failure),
                name=f"runmodel sharded checkpoint {path.name}",
                daemon=True,
            )
            self._done.start()
        except BaseException:
            lock.close()
            raise

    def _stage_dtensor(
        self, tensor: torch.Tensor, stage_tensor: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor | None:
        """A DTensor's staged copy: its local shard's, under a DTensor of the same mesh,
        placements and global shape, kept for the next saves; None for other classes."""
        DTensor = self._dtensor
        if not isinstance(tensor, DTensor):
            return None
        local = stage_tensor(tensor.to_local())
        mesh, placements, shape, stride = (
            tensor.device_mesh,
            tensor.placements,
            tensor.shape,
            tensor.stride(),
        )
        key = (id(local), mesh, placements, shape, stride)  # the staged shards are kept
        wrapper = self._wrappers.get(key)
        if wrapper is None:
            wrapper = self._previous.pop(key, None)
            if wrapper is None:
                wrapper = DTensor.from_local(
                    local, mesh, placements, run_check=False, shape=shape, stride=stride
                )
            self._wrappers[key] = wrapper
        return wrapper

    def _finish(
        self,
        staged: dict[str, Any],
        events: list[Any],
        staging: Path,
        run_state: dict[str, Any],
        path: Path,
        then: Callable[[], None] | None,
        lock: contextlib.ExitStack,
        failure: BaseException | None,
    ) -> None:
        import torch.distributed.checkpoint as dcp

        try:
            for event in events:  # the copies from a GPU are done
                event.synchronize()
            failure = failure or _attempt(_write_run_state, staging, run_state, self.sharded.rank)
            failure = (
                _attempt(
                    dcp.save,
                    staged,
                    storage_writer=_writer(staging),
                    process_group=self.sharded.group,
                )
                or failure
            )
            agree(failure, self.sharded, staging, path)
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
            raise_background_error(error, "sharded checkpoint", self._path)

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
import io
import operator
import os
import pickle
import shutil
import threading
import time
from collections.abc import Callable
from itertools import chain
from pathlib import Path
from typing import Any

import torch

from ..._io import DiskFullError, disk_full, fsync_folder, shared_lock
from ..format import qualified_name
from ..format import save as save_file
from ..names import METADATA, RUN_STATE
from ..writer import _PARAMS, all_finite, raise_background_error
from .process import Arena, WriterProcess, describe, free_port, room
from .process import serve as serve_writes

__all__ = [
    "Sharded",
    "ShardedWriter",
    "StagingPlan",
    "optimizer_layout",
    "publish",
    "save",
    "serve",
    "write_part",
]


class Sharded:
    """What a sharded save needs of a run under the ``fsdp`` backend: the model (its
    ``module`` and ``optimizer``), the process group checkpoints use (its own, so that
    an async save's collectives never interleave with training's), this process's rank,
    the world size, and a token shared by all processes that names this run's staging
    folders. ``ended_together`` is False once the processes failed to agree at the end:
    then no collective save is attempted. ``timeout`` (seconds) bounds the collectives of
    the async saves' writer processes (``ShardedWriter``), as the checkpoint group's own
    timeout bounds its."""

    def __init__(
        self, model: Any, group: Any, rank: int, world: int, token: str, timeout: float = 600.0
    ) -> None:
        self.model, self.group, self.rank, self.world, self.token = (
            model,
            group,
            rank,
            world,
            token,
        )
        self.timeout = timeout
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

    def optimizer_layout(self) -> dict[str, Any] | None:
        """What a save records of the optimizer beside its state, for the check at
        resume: its class and the sizes of its parameter groups (None: no optimizer)."""
        optimizer = getattr(self.model, "optimizer", None)
        if not isinstance(optimizer, torch.optim.Optimizer):
            return None
        return {
            "class": qualified_name(type(optimizer)),
            "groups": [len(group["params"]) for group in optimizer.param_groups],
        }

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
    path = Path(path)
    run_state = _run_state(snapshot, sharded)
    write_part(sharded.state(), _staging(path, sharded), path, run_state, sharded)
    return path


def write_part(
    state: dict[str, Any], staging: Path, path: Path, run_state: dict[str, Any], sharded: Sharded
) -> None:
    """This process's part of the save at ``path``: its run state and its shards of
    ``state`` (DCP's) into ``staging``, holding a shared lock on it while it writes (it is
    alive); then the processes' agreement, and rank 0's rename. Collective, on
    ``sharded``'s group (a writer process's: its own)."""
    import torch.distributed.checkpoint as dcp

    with contextlib.ExitStack() as lock:
        failure = _attempt(lock.enter_context, shared_lock(staging))
        failure = failure or _attempt(_write_run_state, staging, run_state, sharded.rank)
        failure = (
            _attempt(dcp.save, state, storage_writer=_writer(staging), process_group=sharded.group)
            or failure
        )
        agree(failure, sharded, staging, path)
        if sharded.rank == 0:  # every process wrote, and the metadata is there
            publish(staging, path, sharded.world)


def serve() -> None:
    """A writer process of ``ShardedWriter`` (``process.serve``), writing each save as
    ``write_part`` does, its collectives on the writer processes' own group."""
    serve_writes(_write_alone)


def _write_alone(
    state: Any, staging: Path, path: Path, run_state: dict[str, Any], rank: int, world: int
) -> None:
    write_part(state, staging, path, run_state, Sharded(None, None, rank, world, ""))


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
        "optimizer_layout": sharded.optimizer_layout(),
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


_LOCAL = operator.attrgetter("_local_tensor")


def _parameter_ids(optimizer: Any) -> list[int]:
    """The optimizer's parameters by identity, group after group."""
    groups = getattr(optimizer, "param_groups", [])
    return list(map(id, chain.from_iterable(map(_PARAMS, groups))))


class StagingPlan:
    """Where an async sharded save copies from and to, resolved once. DCP's
    ``get_state_dict`` names every tensor of the state (the module's by their qualified
    names, the optimizer's by their parameters' names); the plan keeps the live tensor
    each one resolved to (a parameter or buffer where its module holds it, an optimizer
    state where the optimizer keeps it), a CPU buffer for each, and the staged state
    DCP's ``save`` writes: the same structure, each DTensor over its buffer with the same
    mesh, placements and global shape. ``stage()`` then finds the live tensors again (a
    lookup each), checks they are the planned ones (by identity), copies them in one
    batched call and refreshes the values that are not tensors (the optimizer's
    hyperparameters); it returns None where the state changed (a parameter or an
    optimizer replaced, new optimizer states): the caller plans again.

    The floating-point parameters' buffers are views of one flat buffer per dtype, so
    that the check that they are finite is one pass over each, over the copy (``finite``;
    DCP writes each view as a tensor of its own, the bytes a synchronous save writes).
    A state the plan cannot find in the module and optimizer (a module whose
    ``state_dict`` holds more than its tensors) is planned at every save instead."""

    def __init__(self, sharded: Sharded, previous: StagingPlan | None = None) -> None:
        from torch.distributed.tensor import DTensor

        self._dtensor = DTensor
        self.sent = False  # the writer process has the layout
        self.model = sharded.model
        self.module = sharded.model.module
        self.optimizer = getattr(sharded.model, "optimizer", None)
        self.reusable = True
        self.finite = True
        self._leaves: list[Any] = []  # each live tensor, as found where the plan found it
        self._sources: list[torch.Tensor] = []  # their local tensors, copied at each save
        self._targets: list[torch.Tensor] = []  # the buffers they are copied into
        self._checked: dict[int, str] = {}  # the floating-point parameters: their names
        self._flat: list[torch.Tensor] = []  # what the finite check reads
        self._slots: list[tuple[dict[str, Any], str]] = []  # module tables and names
        self._params: dict[str, Any] = {}
        # per optimizer state: its parameter, its tensors' keys, its size, its staged dict
        self._entries: list[tuple[Any, tuple[str, ...], int, dict[str, Any]]] = []
        # per optimizer state with values that are not tensors: its name, parameter, its
        # tensors' keys, its staged dict
        self._refreshed: list[tuple[str, Any, tuple[str, ...], dict[str, Any]]] = []
        self._groups: list[list[str]] = []
        self._group_ids: list[int] = []
        state = sharded.state()
        self.arena: Arena = Arena(
            _room(state, self._local), None if previous is None else previous.arena
        )
        self.staged: dict[str, Any] = {"module": self._plan_module(state["module"])}
        if "optimizer" in state:
            self.staged["optimizer"] = self._plan_optimizer(state["optimizer"])
        # what ``_unchanged`` compares, in C-level passes (no tensor hashed): the tables
        # and names of the module's tensors; the optimizer's states, its keys (the
        # parameters) and values (the per-parameter dicts) by identity; the keys of the
        # dicts that hold tensors alone; the others' sizes and tensor keys
        self._tables = [table for table, _ in self._slots]
        self._attributes = [attribute for _, attribute in self._slots]
        live_state = getattr(self.optimizer, "state", {})
        self._state_ids = (list(map(id, live_state)), list(map(id, live_state.values())))
        pers = [live_state.get(param) for param, _, _, _ in self._entries]
        self._plain: list[dict[str, Any]] = []
        self._mixed: list[tuple[dict[str, Any], tuple[str, ...], int]] = []
        for per, (_, keys, size, _) in zip(pers, self._entries, strict=True):
            if per is not None:  # (else not reusable)
                if len(keys) == size:
                    self._plain.append(per)
                else:
                    self._mixed.append((per, keys, size))
        self._plain_keys = list(chain.from_iterable(self._plain))
        leaves = self._live_leaves() if self.reusable else None
        self._ids = list(map(id, leaves or []))
        self._distributed = [i for i, leaf in enumerate(leaves or []) if isinstance(leaf, DTensor)]
        self._local_ids = list(map(id, self._locals(leaves or [])))

    # -- the plan --------------------------------------------------------------------

    def _plan_module(self, state: dict[str, Any]) -> dict[str, Any]:
        planned: list[tuple[str, Any, bool]] = []  # (name, live tensor, checked)
        sizes: dict[torch.dtype, int] = {}
        for name, value in state.items():
            if not isinstance(value, torch.Tensor):  # a module's extra state
                self.reusable = False
                planned.append((name, value, False))
                continue
            table, is_param = self._table(name, value)
            attribute = name.rpartition(".")[2]
            live = value if table is None else table[attribute]
            if table is not None:
                self._slots.append((table, attribute))
            if is_param:
                self._params[name] = live
            local = self._local(live)
            checked = is_param and (local.is_floating_point() or local.is_complex())
            if checked and local.is_contiguous() and local.layout is torch.strided:
                sizes[local.dtype] = sizes.get(local.dtype, 0) + local.numel()
            planned.append((name, live, checked))
        flats = {d: self.arena.take(d, n) for d, n in sizes.items()}
        self._flat = list(flats.values())
        taken = dict.fromkeys(flats, 0)
        staged: dict[str, Any] = {}
        for name, live, checked in planned:
            if not isinstance(live, torch.Tensor):
                staged[name] = copy.deepcopy(live)
                continue
            local, target = self._local(live), None
            if checked and local.dtype in flats and local.is_contiguous():
                start = taken[local.dtype]
                taken[local.dtype] = start + local.numel()
                target = flats[local.dtype][start : taken[local.dtype]].view(local.shape)
            if checked:
                self._checked[len(self._sources)] = name
                if target is None:  # not contiguous: checked on its own
                    target = self.arena.like(local)
                    self._flat.append(target)
            staged[name] = self._stage(live, target)
        return staged

    def _table(self, name: str, value: torch.Tensor) -> tuple[dict[str, Any] | None, bool]:
        """The table (parameters or buffers) of the module that holds ``name``, where it
        holds the tensor DCP's state has (the same data), and whether it is the
        parameters'; else None (and whether ``name`` names a parameter), and the plan is
        not reusable."""
        owner_name, _, attribute = name.rpartition(".")
        try:
            owner = self.module.get_submodule(owner_name)
        except AttributeError:
            owner = None
        for table in () if owner is None else (owner._parameters, owner._buffers):
            live = table.get(attribute)
            if isinstance(live, torch.Tensor) and (
                self._local(live).data_ptr() == self._local(value).data_ptr()
            ):
                return table, table is owner._parameters
        self.reusable = False
        return None, name in dict(self.module.named_parameters())

    def _plan_optimizer(self, state: dict[str, Any]) -> dict[str, Any]:
        optimizer = self.optimizer
        live_state = getattr(optimizer, "state", {})
        staged_state: dict[str, Any] = {}
        for name, per in state.get("state", {}).items():
            param = self._params.get(name)
            if param is None or live_state.get(param) is not per:
                self.reusable = False
            staged_per: dict[str, Any] = {}
            for key, value in per.items():
                if isinstance(value, torch.Tensor):
                    staged_per[key] = self._stage(value)
                else:
                    staged_per[key] = copy.deepcopy(value)
            keys = tuple(k for k, v in per.items() if isinstance(v, torch.Tensor))
            self._entries.append((param, keys, len(per), staged_per))
            if len(keys) < len(per):
                self._refreshed.append((name, param, keys, staged_per))
            staged_state[name] = staged_per
        groups = state.get("param_groups", [])
        live_groups = getattr(optimizer, "param_groups", [])
        self._groups = [list(group["params"]) for group in groups]
        if set(state) != {"state", "param_groups"} or len(groups) != len(live_groups):
            self.reusable = False
        for group, live in zip(groups, live_groups, strict=False):
            if list(group) != [k for k in live if k != "params"] + ["params"]:
                self.reusable = False
        self._group_ids = _parameter_ids(optimizer)
        return {"state": staged_state, "param_groups": _copied(groups)}

    def _stage(self, live: torch.Tensor, target: torch.Tensor | None = None) -> torch.Tensor:
        """``target`` (by default a CPU buffer like ``live``'s local shard) as the staged
        copy of ``live`` (under a DTensor like it)."""
        source = self._local(live).detach()
        if source.layout is not torch.strided or source.is_quantized or source.is_meta:
            self.reusable = False  # rare kinds: copied as they are, planned again
            return source.to("cpu", copy=True)
        if target is None:
            target = self.arena.like(source)
        self._leaves.append(live)
        self._sources.append(source)
        self._targets.append(target)
        if not isinstance(live, self._dtensor):
            return target
        return self._dtensor.from_local(
            target,
            live.device_mesh,
            live.placements,
            run_check=False,
            shape=live.shape,
            stride=live.stride(),
        )

    def _local(self, tensor: torch.Tensor) -> torch.Tensor:
        # (a DTensor's own shard: to_local() makes a new view of a parameter each call)
        return tensor._local_tensor if isinstance(tensor, self._dtensor) else tensor

    # -- a save ----------------------------------------------------------------------

    def stage(self) -> dict[str, Any] | None:
        """The staged state with the live state's values (the copy done, ``finite``
        set), or None where the state is not the planned one any more."""
        if not self.reusable or not self._unchanged():
            return None
        self.copy()
        if self.optimizer is not None:
            state = self.optimizer.state
            for _, param, keys, staged_per in self._refreshed:
                for key, value in state[param].items():
                    if key not in keys:
                        staged_per[key] = copy.deepcopy(value)
            self.staged["optimizer"]["param_groups"] = [
                {**_copied({k: v for k, v in live.items() if k != "params"}), "params": names}
                for live, names in zip(self.optimizer.param_groups, self._groups, strict=True)
            ]
        return self.staged

    def copy(self) -> dict[str, Any]:
        """The staged state, its tensors copied from the planned ones now (``finite``
        set): the first save's, the plan just made."""
        with torch.no_grad():
            if self._targets:
                torch._foreach_copy_(self._targets, self._sources)
            self.finite = all_finite(self._flat)
        return self.staged

    def _unchanged(self) -> bool:
        """Whether the live tensors are the planned ones: found where the plan found
        them, compared by identity (a DTensor's local shard too), in C-level passes."""
        optimizer = getattr(self.model, "optimizer", None)
        if self.model.module is not self.module or optimizer is not self.optimizer:
            return False
        if optimizer is not None and _parameter_ids(optimizer) != self._group_ids:
            return False
        leaves = self._live_leaves()
        return (
            leaves is not None
            and list(map(id, leaves)) == self._ids
            and list(map(id, self._locals(leaves))) == self._local_ids
        )

    def _live_leaves(self) -> list[Any] | None:
        """The tensors where the plan found its live ones, in the order of its ``_ids``
        (taken from this list): the module's tables, the optimizer's states that hold
        tensors alone, then the others'; None where the optimizer's states are not the
        planned dicts for the planned parameters, or hold other keys."""
        leaves: list[Any] = list(map(dict.get, self._tables, self._attributes))
        if self.optimizer is not None:
            state = getattr(self.optimizer, "state", {})
            if (
                list(map(id, state)) != self._state_ids[0]
                or list(map(id, state.values())) != self._state_ids[1]
                or list(chain.from_iterable(self._plain)) != self._plain_keys
            ):
                return None
            leaves += chain.from_iterable(map(dict.values, self._plain))
            for per, keys, size in self._mixed:
                if len(per) != size:
                    return None
                leaves += map(per.get, keys)
        return leaves

    def _locals(self, leaves: list[Any]) -> list[Any]:
        """The local shards of the DTensors among ``leaves``."""
        return list(map(_LOCAL, map(leaves.__getitem__, self._distributed)))

    def nonfinite(self) -> list[str]:
        """The names of the parameters whose staged copy holds NaN or inf."""
        return [name for i, name in self._checked.items() if not all_finite([self._targets[i]])]

    # -- what the writer process is sent ---------------------------------------------

    def layout(self) -> dict[str, Any]:
        """The staged state as the writer process rebuilds it over the shared file."""
        return describe(self.staged, self.arena)

    def values(self) -> dict[str, Any]:
        """What a save refreshes that is not in the shared file: the optimizer's
        hyperparameters and its states' values that are not tensors."""
        if "optimizer" not in self.staged:
            return {}
        return {
            "param_groups": self.staged["optimizer"]["param_groups"],
            "state": {
                name: {key: value for key, value in staged.items() if key not in keys}
                for name, _, keys, staged in self._refreshed
            },
        }


def _room(state: dict[str, Any], local: Callable[[torch.Tensor], torch.Tensor]) -> int:
    """Bytes enough for the staged buffers of ``state`` (DCP's: the module's tensors, the
    optimizer's state tensors; ``local``: a DTensor's shard)."""
    tensors = [value for value in state["module"].values() if isinstance(value, torch.Tensor)]
    for per in state.get("optimizer", {}).get("state", {}).values():
        tensors += [value for value in per.values() if isinstance(value, torch.Tensor)]
    return sum(room(local(tensor)) for tensor in tensors)


def _copied(value: Any) -> Any:
    """``value`` with its containers rebuilt and its tensors cloned (the optimizer's
    hyperparameters: the training may change them while the copy is written)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {key: _copied(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copied(item) for item in value]
    return copy.deepcopy(value)


class ShardedWriter:
    """``async_save=True`` for sharded checkpoints. ``submit``, on the training thread,
    copies this process's shards of the state into CPU buffers kept from one save to the
    next (``StagingPlan``: DCP's ``get_state_dict`` resolved once, then one batched copy a
    save; no ``state_dict()`` is built), laid out in one shared-memory file, and checks
    the parameters finite on the way (every process, all-reduced on the checkpoint group:
    the processes refuse together, before anything is written). Then a writer process of
    this process (``process.serve``: one per process of the run, started at the first
    save, a gloo group of their own) writes the copy: the run state, DCP's ``save`` of the
    shards, the processes' agreement, and on rank 0 the rename that makes the folder
    visible. It rebuilds the staged state over the shared file once; a save sends it only
    where to write, the run state and the optimizer's values that are not tensors, so no
    DCP planning or pickling of the state runs in the training process (it would hold the
    GIL that training waits for). A thread of the training process waits for the writer
    process's answer, then calls ``then`` (rank 0). The training waits for the copy alone.

    Same interface as ``writer.Writer``: ``submit`` waits for the write before; ``wait``
    waits for the one under way and raises its error, naming the folder (a full disk as
    one ``DiskFullError``, a writer process that died as a ``RuntimeError``). After a
    failed write, or where a writer process died, the next ``submit`` starts a new writer
    process on every process. A writer process dies with its training process (Linux).
    (DCP's own ``async_save`` stages each DTensor anew, through DTensor's dispatch: in one
    process, a state of 4,096 tensors, 204 MB, took 267 ms, 10 times a bare copy of its
    bytes.)"""

    #: ``submit`` refuses parameters that hold NaN or inf itself (``FloatingPointError``,
    #: on every process), from its copy: the ``Checkpoint`` pack need not check them first
    checks_finite = True
    floor_s: float | None = None  # (not measured: the plain writer's)
    #: the model's state is DCP's, which ``submit`` takes from its run's model itself
    writes_model_state = False

    def __init__(self, sharded: Sharded) -> None:
        self.sharded = sharded
        self._plan: StagingPlan | None = None
        self._process: WriterProcess | None = None
        self._failed = False  # the last write failed: the writer processes start anew
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
        module: Any = None,  # (its run's own module is the one checked)
        model_parts: Any = None,  # (its run's own model's state is the one written)
    ) -> None:
        self.wait()
        path = self._path = Path(path)
        run_state = io.BytesIO()  # (torch.save's pickling: a run state may hold storages)
        torch.save(_run_state(snapshot, self.sharded), run_state)
        plan = self._plan
        if plan is None or plan.stage() is None:  # the first save, or the state changed:
            plan = self._plan = StagingPlan(self.sharded, plan)  # planned (and copied) anew
            plan.copy()
        ready = self._process is not None and self._process.alive and not self._failed
        if not self._agree(path, ready):
            self._start()
            plan.sent = False
        assert self._process is not None
        message: dict[str, Any] = {
            "path": str(path),
            "staging": str(_staging(path, self.sharded)),
            "run_state": run_state.getvalue(),
            "values": plan.values(),
        }
        if not plan.sent:
            message["layout"] = plan.layout()
            plan.sent = True
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)  # (a copy: small)
        self._done = threading.Thread(
            target=self._run,
            args=(self._process, data, then),
            name=f"runmodel sharded checkpoint {path.name}",
            daemon=True,
        )
        self._done.start()

    def _agree(self, path: Path, ready: bool) -> bool:
        """Whether every process's writer process is ready (one all-reduce on the
        checkpoint group, with the verdicts on the copy); raise ``FloatingPointError`` on
        every process where any process's parameters hold NaN or inf."""
        import torch.distributed as dist

        assert self._plan is not None
        # the group is gloo: a CPU tensor
        verdicts = torch.tensor([int(self._plan.finite), int(ready)], dtype=torch.int32)
        dist.all_reduce(verdicts, op=dist.ReduceOp.MIN, group=self.sharded.group)
        finite, everyone_ready = map(bool, verdicts.tolist())
        if finite:
            return everyone_ready
        bad = self._plan.nonfinite()
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        shown = (
            "parameters " + ", ".join(bad[:5]) + more
            if bad
            else "parameters of another process's shards"
        )
        raise FloatingPointError(
            f"not saving the checkpoint {path.name}: {shown} hold NaN or inf (the training "
            f"diverged), and the checkpoints before it are kept. Attach "
            f"runmodel.packs.NaNGuard() to skip (or stop at) the steps whose loss or "
            f"gradients are not finite, or lower the learning rate, and resume from the "
            f"last good checkpoint"
        )

    def _start(self) -> None:
        """Start a writer process on every process (collective on the checkpoint group):
        rank 0 picks the port of their group's store, and tells the others."""
        import torch.distributed as dist

        if self._process is not None:
            self._process.stop()
            self._process = None
        sharded = self.sharded
        where = [free_port() if sharded.rank == 0 else None]
        dist.broadcast_object_list(where, group=sharded.group, group_src=0)
        assert where[0] is not None
        address, port = where[0]
        self._process = WriterProcess(address, port, sharded.rank, sharded.world, sharded.timeout)
        self._failed = False

    def _run(self, process: WriterProcess, data: bytes, then: Callable[[], None] | None) -> None:
        try:
            process.write(data)
        except BaseException as error:  # raised on the training thread by wait()
            self._error, self._failed = error, True
            return
        try:
            if then is not None and self.sharded.rank == 0:
                then()
        except BaseException as error:
            self._error = error

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

"""Loading a sharded checkpoint, in as many processes as wrote it or in another number.

A folder resumes in as many processes as wrote it, or in another number under ``fsdp``
(DCP reshards; rank r takes saved rank r mod N's run state), or whole in one process or
under ``ddp`` (the optimizer's state numbered again by parameter order); a plain file
resumes under ``fsdp`` too, every process keeping its shards (``docs/distributed.md``,
"Resuming in another number of processes"). Everything is read through ``SafeReader``:
loading never runs code.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from ..format import check_same_optimizer, remove_stale_in
from ..format import read as read_file
from ..names import RUN_STATE, first_readable, is_sharded, saved_world
from .safe_reader import checked_reader
from .saving import Sharded

__all__ = ["FullModelState", "ShardedModelState", "load", "read", "read_whole"]


def load(
    path: str | os.PathLike[str], model: Any = None, sharded: Sharded | None = None
) -> tuple[Path, dict[str, Any]]:
    """The checkpoint at ``path`` (a checkpoint file, a sharded checkpoint folder, or a
    folder of them: its newest readable one) as a snapshot to restore into ``model``,
    this run sharded as ``sharded`` (the fsdp backend's) or not (None). Its model part
    is read where the engine restores it: a sharded folder's by every process (its own
    shards under fsdp, the whole state otherwise); a plain file's under fsdp by every
    process whole, each keeping its shards. What saves killed mid-write left in the
    folder goes first."""
    remove_stale_in(path)
    found, snapshot = first_readable(path, read_any)
    state = snapshot.get("model")
    if isinstance(state, ShardedModelState):
        state.sharded = sharded
    elif sharded is not None and isinstance(state, dict):
        snapshot["model"] = FullModelState(state)
    packs = snapshot.get("engine", {}).get("packs")
    if model is not None and isinstance(packs, dict):
        _to_own_backend(packs, model, sharded)
    return found, snapshot


def read_any(path: Path) -> dict[str, Any]:
    """The snapshot of a checkpoint file or a sharded checkpoint folder."""
    return read(path) if is_sharded(path) else read_file(path)


def _to_own_backend(packs: dict[str, Any], model: Any, sharded: Sharded | None) -> None:
    """The data-parallel backend's pack state (its sampler's seed) goes to this run's
    backend's pack: a ``ddp`` checkpoint's under ``fsdp``, and the other way; a run in
    one process has no sampler to give it to (the resume's line says the data differ)."""
    from torch.nn.parallel import DistributedDataParallel

    own = (
        "fsdp"
        if sharded is not None
        else "ddp"
        if isinstance(getattr(model, "module", None), DistributedDataParallel)
        else None
    )
    for key in ("ddp", "fsdp"):
        if key != own and key in packs:
            state = packs.pop(key)
            if own is not None and own not in packs:
                packs[own] = state


def read(folder: str | os.PathLike[str], rank: int | None = None) -> dict[str, Any]:
    """This process's snapshot from the sharded checkpoint ``folder``: its run state,
    and the model's part to load into the model. In another number of processes than
    wrote it, rank r takes the run state (random generators, packs' state) of saved
    rank r mod N; the engine's resume check says so, or refuses a checkpoint taken
    mid-epoch."""
    import torch.distributed as dist

    folder = Path(folder)
    if rank is None:
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    saved = saved_world(folder)
    if saved == 0:
        raise ValueError(f"{str(folder)!r} holds no run state ({RUN_STATE.format(rank=0)})")
    state = read_file(folder / RUN_STATE.format(rank=rank % saved))
    state.pop("world_size", None)
    run = state.get("engine", {}).get("run")
    if isinstance(run, dict):  # what the resume check compares the run's size with
        run["world_size"], run["sharded"] = saved, True
    state["model"] = ShardedModelState(folder, state.pop("optimizer_layout", None))
    return state


class ShardedModelState:
    """A sharded checkpoint's model part, loaded into the model where the engine restores
    it (after the setup hooks). Under ``fsdp`` (``sharded`` given) every process reads
    its own shards (collective), in as many processes as wrote it or another number:
    DCP reshards. Otherwise (one process, ``ddp``) every process reads the whole state
    and loads it as a plain checkpoint's, the optimizer's state numbered again by
    parameter order. ``layout``: the optimizer's class and group sizes the save
    recorded (checked first)."""

    def __init__(
        self, folder: Path, layout: dict[str, Any] | None = None, sharded: Sharded | None = None
    ) -> None:
        self.folder, self.layout, self.sharded = folder, layout or {}, sharded

    def restore_into(self, model: Any) -> None:
        import torch.distributed.checkpoint as dcp

        sharded, optimizer = self.sharded, getattr(model, "optimizer", None)
        if sharded is None:
            self._restore_whole(model)
            return
        if isinstance(optimizer, torch.optim.Optimizer):
            groups = self.layout.get("groups")
            _check_optimizer(
                model,
                optimizer,
                {
                    "optimizer_class": self.layout.get("class"),
                    "optimizer": {
                        "param_groups": [
                            {"params": range(n)}
                            for n in (
                                groups
                                if groups is not None
                                else [len(g["params"]) for g in optimizer.param_groups]
                            )
                        ]
                    },
                },
            )
        state = sharded.state()
        dcp.load(state, storage_reader=checked_reader(self.folder), process_group=sharded.group)
        sharded.set_state(state)

    def _restore_whole(self, model: Any) -> None:
        optimizer = getattr(model, "optimizer", None)
        whole = read_whole(self.folder, optimizer=optimizer is not None)
        saved = whole.get("optimizer")
        model.load_state_dict(
            {
                "module": whole["module"],
                "optimizer": None if saved is None else _by_number(saved),
                "optimizer_class": self.layout.get("class"),
            }
        )

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
            set_optimizer_state_dict(
                module, optimizer, _by_name(saved, module, optimizer), options=options
            )


def _check_optimizer(model: Any, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """The plain resume's check (``TorchModel.load_state_dict``): the same optimizer
    class and parameter-group layout, or an error naming both."""
    check_same_optimizer(optimizer, state, type(model).__name__)


def _by_name(saved: dict[str, Any], module: Any, optimizer: Any) -> dict[str, Any]:
    """An optimizer state dict keyed by parameter number, keyed by parameter name."""
    names = {id(p): n for n, p in module.named_parameters()}
    groups = saved.get("param_groups", [])
    if len(groups) != len(optimizer.param_groups) or any(
        len(g["params"]) != len(o["params"])
        for g, o in zip(groups, optimizer.param_groups, strict=True)
    ):
        raise ValueError(
            "the checkpoint's optimizer has other parameter groups than this "
            "run's optimizer: it cannot be loaded into the sharded one"
        )
    fqn = {
        number: names[id(p)]
        for g, o in zip(groups, optimizer.param_groups, strict=True)
        for number, p in zip(g["params"], o["params"], strict=True)
    }
    return {
        "state": {fqn[number]: state for number, state in saved.get("state", {}).items()},
        "param_groups": [{**g, "params": [fqn[n] for n in g["params"]]} for g in groups],
    }


def _by_number(saved: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state dict keyed by parameter name (DCP's), keyed by parameter
    number as ``Optimizer.state_dict`` numbers them: in group order."""
    groups = saved.get("param_groups", [])
    number = {name: i for i, name in enumerate(n for g in groups for n in g["params"])}
    return {
        "state": {number[name]: state for name, state in saved.get("state", {}).items()},
        "param_groups": [{**g, "params": [number[n] for n in g["params"]]} for g in groups],
    }


def read_whole(folder: str | os.PathLike[str], optimizer: bool = True) -> dict[str, Any]:
    """The full model state dict (every tensor whole, on the CPU) and, with
    ``optimizer``, the optimizer's (keyed by parameter name) from a sharded checkpoint,
    read in this one process, without a process group."""
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    reader = checked_reader(folder)
    keys = {"module"}
    if optimizer and any(
        k.startswith("optimizer.") or k == "optimizer"
        for k in reader.read_metadata().state_dict_metadata
    ):
        keys.add("optimizer")
    state: dict[str, Any] = {}
    _load_state_dict(
        state, storage_reader=reader, planner=_EmptyStateDictLoadPlanner(keys=keys), no_dist=True
    )
    if not isinstance(state.get("module"), dict):
        raise ValueError(f"{str(folder)!r} holds no model weights")
    return {key: _full_tensors(value) for key, value in state.items()}


def _full_tensors(value: Any) -> Any:
    """``value`` with each sharded tensor in it gathered whole (``full_tensor``)."""
    if isinstance(value, dict):
        return {key: _full_tensors(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_full_tensors(item) for item in value]
    return value.full_tensor() if hasattr(value, "full_tensor") else value

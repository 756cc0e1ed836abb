"""Fully sharded data parallel training (FSDP2: ``torch.distributed.fsdp.fully_shard``) in
processes started by torchrun (``backend="fsdp"``; ``runmodel run SOURCE
--nproc-per-node N --backend fsdp``).

The process group, the data dealt out, the end agreement and the teardown are the ``ddp``
backend's (``ddp.py``); what differs:

- the module is sharded in place: each shard unit (by default every direct child that
  holds parameters, then the root) keeps 1/N of its parameters on each process and
  all-gathers them for its forward and backward; ``fully_shard`` cannot be undone, so the
  module stays sharded after the run (the process group lives on with it), and a later
  run of the same module (an evaluation) takes it as it is;
- the optimizer is made again over the sharded parameters, with its class, parameter
  groups and hyperparameters (and an LR scheduler in the model's attributes follows it);
- every forward is a collective, so evaluation pads the processes' uneven shares of the
  eval data with forwards whose outputs no metric sees;
- checkpoints are sharded: the run's checkpoint storage (``storage()``) is a
  ``runmodel.checkpoint.sharded.ShardedStorage``, every process writing its shard, with
  collectives on a gloo group of their own, made once and kept for the process's runs.
"""

from __future__ import annotations

import inspect
import secrets
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from ...checkpoint.sharded import Sharded, ShardedStorage
from . import env
from .data import EvalShard, remade, shard_eval_data
from .ddp import DDP, DistributedRun
from .options import FSDPOptions

__all__ = ["FSDP", "PaddedEval", "rebuild_optimizer"]


class FSDP(DDP):
    """Fully sharded data parallel training over the processes torchrun started.

    ``units`` chooses the shard units: None (each direct child of the module that holds
    parameters, then the root), or names of module classes (``"TransformerBlock"``) or
    of submodules (``"encoder.layers.0"``), or classes; the root is always one.
    ``reshard_after_forward`` frees the gathered parameters after each unit's forward
    (less memory, one more all-gather in backward). ``param_dtype``/``reduce_dtype``
    (``"bfloat16"``, ``"float16"``, ``"float32"`` or a torch dtype) make a
    ``MixedPrecisionPolicy``; ``cpu_offload=True`` keeps the shards on the CPU
    (``CPUOffloadPolicy``). ``checkpoint_timeout`` (seconds) bounds every collective of
    a checkpoint save or load, which run on a process group of their own. The other
    options are ``DDP``'s. The options are declared and checked in ``options.py``
    (``FSDPOptions``, ``DDPOptions``).
    """

    backend_name = "fsdp"

    def __init__(
        self,
        units: Sequence[str | type] | str | type | None = None,
        reshard_after_forward: bool = True,
        param_dtype: Any = None,
        reduce_dtype: Any = None,
        cpu_offload: bool = False,
        process_group: str | None = None,
        timeout: float | None = None,
        seed: int | None = None,
        shard_data: bool = True,
        end_timeout: float = 60.0,
        checkpoint_timeout: float = 600.0,
        **options: Any,
    ) -> None:
        super().__init__(
            process_group=process_group,
            timeout=timeout,
            seed=seed,
            shard_data=shard_data,
            end_timeout=end_timeout,
            **options,
        )
        checked = FSDPOptions(
            units=units,
            reshard_after_forward=reshard_after_forward,
            param_dtype=param_dtype,
            reduce_dtype=reduce_dtype,
            cpu_offload=cpu_offload,
            checkpoint_timeout=checkpoint_timeout,
        )
        # a list by now (FSDPOptions makes one of a single unit)
        self.units = cast("list[str | type] | None", checked.units)
        self.reshard_after_forward = checked.reshard_after_forward
        self.cpu_offload = checked.cpu_offload
        self.param_dtype: torch.dtype | None = checked.param_dtype
        self.reduce_dtype: torch.dtype | None = checked.reduce_dtype
        self.checkpoint_timeout = checked.checkpoint_timeout
        self._storage: ShardedStorage | None = None

    def storage(self) -> ShardedStorage | None:
        """The run's sharded checkpoints (made by ``initialize``)."""
        return self._storage

    def _run(self, model: Any, module: torch.nn.Module) -> DistributedRun:
        return ShardedRun(model, module, self.end_timeout, self.preempt_check_every)

    def _wrap(self, model: Any, inner: torch.nn.Module, device: torch.device) -> None:
        from torch.distributed.fsdp import (
            CPUOffloadPolicy,
            FSDPModule,
            MixedPrecisionPolicy,
            OffloadPolicy,
            fully_shard,
        )

        # fully_shard cannot be undone: a module an earlier run sharded is taken as it is,
        # with the optimizer model.setup() made over its sharded parameters
        sharded_before = isinstance(inner, FSDPModule)
        names = {id(p): name for name, p in inner.named_parameters()}
        options: dict[str, Any] = {
            "reshard_after_forward": self.reshard_after_forward,
            "mp_policy": MixedPrecisionPolicy(
                param_dtype=self.param_dtype, reduce_dtype=self.reduce_dtype
            ),
            "offload_policy": CPUOffloadPolicy() if self.cpu_offload else OffloadPolicy(),
        }
        if not sharded_before:
            for unit in shard_units(inner, self.units):
                fully_shard(unit, **options)
            fully_shard(inner, **options)  # in place: the module keeps its identity
        model.module = inner
        optimizer = getattr(model, "optimizer", None)
        if isinstance(optimizer, torch.optim.Optimizer) and not sharded_before:
            model.optimizer = rebuild_optimizer(optimizer, names, inner)
            follow_schedulers(model, optimizer, model.optimizer)
        # checkpoints' collectives get a group of their own (an async save's run beside
        # training's), bounded by checkpoint_timeout, made once for the process's runs; a
        # token names this run's staging folders
        group = env.gloo_group("checkpoint", self.checkpoint_timeout)
        token = str(env.broadcast_from_0(secrets.token_hex(4)))
        sharded = Sharded(
            model, group, dist.get_rank(), dist.get_world_size(), token, self.checkpoint_timeout
        )
        self._storage = ShardedStorage(sharded)
        assert isinstance(self._pack, ShardedRun)
        self._pack.sharded = sharded


class ShardedRun(DistributedRun):
    """The ``fsdp`` backend's part of a run: the ``ddp`` backend's, with the processes'
    agreement first in teardown (a final save is collective, so it comes after), eval
    data padded to as many forwards on every process, and the module left sharded."""

    name = "fsdp"

    def __init__(
        self, model: Any, module: torch.nn.Module, end_timeout: float = 60.0, check_every: int = 10
    ) -> None:
        super().__init__(model, module, end_timeout, check_every)
        self.sharded: Sharded | None = None

    def shard(self, seed: int | None) -> None:
        super().shard(seed)
        if "eval_data" in self.dealer.data:
            self.model.eval_data = padded_eval_data(
                self.model, self.dealer.data["eval_data"], env.rank(), env.world_size()
            )

    def agree(self, engine: Any) -> None:
        try:
            super().agree(engine)
        except BaseException:
            if self.sharded is not None:  # no collective save at the end
                self.sharded.ended_together = False
            raise
        if (
            engine.state.error is not None
            and not self.stopped_together(engine)
            and (self.sharded is not None)
        ):
            self.sharded.ended_together = False

    def restore(self) -> None:
        if self.sharded is not None:  # the run's view of the group goes (the group stays)
            self.sharded.group, self.sharded = None, None
        self.module = self.model.module  # sharded for good: fully_shard cannot be undone
        super().restore()


# -- shard units -----------------------------------------------------------------------------


def shard_units(module: torch.nn.Module, units: list[str | type] | None) -> list[torch.nn.Module]:
    """The submodules to shard one by one, innermost first (the root comes after them)."""
    if units is None:
        return [child for child in module.children() if next(child.parameters(), None) is not None]
    named = dict(module.named_modules())
    chosen: list[torch.nn.Module] = []
    for unit in units:
        found: list[torch.nn.Module]
        if isinstance(unit, type):
            found = [m for n, m in named.items() if n and issubclass(type(m), unit)]
        elif unit in named and unit:
            found = [named[unit]]
        else:
            found = [m for n, m in named.items() if n and type(m).__name__ == unit]
        if not found:
            classes = sorted({type(m).__name__ for m in named.values()})
            raise ValueError(
                f"FSDP(units=): {unit!r} names no submodule of "
                f"{type(module).__name__}, by class or by name; its classes: "
                f"{', '.join(classes)}; its children: "
                f"{', '.join(n for n, _ in module.named_children())}"
            )
        chosen += [m for m in found if all(m is not c for c in chosen)]
    depth = {id(m): n.count(".") for n, m in named.items()}
    return sorted(chosen, key=lambda m: -depth[id(m)])  # a unit inside another first


# -- the optimizer -----------------------------------------------------------------------------


def rebuild_optimizer(
    old: torch.optim.Optimizer, names: dict[int, str], module: torch.nn.Module
) -> torch.optim.Optimizer:
    """``old``'s class, parameter groups and hyperparameters, over ``module``'s
    parameters as they are now (``names``: each old parameter's name in the module)."""
    if old.state:
        raise ValueError(
            f"the fsdp backend makes the optimizer again over the sharded "
            f"parameters, and {type(old).__name__} has state already (it "
            f"stepped, or loaded a state dict in setup()); load state by "
            f"resuming from a checkpoint instead"
        )
    params = dict(module.named_parameters())
    groups = []
    for group in old.param_groups:
        missing = [p for p in group["params"] if id(p) not in names]
        if missing:
            raise ValueError(
                f"the optimizer holds {len(missing)} parameter(s) that are not "
                f"the module's; under fsdp it can only optimize the module's "
                f"own parameters (found by name after sharding)"
            )
        groups.append(
            {
                **{k: v for k, v in group.items() if k != "params"},
                "params": [params[names[id(p)]] for p in group["params"]],
            }
        )
    accepted = inspect.signature(type(old).__init__).parameters
    defaults = {k: v for k, v in old.defaults.items() if k in accepted}
    try:
        return type(old)(groups, **defaults)
    except TypeError as error:
        raise TypeError(
            f"the fsdp backend makes the optimizer again over the sharded "
            f"parameters as {type(old).__name__}(param_groups, **defaults), "
            f"which failed: {error}; give the backend an optimizer factory "
            f"(FSDP(optimizer=...))"
        ) from None


def follow_schedulers(model: Any, old: torch.optim.Optimizer, new: torch.optim.Optimizer) -> None:
    """LR schedulers among the model's attributes that drive ``old`` drive ``new``
    now (their learning rates are in the groups ``new`` copied)."""
    from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

    for value in list(vars(model).values()):
        if isinstance(value, (LRScheduler, ReduceLROnPlateau)) and value.optimizer is old:
            value.optimizer = new
            if isinstance(value, LRScheduler):
                _mark_step_tracked(new)


def _mark_step_tracked(optimizer: torch.optim.Optimizer) -> None:
    """What an LR scheduler does to its optimizer's ``step`` on construction, so that
    its first ``step()`` does not warn that the optimizer's step was replaced."""
    step = optimizer.step
    if hasattr(step, "_wrapped_by_lr_sched"):
        return

    def tracked(*args: Any, **kwargs: Any) -> Any:
        optimizer._opt_called = True  # type: ignore[attr-defined]
        return step(*args, **kwargs)

    tracked._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    optimizer.step = tracked  # type: ignore[method-assign]


# -- evaluation --------------------------------------------------------------------------------


class PaddedEval:
    """One process's share of the eval data, then as many forwards on a stand-in batch
    as the process with the most batches runs more: every forward all-gathers, so every
    process must run as many. The stand-in's outputs go to no metric (they are never
    yielded), so the metrics are those of the whole eval set, each sample once."""

    def __init__(
        self, data: Iterable[Any], batches: int, most: int, model: Any, stand_in: Any
    ) -> None:
        self.data, self.batches, self.most = data, batches, most
        self.model, self.stand_in = model, stand_in

    def __len__(self) -> int:
        return self.batches

    def __iter__(self) -> Iterator[Any]:
        yield from self.data
        missing = self.most - self.batches
        if missing > 0:
            model = self.model
            batch = self.stand_in
            if getattr(model, "device", None) is not None and hasattr(model, "to_device"):
                batch = model.to_device(batch)
            forward = model.interface.output_fn(model)
            with torch.no_grad():
                for _ in range(missing):
                    forward(batch)


def padded_eval_data(model: Any, data: Any, rank: int, world: int) -> Any:
    """``data`` dealt out as the ``ddp`` backend does (each sample once), padded with
    forwards to as many batches on every process."""
    share = shard_eval_data(data, rank, world)
    if isinstance(data, DataLoader) and share is not data:
        most = len(remade(data, EvalShard(len(data.dataset), 0, world)))  # type: ignore[arg-type]
        stand_in = data.collate_fn([data.dataset[0]])
    elif isinstance(data, (list, tuple)) and data:
        most, stand_in = len(data[0::world]), data[0]
    else:
        if not isinstance(data, DataLoader):
            warnings.warn(
                f"the fsdp backend cannot tell how many eval batches each process "
                f"has in {type(data).__name__}: every process must run as many "
                f"(each forward all-gathers the parameters)",
                stacklevel=3,
            )
        return share
    return PaddedEval(share, len(share), most, model, stand_in)

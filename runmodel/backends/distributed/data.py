"""Dealing a run's data out to the processes of a distributed run.

Training data: a ``DataLoader`` is made again with the settings it was made with but a
``DealingSampler`` (a ``DistributedSampler``: one seed for every process, padded so that
every process runs as many steps); a list of batches is dealt out batch by batch
(``DealtBatches``); eval data: every sample exactly once over all the processes, without
padding, so that metrics (pytorch-ignite's, which add up across the processes) are those
of the whole set. What cannot be dealt out is an error here, at the start of the run.

An epoch begun in another number of processes (a run resumed in the middle of an epoch
from a checkpoint of N processes, in M): what the N processes drew of the epoch is a
prefix of its (padded) order, since process r draws positions r, r + N, r + 2N...; the
rest is dealt out over the M processes, padded by the ``DistributedSampler`` rule
(``deal_rest``). Each process's data for that epoch begins with as many stand-in items
as it is counted to have drawn already, which the engine's resume skips without loading
(``core/position.py``), so its position in the epoch stays its count of steps.
"""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
)

__all__ = [
    "Chain",
    "DealingSampler",
    "DealtBatches",
    "EvalShard",
    "deal_rest",
    "padded",
    "remade",
    "shard_eval_data",
    "shard_train_data",
]

#: An epoch dealt out in pieces: ``[world, count]`` for each part of it that ran in one
#: number of processes (``count``: what each process drew of it, samples or batches),
#: in order; the part under way is not in it.
Chain = list[list[int]]

#: DataLoader arguments that are not copied to the loader made again.
_NOT_COPIED = frozenset({"self", "dataset", "shuffle", "sampler", "batch_sampler"})


def shard_train_data(data: Any, rank: int, world: int, seed: int) -> Any:
    """This process's part of training ``data``: a DataLoader made again with a
    ``DealingSampler`` (shuffled if it was; padded so that every process runs as many
    steps), one with a DistributedSampler as it is, a list of batches dealt out
    (``DealtBatches``: as many to each process; the rest dropped, with a warning),
    anything else as it is (with a warning: every process would read all of it)."""
    if isinstance(data, DataLoader):
        if isinstance(data.sampler, DistributedSampler):
            return data  # dealt out already
        shuffle = _was_shuffled(data, "training")
        sampler = DealingSampler(
            data.dataset, num_replicas=world, rank=rank, shuffle=shuffle, seed=seed
        )
        return remade(data, sampler)
    if isinstance(data, (list, tuple)):
        per_rank = len(data) // world
        if per_rank * world != len(data):
            warnings.warn(
                f"the ddp backend deals {len(data)} training batches out to {world} "
                f"processes: the last {len(data) - per_rank * world} are left out, "
                f"so that every process runs as many steps",
                stacklevel=3,
            )
        return DealtBatches(data, rank, world)
    warnings.warn(
        f"the ddp backend cannot deal out training data of type "
        f"{type(data).__name__}: every process reads all of it; give a DataLoader "
        f"over a map-style dataset, a list of batches, or data that reads this "
        f"process's part (torch.distributed.get_rank()) with DDP(shard_data=False)",
        stacklevel=3,
    )
    return data


def shard_eval_data(data: Any, rank: int, world: int) -> Any:
    """This process's part of eval ``data``, every sample exactly once over all the
    processes (no padding: metrics add up to those of the whole set): a DataLoader made
    again with every ``world``-th sample from ``rank`` on, a list of batches dealt out;
    anything else as it is."""
    if isinstance(data, DataLoader):
        if isinstance(data.sampler, DistributedSampler):
            return data
        _was_shuffled(data, "eval")  # checks it can be dealt out
        return remade(data, EvalShard(len(data.dataset), rank, world))  # type: ignore[arg-type]
    if isinstance(data, (list, tuple)):
        return type(data)(data[rank::world])
    return data


# -- an epoch dealt out anew -------------------------------------------------------------------


def padded(order: list[Any], world: int, drop_last: bool = False) -> list[Any]:
    """``order`` made a whole number of rounds of ``world`` by the ``DistributedSampler``
    rule: repeated from its start (``drop_last``: cut to the last whole round)."""
    if not order:
        return []
    if drop_last and len(order) % world:
        return order[: (len(order) // world) * world]
    total = math.ceil(len(order) / world) * world
    missing = total - len(order)
    return order + (order * math.ceil(missing / len(order)))[:missing]


def deal_rest(
    order: list[Any], chain: Chain, world: int, rank: int, drop_last: bool = False
) -> tuple[int, list[Any]]:
    """Process ``rank`` of ``world``'s share of what is left of an epoch whose (padded)
    ``order`` was dealt out in the parts of ``chain``: each part's processes drew the
    first ``world * count`` items of what was left (process r: positions r, r + world,
    ...), and the rest is padded for the next part. Returns what each process drew before
    (its count of items) and this process's share of the rest."""
    if not chain:
        return 0, padded(order, world, drop_last)[rank::world]
    dealt = padded(order, chain[0][0], drop_last)
    for i, (part_world, count) in enumerate(chain):
        after = chain[i + 1][0] if i + 1 < len(chain) else world
        dealt = padded(dealt[part_world * count :], after, drop_last)
    return sum(count for _, count in chain), dealt[rank::world]


class DealingSampler(DistributedSampler[int]):
    """The ``DistributedSampler`` the backend gives a training ``DataLoader`` it makes
    again: the same order, and, for an epoch begun in another number of processes, the
    rest of it (``deal``): this process's share of the positions not drawn yet, after as
    many stand-in indices as it is counted to have drawn (never loaded: the resume skips
    them)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._rest: tuple[int, list[int]] | None = None  # (epoch, this epoch's indices)

    def order(self) -> list[int]:
        """The epoch's order before padding, as ``DistributedSampler`` draws it."""
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            return torch.randperm(len(self.dataset), generator=g).tolist()  # type: ignore[arg-type]
        return list(range(len(self.dataset)))  # type: ignore[arg-type]

    def deal(self, chain: Chain) -> None:
        """This epoch (``set_epoch`` first) was dealt out in the parts of ``chain`` before:
        yield the rest of it (``deal_rest``), once; the next epoch is dealt as ever."""
        drawn, share = deal_rest(self.order(), chain, self.num_replicas, self.rank, self.drop_last)
        stand_in = share[0] if share else 0
        self._rest = (self.epoch, [stand_in] * drawn + share)

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        if self._rest is not None and self._rest[0] != epoch:
            self._rest = None

    def __iter__(self) -> Iterator[int]:
        if self._rest is not None and self._rest[0] == self.epoch:
            return iter(self._rest[1])
        return super().__iter__()

    def __len__(self) -> int:
        if self._rest is not None and self._rest[0] == self.epoch:
            return len(self._rest[1])
        return self.num_samples


class DealtBatches(list[Any]):
    """This process's batches of a list of batches dealt out (every ``world``-th from
    ``rank`` on, as many to each process), and, for an epoch begun in another number of
    processes, the rest of it (``deal``), once: after as many stand-in batches as this
    process is counted to have drawn (the engine's resume drops them: the batches are in
    memory, nothing is loaded)."""

    def __init__(self, batches: Sequence[Any], rank: int, world: int) -> None:
        per_rank = len(batches) // world
        super().__init__(batches[rank : per_rank * world : world])
        self.all, self.rank, self.world = list(batches[: per_rank * world]), rank, world
        self._rest: list[Any] | None = None

    def deal(self, chain: Chain) -> None:
        drawn, share = deal_rest(self.all, chain, self.world, self.rank)
        stand_in = share[0] if share else (self.all[0] if self.all else None)
        self._rest = [stand_in] * drawn + share

    def dealt_as_ever(self) -> None:
        """The epoch dealt anew is over: the next ones are dealt as ever."""
        self._rest = None

    def __iter__(self) -> Iterator[Any]:
        if self._rest is not None:
            return iter(self._rest)
        return super().__iter__()

    def __len__(self) -> int:
        return len(self._rest) if self._rest is not None else super().__len__()


class EvalShard(Sampler[int]):
    """Every ``world``-th index of ``range(size)`` from ``rank`` on, in order: the
    processes' parts differ by one sample at most, and nothing is repeated."""

    def __init__(self, size: int, rank: int, world: int) -> None:
        self.indices = range(rank, size, world)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def remade(loader: DataLoader[Any], sampler: Sampler[Any]) -> DataLoader[Any]:
    """``loader`` made again with every setting it was made with, and ``sampler``."""
    settings = {
        name: getattr(loader, name)
        for name in _loader_arguments()
        if name not in _NOT_COPIED and hasattr(loader, name)
    }
    return DataLoader(loader.dataset, sampler=sampler, **settings)


def _was_shuffled(loader: DataLoader[Any], what: str) -> bool:
    """Whether ``loader`` shuffles; a loader that cannot be dealt out is an error here."""
    if isinstance(loader.dataset, IterableDataset):
        raise TypeError(
            f"the ddp backend cannot deal out {what} data from an "
            f"IterableDataset ({type(loader.dataset).__name__}); have it yield "
            f"this process's part (torch.distributed.get_rank()) and use "
            f"DDP(shard_data=False)"
        )
    if type(loader).__init__ is not DataLoader.__init__:
        raise TypeError(
            f"the ddp backend makes the {what} DataLoader again with a "
            f"DistributedSampler, and {type(loader).__name__} has its own "
            f"__init__; give a plain DataLoader, or one with a DistributedSampler"
        )
    batch_sampler = loader.batch_sampler
    if batch_sampler is not None and type(batch_sampler) is not BatchSampler:
        raise TypeError(
            f"the {what} DataLoader has its own batch_sampler "
            f"({type(batch_sampler).__name__}), which the ddp backend cannot deal "
            f"out; give it a DistributedSampler yourself, or DDP(shard_data=False)"
        )
    sampler = loader.sampler
    if isinstance(sampler, RandomSampler):
        if sampler.replacement or sampler._num_samples is not None:
            raise TypeError(
                f"the {what} DataLoader's RandomSampler draws with replacement or "
                f"a set number of samples, which a DistributedSampler cannot; "
                f"give it a DistributedSampler yourself, or DDP(shard_data=False)"
            )
        return True
    if isinstance(sampler, SequentialSampler):
        return False
    raise TypeError(
        f"the {what} DataLoader has its own sampler ({type(sampler).__name__}), "
        f"which the ddp backend cannot deal out; give it a DistributedSampler "
        f"yourself, or DDP(shard_data=False)"
    )


def _loader_arguments() -> Sequence[str]:
    return list(inspect.signature(DataLoader.__init__).parameters)

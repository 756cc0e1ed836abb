"""Dealing a run's data out to the processes of a distributed run.

Training data: a ``DataLoader`` is made again with the settings it was made with but a
``DistributedSampler`` (one seed for every process, padded so that every process runs as
many steps); eval data: every sample exactly once over all the processes, without
padding, so that metrics (pytorch-ignite's, which add up across the processes) are those
of the whole set. What cannot be dealt out is an error here, at the start of the run.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
)

__all__ = ["EvalShard", "remade", "shard_eval_data", "shard_train_data"]

#: DataLoader arguments that are not copied to the loader made again.
_NOT_COPIED = frozenset({"self", "dataset", "shuffle", "sampler", "batch_sampler"})


def shard_train_data(data: Any, rank: int, world: int, seed: int) -> Any:
    """This process's part of training ``data``: a DataLoader made again with a
    ``DistributedSampler`` (shuffled if it was; padded so that every process runs as
    many steps), one with a DistributedSampler as it is, a list of batches dealt out
    (as many to each process; the rest dropped, with a warning), anything else as it is
    (with a warning: every process would read all of it)."""
    if isinstance(data, DataLoader):
        if isinstance(data.sampler, DistributedSampler):
            return data  # dealt out already
        shuffle = _was_shuffled(data, "training")
        sampler: DistributedSampler[Any] = DistributedSampler(
            data.dataset, num_replicas=world, rank=rank, shuffle=shuffle, seed=seed)
        return remade(data, sampler)
    if isinstance(data, (list, tuple)):
        per_rank = len(data) // world
        if per_rank * world != len(data):
            warnings.warn(f"the ddp backend deals {len(data)} training batches out to {world} "
                          f"processes: the last {len(data) - per_rank * world} are left out, "
                          f"so that every process runs as many steps", stacklevel=3)
        return type(data)(data[rank:per_rank * world:world])
    warnings.warn(f"the ddp backend cannot deal out training data of type "
                  f"{type(data).__name__}: every process reads all of it; give a DataLoader "
                  f"over a map-style dataset, a list of batches, or data that reads this "
                  f"process's part (torch.distributed.get_rank()) with DDP(shard_data=False)",
                  stacklevel=3)
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
    settings = {name: getattr(loader, name) for name in _loader_arguments()
                if name not in _NOT_COPIED and hasattr(loader, name)}
    return DataLoader(loader.dataset, sampler=sampler, **settings)


def _was_shuffled(loader: DataLoader[Any], what: str) -> bool:
    """Whether ``loader`` shuffles; a loader that cannot be dealt out is an error here."""
    if isinstance(loader.dataset, IterableDataset):
        raise TypeError(f"the ddp backend cannot deal out {what} data from an "
                        f"IterableDataset ({type(loader.dataset).__name__}); have it yield "
                        f"this process's part (torch.distributed.get_rank()) and use "
                        f"DDP(shard_data=False)")
    if type(loader).__init__ is not DataLoader.__init__:
        raise TypeError(f"the ddp backend makes the {what} DataLoader again with a "
                        f"DistributedSampler, and {type(loader).__name__} has its own "
                        f"__init__; give a plain DataLoader, or one with a DistributedSampler")
    batch_sampler = loader.batch_sampler
    if batch_sampler is not None and type(batch_sampler) is not BatchSampler:
        raise TypeError(f"the {what} DataLoader has its own batch_sampler "
                        f"({type(batch_sampler).__name__}), which the ddp backend cannot deal "
                        f"out; give it a DistributedSampler yourself, or DDP(shard_data=False)")
    sampler = loader.sampler
    if isinstance(sampler, RandomSampler):
        if sampler.replacement or sampler._num_samples is not None:
            raise TypeError(f"the {what} DataLoader's RandomSampler draws with replacement or "
                            f"a set number of samples, which a DistributedSampler cannot; "
                            f"give it a DistributedSampler yourself, or DDP(shard_data=False)")
        return True
    if isinstance(sampler, SequentialSampler):
        return False
    raise TypeError(f"the {what} DataLoader has its own sampler ({type(sampler).__name__}), "
                    f"which the ddp backend cannot deal out; give it a DistributedSampler "
                    f"yourself, or DDP(shard_data=False)")


def _loader_arguments() -> Sequence[str]:
    return list(inspect.signature(DataLoader.__init__).parameters)

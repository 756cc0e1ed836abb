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

from . import env

__all__ = [
    "Chain",
    "Dealer",
    "DealingSampler",
    "DealtBatches",
    "EvalShard",
    "deal_rest",
    "padded",
    "remade",
    "shard_eval_data",
    "shard_train_data",
    "shared_seed",
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


# -- the data of one distributed run -----------------------------------------------------


class Dealer:
    """The data of one distributed run of ``model``; ``backend`` (``"ddp"``) names the
    backend in errors."""

    def __init__(self, model: Any, backend: str) -> None:
        self.model, self.backend = model, backend
        self.sampler: DistributedSampler[Any] | None = None
        self.data: dict[str, Any] = {}  # attribute -> the model's own data, put back after
        # the training data this backend dealt out (None: dealt otherwise, or not at all),
        # and what one item of it is, in batches: the loader's batch size (1 for a list)
        self.dealt: DealingSampler | DealtBatches | None = None
        self.unit = 1
        # where the epoch under way stands: its number, the skipped batches before it, and
        # the parts of it that ran in another number of processes (data.Chain)
        self.epoch, self.skipped_before = -1, 0
        self.chain: Chain = []
        self.loaded: dict[str, Any] | None = None  # the checkpoint's state of the pack
        self.first_epoch = True

    def shard(self, seed: int | None) -> None:
        """Deal the model's training and eval data out to the processes; ``seed`` is the
        training sampler's (None: ``shared_seed(generator)`` draws one for all)."""
        model, rank, world = self.model, env.rank(), env.world_size()
        train = getattr(model, "train_data", None)
        if train is not None:
            if seed is None:
                seed = shared_seed(getattr(train, "generator", None))
            sharded = shard_train_data(train, rank, world, seed)
            self.data["train_data"] = train
            model.train_data = sharded
            sampler = getattr(sharded, "sampler", None)
            self.sampler = sampler if isinstance(sampler, DistributedSampler) else None
            if isinstance(sampler, DealingSampler):
                self.dealt, self.unit = sampler, sharded.batch_size or 1
            elif isinstance(sharded, DealtBatches):
                self.dealt = sharded
        for name in ("eval_data",):
            data = getattr(model, name, None)
            if data is not None:
                self.data[name] = data
                setattr(model, name, shard_eval_data(data, rank, world))

    def drawn(self, state: Any) -> int:
        """How many batches of the epoch under way this process had drawn when the
        checkpoint this run resumes from was taken (0: it resumes at an epoch's start)."""
        loaded = self.loaded
        if loaded is None or loaded.get("epoch") != state.epoch:
            return 0
        return max(0, state.epoch_step + state.skipped - int(loaded.get("skipped_before", 0)))

    def check_setup(self, engine: Any) -> None:
        """A run resumed in the middle of an epoch begun in another number of processes
        deals the epoch's rest out anew: only data this backend dealt out can be."""
        s, loaded = engine.state, self.loaded
        if s.mode != "train" or loaded is None or loaded.get("world") is None:
            return
        drawn, saved = self.drawn(s), int(loaded["world"])
        if not drawn or (saved == env.world_size() and not loaded.get("chain")):
            return
        if loaded.get("epoch_batches") is not None and drawn >= int(loaded["epoch_batches"]):
            return  # the epoch's data were all drawn: it resumes as at the epoch's end
        why = self.why_not_dealt()
        if why is None and loaded.get("dealt") not in (None, self.dealt_kind()):
            why = f"{self.dealt_kind()}, and the checkpoint's were {loaded['dealt']}"
        if why is None:
            return
        raise ValueError(
            f"the checkpoint {engine.resumed_from} was written by {saved} process(es) in the "
            f"middle of epoch {s.epoch + 1} (after {drawn} of its batches), and this run has "
            f"{env.world_size()}: the rest of the epoch is dealt out anew only for training "
            f"data the {self.backend} backend deals out itself (a DataLoader it makes again, "
            f"a list of batches), and this run's are {why}. Resume in {saved} process(es), "
            f"or from a checkpoint taken at an epoch's end (Checkpoint(every='1ep'))"
        )

    def dealt_kind(self) -> str:
        return "a list of batches" if isinstance(self.dealt, DealtBatches) else "a DataLoader"

    def why_not_dealt(self) -> str | None:
        """None when this backend dealt the training data out; else what they are."""
        if self.dealt is not None:
            return None
        data = getattr(self.model, "train_data", None)
        if "train_data" not in self.data:
            return "read by each process as it is (DDP(shard_data=False))"
        if self.sampler is not None:
            loader = type(data).__name__
            return f"dealt out by the script's own DistributedSampler (in a {loader})"
        return f"of a type it cannot deal out ({type(data).__name__})"

    def setup(self, engine: Any) -> None:
        """At setup: the run record says whether the run's data are this backend's to
        deal out (a resume in another number of processes checks it); a run resumed in
        the middle of an epoch that began in another number of processes (or went on in
        one) draws the rest of it, dealt out anew."""
        s = engine.state
        why = self.why_not_dealt()
        engine.run_record["data"] = "dealt" if why is None else why
        drawn, loaded = self.drawn(s), self.loaded
        self.chain = []
        if not drawn or self.dealt is None or loaded is None or loaded.get("world") is None:
            return
        saved, chain = int(loaded["world"]), [list(part) for part in loaded.get("chain") or []]
        if saved == env.world_size() and not chain:
            return  # the epoch goes on as it began: the resume skips the drawn batches
        count = drawn * self.unit - sum(part[1] for part in chain)
        if count > 0:
            chain.append([saved, count])
        if isinstance(self.dealt, DealingSampler):
            self.dealt.set_epoch(s.epoch)
        self.dealt.deal(chain)
        self.chain = chain

    def epoch_start(self, engine: Any) -> None:
        s = engine.state
        if self.sampler is not None:
            self.sampler.set_epoch(s.epoch)
        if self.first_epoch:  # maybe resumed in its middle: count its skips as they were
            self.first_epoch = False
            self.skipped_before = s.skipped - max(0, self.drawn(s) - s.epoch_step)
        else:
            self.chain, self.skipped_before = [], s.skipped
            if isinstance(self.dealt, DealtBatches):
                self.dealt.dealt_as_ever()
        self.epoch = s.epoch

    def restore(self) -> None:
        """The model's own data back."""
        for name, data in self.data.items():
            setattr(self.model, name, data)
        self.data = {}

    def state_dict(self) -> dict[str, Any]:
        """The sampler's seed, and where the epoch under way stands: the number of
        processes, the skipped batches before it, its parts in other numbers of
        processes, what the data are and how many batches the epoch has here."""
        try:
            batches: int | None = len(self.model.train_data)
        except TypeError:
            batches = None
        state: dict[str, Any] = {
            "world": env.world_size(),
            "epoch": self.epoch,
            "skipped_before": self.skipped_before,
            "chain": [list(part) for part in self.chain],
            "epoch_batches": batches,
            "dealt": None if self.dealt is None else self.dealt_kind(),
        }
        if self.sampler is not None:
            state["seed"] = int(self.sampler.seed)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loaded = dict(state)
        # a resumed run shuffles as the run it continues, epoch by epoch
        if self.sampler is not None and "seed" in state:
            self.sampler.seed = int(state["seed"])


def shared_seed(generator: torch.Generator | None) -> int:
    """One seed for every process: each draws one (from ``generator``, or torch's), so
    that their generators stay alike; process 0's is given to all."""
    drawn = int(torch.randint(0, 2**62, (), dtype=torch.int64, generator=generator))
    return int(env.broadcast_from_0(drawn))

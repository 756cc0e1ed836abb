"""Dealing a run's data out to the processes (``runmodel/backends/distributed/data.py``),
in this process: what the ``ddp`` and ``fsdp`` backends do to a model's loaders, for each
rank of a world of 2, and the rest of an epoch dealt out over another number of
processes (the runs that do it are in test_ddp.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from runmodel.backends.distributed.data import (
    DealingSampler,
    DealtBatches,
    deal_rest,
    padded,
    shard_eval_data,
    shard_train_data,
)


def test_data_that_cannot_be_dealt_out_is_refused_with_what_would_do() -> None:
    from torch.utils.data import IterableDataset, TensorDataset, WeightedRandomSampler

    dataset = TensorDataset(torch.arange(10.0))

    class Stream(IterableDataset[int]):
        def __iter__(self) -> Iterator[int]:
            return iter(range(3))

    refused = {
        "IterableDataset": DataLoader(Stream()),
        "own sampler": DataLoader(dataset, sampler=WeightedRandomSampler([1.0] * 10, 10)),
        "own batch_sampler": DataLoader(dataset, batch_sampler=[[0, 1], [2, 3]]),
        "with replacement": DataLoader(
            dataset, sampler=torch.utils.data.RandomSampler(dataset, replacement=True)
        ),
    }
    for what, loader in refused.items():
        with pytest.raises(TypeError, match=r"DDP\(shard_data=False\)"):
            shard_train_data(loader, 0, 2, seed=0)
            pytest.fail(f"{what}: not refused")


def test_a_loader_is_made_again_with_its_settings_and_a_distributed_sampler() -> None:
    from torch.utils.data import DistributedSampler, TensorDataset

    dataset = TensorDataset(torch.arange(21.0))
    generator = torch.Generator().manual_seed(3)
    loader = DataLoader(
        dataset,
        batch_size=4,
        shuffle=True,
        drop_last=True,
        generator=generator,
        collate_fn=lambda rows: [r[0] for r in rows],
    )
    parts = [shard_train_data(loader, rank, 2, seed=7) for rank in (0, 1)]
    for part in parts:
        assert isinstance(part.sampler, DistributedSampler) and part.sampler.shuffle
        assert (part.batch_size, part.drop_last, part.generator, part.collate_fn) == (
            4,
            True,
            generator,
            loader.collate_fn,
        )
        assert len(part) == 2  # 11 samples (padded), batches of 4, the last dropped
    evaluated = [shard_eval_data(DataLoader(dataset, batch_size=4), rank, 2) for rank in (0, 1)]
    assert [len(list(e.sampler)) for e in evaluated] == [11, 10]  # no padding
    assert sorted(i for e in evaluated for i in e.sampler) == list(range(21))
    assert shard_train_data([1, 2, 3, 4], 1, 2, seed=0) == [2, 4]
    with pytest.warns(UserWarning, match=r"the last 1 are left out"):
        assert shard_train_data([1, 2, 3], 0, 2, seed=0) == [1]
    assert shard_eval_data((1, 2, 3), 0, 2) == (1, 3)


# -- the rest of an epoch dealt out over another number of processes ---------------------------


@settings(max_examples=300, deadline=None)
@given(
    size=st.integers(1, 80),
    first=st.integers(1, 5),
    then=st.integers(1, 5),
    drawn=st.integers(0, 30),
)
def test_the_rest_of_an_epoch_goes_to_the_new_processes_and_nothing_drawn_comes_back(
    size: int, first: int, then: int, drawn: int
) -> None:
    """N processes drew ``drawn`` items each of an epoch's padded order (process r:
    positions r, r + N, ...: together a prefix); M processes then share what is left,
    as many each. Every item is drawn, none of the drawn ones again unless as padding;
    where N and M divide what there is, each exactly once."""
    order = torch.randperm(size, generator=torch.Generator().manual_seed(size)).tolist()
    dealt = padded(order, first)
    drawn = min(drawn, len(dealt) // first)
    shares = [deal_rest(order, [[first, drawn]], then, rank) for rank in range(then)]
    assert {before for before, _ in shares} == {drawn}
    assert len({len(share) for _, share in shares}) == 1  # every process as many steps
    rest = [i for _, share in shares for i in share]
    assert set(dealt[: first * drawn]) | set(rest) == set(order)
    if size % first == 0 and (size - first * drawn) % then == 0:
        assert sorted(dealt[: first * drawn] + rest) == sorted(order)


def test_an_epoch_dealt_out_twice_anew_still_draws_every_sample_once() -> None:
    """2 processes draw 3 each, then 3 processes 2 each, then 1 process the rest: 48
    samples, each once."""
    order = list(range(48))
    seen = padded(order, 2)[:6]
    seen += [i for rank in range(3) for i in deal_rest(order, [[2, 3]], 3, rank)[1][:2]]
    before, rest = deal_rest(order, [[2, 3], [3, 2]], 1, 0)
    assert before == 5 and sorted(seen + rest) == order


def test_the_backends_sampler_and_batches_deal_the_rest_after_stand_ins_once() -> None:
    """Dealt anew, an epoch yields as many stand-ins as the process drew already (the
    resume skips them, unloaded), then its share of the rest; the next epoch is dealt
    as ever. A DistributedSampler's order otherwise."""
    from torch.utils.data import DistributedSampler, TensorDataset

    dataset = TensorDataset(torch.arange(20.0))
    sampler = DealingSampler(dataset, num_replicas=1, rank=0, seed=5)
    plain = DistributedSampler(dataset, num_replicas=1, rank=0, seed=5)
    two = [DistributedSampler(dataset, num_replicas=2, rank=r, seed=5) for r in (0, 1)]
    for each in (sampler, plain, *two):
        each.set_epoch(3)
    assert list(sampler) == list(plain)
    sampler.deal([[2, 4]])  # 2 processes drew 4 samples each of epoch 3
    dealt = list(sampler)
    assert len(dealt) == len(sampler) == 4 + 12
    drawn = {i for s in two for i in list(s)[:4]}
    assert sorted([*drawn, *dealt[4:]]) == list(range(20))
    sampler.set_epoch(4)
    plain.set_epoch(4)
    assert list(sampler) == list(plain) and len(sampler) == 20
    batches = shard_train_data(list("abcdefgh"), 0, 1, seed=0)
    assert isinstance(batches, DealtBatches) and batches == list("abcdefgh")
    batches.deal([[2, 2]])  # 2 processes drew 2 batches each: a, b, c, d
    assert list(batches)[2:] == list("efgh") and len(batches) == 6
    batches.dealt_as_ever()
    assert list(batches) == list("abcdefgh")

"""Dealing a run's data out to the processes (``runmodel/backends/distributed/data.py``),
in this process: what the ``ddp`` and ``fsdp`` backends do to a model's loaders, for each
rank of a world of 2."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch.utils.data import DataLoader

from runmodel.backends.distributed.data import shard_eval_data, shard_train_data


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
        "with replacement": DataLoader(dataset, sampler=torch.utils.data.RandomSampler(
            dataset, replacement=True)),
    }
    for what, loader in refused.items():
        with pytest.raises(TypeError, match=r"DDP\(shard_data=False\)"):
            shard_train_data(loader, 0, 2, seed=0)
            pytest.fail(f"{what}: not refused")


def test_a_loader_is_made_again_with_its_settings_and_a_distributed_sampler() -> None:
    from torch.utils.data import DistributedSampler, TensorDataset

    dataset = TensorDataset(torch.arange(21.0))
    generator = torch.Generator().manual_seed(3)
    loader = DataLoader(dataset, batch_size=4, shuffle=True, drop_last=True,
                        generator=generator, collate_fn=lambda rows: [r[0] for r in rows])
    parts = [shard_train_data(loader, rank, 2, seed=7) for rank in (0, 1)]
    for part in parts:
        assert isinstance(part.sampler, DistributedSampler) and part.sampler.shuffle
        assert (part.batch_size, part.drop_last, part.generator, part.collate_fn) == (
            4, True, generator, loader.collate_fn)
        assert len(part) == 2  # 11 samples (padded), batches of 4, the last dropped
    evaluated = [shard_eval_data(DataLoader(dataset, batch_size=4), rank, 2) for rank in (0, 1)]
    assert [len(list(e.sampler)) for e in evaluated] == [11, 10]  # no padding
    assert sorted(i for e in evaluated for i in e.sampler) == list(range(21))
    assert shard_train_data([1, 2, 3, 4], 1, 2, seed=0) == [2, 4]
    with pytest.warns(UserWarning, match=r"the last 1 are left out"):
        assert shard_train_data([1, 2, 3], 0, 2, seed=0) == [1]
    assert shard_eval_data((1, 2, 3), 0, 2) == (1, 3)

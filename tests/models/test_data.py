"""Exact resume from any step, for each kind of training data (runmodel/models/data.py).

One run writes a checkpoint after every step; resuming from an early one, one mid-run
and one at an epoch's last step must end with the parameters of the straight run, bit for
bit: a shuffled DataLoader with dropout (with a generator of its own, with workers, with
its indices skipped and never loaded), a DistributedSampler's shard, torchdata's
StatefulDataLoader, an iterable-style dataset (replayed, with a warning) and a list of
batches (replayed, quietly). tests/faults/test_exact_resume.py kills real processes with SIGKILL.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    IterableDataset,
    TensorDataset,
)

import runmodel
from runmodel.checkpoint import checkpoints_in
from runmodel.packs import Checkpoint

SAMPLES, BATCH, EPOCHS = 44, 8, 3  # 6 batches an epoch, the last one short


class Counted(TensorDataset):
    """A map-style dataset that counts the samples it loads."""

    def __init__(self, *tensors: torch.Tensor) -> None:
        super().__init__(*tensors)
        self.loaded: list[int] = []

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        self.loaded.append(index)
        return super().__getitem__(index)


class Stream(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    """An iterable-style dataset: shuffled by the global generator as iteration starts."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for i in torch.randperm(len(self.x)).tolist():
            yield self.x[i], self.y[i]


def tensors() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, 5, generator=g)
    return x, x.sum(1, keepdim=True)


def loader(**options: Any) -> DataLoader[Any]:
    return DataLoader(Counted(*tensors()), batch_size=BATCH, **options)


def batches_list() -> list[tuple[torch.Tensor, torch.Tensor]]:
    x, y = tensors()
    return [(x[i : i + BATCH], y[i : i + BATCH]) for i in range(0, SAMPLES, BATCH)]


def stateful() -> Any:
    stateful_dataloader = pytest.importorskip("torchdata.stateful_dataloader")
    return stateful_dataloader.StatefulDataLoader(
        Counted(*tensors()), batch_size=BATCH, shuffle=True
    )


def distributed() -> DataLoader[Any]:  # process 1 of 2's shard, as under torchrun
    dataset = Counted(*tensors())
    return DataLoader(
        dataset,
        batch_size=BATCH // 2,
        sampler=DistributedSampler(dataset, num_replicas=2, rank=1, seed=3),
    )


DATA: dict[str, Callable[[], Any]] = {
    "shuffled": lambda: loader(shuffle=True),
    "own generator": lambda: loader(shuffle=True, generator=torch.Generator().manual_seed(7)),
    # (persistent workers: tests/faults/test_exact_resume.py, whose processes end as runs do; here,
    # a persistent iterator the garbage collector finalises waits seconds for its workers)
    "workers": lambda: loader(shuffle=True, num_workers=2),
    "no batching": lambda: DataLoader(Counted(*tensors()), batch_size=None, shuffle=True),
    "distributed": distributed,
    "stateful": stateful,
    "iterable": lambda: DataLoader(Stream(*tensors()), batch_size=BATCH),
    "list": batches_list,
}


class Net(runmodel.TorchModel):
    def __init__(self, make_data: Callable[[], Any], distributed: bool = False) -> None:
        super().__init__("cpu")
        self.make_data, self.distributed = make_data, distributed
        torch.manual_seed(0)
        self.module = nn.Sequential(nn.Linear(5, 16), nn.Dropout(0.3), nn.Linear(16, 1))

    def setup(self, setup_options: dict[str, Any] | None = None) -> None:
        self.optimizer = torch.optim.Adam(self.module.parameters(), lr=1e-2)
        self.loss_fn = nn.MSELoss()
        self.train_data = self.make_data()

    def run(
        self, runstep: runmodel.RunStep, steps: int | None = None, *args: Any, **kwargs: Any
    ) -> None:
        sampler = getattr(self.train_data, "sampler", None)
        for epoch in runstep.epochs():
            if isinstance(sampler, DistributedSampler):
                sampler.set_epoch(epoch)  # what the ddp backend does at each epoch's start
            for batch in self.train_data:
                runstep(batch)


def parameters(model: Net) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.module.parameters()]


def train(
    make_data: Callable[[], Any],
    folder: Path | None = None,
    resume: Path | None = None,
    epochs: int = EPOCHS,
) -> Net:
    torch.manual_seed(123)  # where the run's generator stands before it starts
    model, engine = Net(make_data), runmodel.Engine()
    if folder is not None:
        engine.attach(Checkpoint(folder, every="1st", keep=None))
    with warnings.catch_warnings():  # a resumed run attaches no Checkpoint pack
        warnings.filterwarnings("ignore", message="saved state of pack 'checkpoint'")
        engine.run(model, epochs=epochs, resume=resume)
    return model


@pytest.mark.parametrize("kind", list(DATA))
def test_resumed_from_any_step_ends_as_the_straight_run(kind: str, tmp_path: Path) -> None:
    make = DATA[kind]
    straight = parameters(train(make))
    train(make, tmp_path)  # a checkpoint after every step
    saved = sorted(checkpoints_in(tmp_path))
    per_epoch = len(saved) // EPOCHS
    # in epoch 0; in the middle of epoch 1; after the last step of epoch 1
    for path in (saved[1], saved[per_epoch + per_epoch // 2], saved[2 * per_epoch - 1]):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            resumed = parameters(train(make, resume=path))
        assert all(torch.equal(p, q) for p, q in zip(resumed, straight, strict=True)), (
            f"{kind}: resumed from {path.name}, the parameters differ"
        )
        replayed = [w for w in caught if "drawn again and dropped" in str(w.message)]
        mid_epoch = torch.load(path, weights_only=True)["position"]["batches"] > 0
        assert len(replayed) == (kind == "iterable" and mid_epoch), (path.name, replayed)


def test_skipped_batches_are_never_loaded(tmp_path: Path) -> None:
    train(DATA["shuffled"], tmp_path)
    path = tmp_path / "ckpt-00001-0000000010.pt"  # 4 batches into epoch 1
    assert torch.load(path, weights_only=True)["position"]["batches"] == 4
    model = train(DATA["shuffled"], resume=path)
    loaded = model.train_data.dataset.loaded
    # epoch 1's last 2 batches (8 + 4 samples), then epoch 2's 44
    assert len(loaded) == 12 + SAMPLES


def test_the_loader_is_left_as_it_was_after_the_run() -> None:
    model = train(DATA["shuffled"])
    data = model.train_data
    assert type(data.batch_sampler).__name__ == "BatchSampler"
    assert len(list(data)) == 6  # a plain DataLoader again, outside any run


def test_a_resumed_epoch_with_no_batches_left_ends_without_an_error(tmp_path: Path) -> None:
    model, engine = Net(DATA["shuffled"]), runmodel.Engine()
    engine.attach(Checkpoint(tmp_path, every="1st", keep=None))
    engine.run(model, steps=6)  # the whole of epoch 0: its last step's checkpoint is its end
    again = runmodel.Engine()
    again.attach(Checkpoint(tmp_path / "again"))
    result = again.run(Net(DATA["shuffled"]), steps=9, resume=tmp_path / "ckpt-00001-0000000006.pt")
    assert (result.steps, result.epochs) == (9, 1)


class Noisy(Counted):
    """Random augmentation: noise drawn in the worker that loads the sample."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        x, y = super().__getitem__(index)
        return x + 0.1 * torch.rand(x.shape), y


@pytest.mark.parametrize(
    "kind", ["shuffled", "own generator", "stateful", "own generator, augmented in workers"]
)
def test_resumed_from_an_epoch_end_checkpoint_ends_as_the_straight_run(
    kind: str, tmp_path: Path
) -> None:
    # an epoch-end checkpoint holds no position in the epoch, but it holds the loader's
    # own generators: the next epoch's order (and the workers' seeds) are drawn from them
    make = DATA.get(kind) or (
        lambda: DataLoader(
            Noisy(*tensors()),
            batch_size=BATCH,
            shuffle=True,
            num_workers=2,
            generator=torch.Generator().manual_seed(7),
        )
    )

    def run(epochs: int, resume: Path | None) -> Net:
        torch.manual_seed(123)
        model, engine = Net(make), runmodel.Engine()
        engine.attach(Checkpoint(tmp_path, every="1ep", keep=1))
        engine.run(model, epochs=epochs, resume=resume)
        return model

    straight = parameters(train(make, epochs=4))
    run(2, None)
    assert [p.name for p in checkpoints_in(tmp_path)] == ["ckpt-00002-0000000012.pt"]
    resumed = parameters(run(4, tmp_path))
    assert all(torch.equal(p, q) for p, q in zip(resumed, straight, strict=True)), kind

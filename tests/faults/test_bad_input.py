"""Bad input, as a new user brings it: one clear error saying what was wrong and what to
do, at the earliest moment, with nothing already written lost."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import runmodel
from runmodel import checkpoint
from runmodel.packs import Checkpoint


def data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 4, generator=g)
    return [(x[i : i + 4], x[i : i + 4].sum(1, keepdim=True)) for i in range(0, 16, 4)]


def model(
    optimizer: Callable[[Any], torch.optim.Optimizer] | None = None, train_data: Any = None
) -> runmodel.TorchModel:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    return runmodel.TorchModel.from_parts(
        module,
        optimizer=optimizer or (lambda p: torch.optim.Adam(p, lr=1e-2)),
        loss_fn=nn.MSELoss(),
        train_data=data() if train_data is None else train_data,
    )


def two_groups(params: Any) -> torch.optim.Optimizer:
    params = list(params)
    return torch.optim.Adam([{"params": params[:2]}, {"params": params[2:], "lr": 1e-3}], lr=1e-2)


# -- a changed optimizer -------------------------------------------------------------------


@pytest.mark.parametrize("other", ["SGD", "two groups"])
def test_resuming_with_another_optimizer_stops_before_a_step_naming_both(
    tmp_path: Path, other: str
) -> None:
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path, every="1ep"))
    engine.run(model(), epochs=1)
    saved = sorted(p.name for p in tmp_path.iterdir())
    changed = (
        model(lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9))
        if other == "SGD"
        else model(two_groups)
    )
    before = [p.detach().clone() for p in changed.module.parameters()]
    again = runmodel.Engine()
    again.attach(Checkpoint(tmp_path, every="1ep"))
    with pytest.raises(ValueError) as caught:
        again.run(changed, epochs=2, resume=tmp_path)
    message = str(caught.value)
    assert "torch.optim.adam.Adam with parameter groups of [4]" in message
    assert (
        "torch.optim.sgd.SGD with [4]" if other == "SGD" else "torch.optim.adam.Adam with [2, 2]"
    ) in message
    assert "runmodel.checkpoint.weights(path)" in message
    assert again.state.step == 4  # the checkpoint's counters; no step ran
    assert all(
        torch.equal(p, q) for p, q in zip(before, changed.module.parameters(), strict=True)
    )  # nothing half loaded
    assert sorted(p.name for p in tmp_path.iterdir()) == saved


def test_a_new_run_starts_from_a_checkpoints_weights_with_another_optimizer(tmp_path: Path) -> None:
    trained = model()
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path, every="1ep"))
    engine.run(trained, epochs=2)
    fresh = model(lambda p: torch.optim.SGD(p, lr=0.1))
    fresh.module.load_state_dict(checkpoint.weights(tmp_path))  # what setup() would do
    assert all(
        torch.equal(p, q)
        for p, q in zip(fresh.module.parameters(), trained.module.parameters(), strict=True)
    )
    result = runmodel.Engine().run(fresh, epochs=1)
    assert (result.steps, result.ended) == (4, "completed")


def test_a_checkpoint_without_the_optimizer_record_still_resumes(tmp_path: Path) -> None:
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path, every="1ep", keep=None))
    engine.run(model(), epochs=1)
    for path in tmp_path.glob("ckpt-*.pt"):  # as runmodel wrote it before the record
        state = torch.load(path, weights_only=True)
        del state["model"]["optimizer_class"]
        torch.save(state, path)
    result = runmodel.Engine().run(model(), epochs=2, resume=tmp_path)
    assert (result.steps, result.ended) == (8, "completed")


# -- an empty epoch --------------------------------------------------------------------


def test_a_loader_that_yields_nothing_is_an_error_naming_it(tmp_path: Path) -> None:
    empty = DataLoader(
        TensorDataset(torch.zeros(3, 4), torch.zeros(3, 1)), batch_size=4, drop_last=True
    )
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path, every="1ep"))
    with pytest.raises(RuntimeError) as caught:
        engine.run(model(train_data=empty), epochs=3)
    assert str(caught.value).startswith(
        "epoch 0 drew no batch: TorchModel's train data (DataLoader over TensorDataset of 3 "
        "samples, batch_size=4, drop_last=True) yielded nothing"
    )
    assert list(tmp_path.iterdir()) == []  # no checkpoint of an epoch that never was


def test_an_epoch_whose_batches_were_all_skipped_is_no_error() -> None:
    engine = runmodel.Engine()
    engine.on("step_start", lambda e: e.skip_step())
    result = engine.run(model(), epochs=2)
    assert (result.ended, result.steps, result.epochs, result.skipped) == ("completed", 0, 2, 8)


# -- non-finite parameters ---------------------------------------------------------------


def test_a_save_of_non_finite_parameters_stops_the_run_and_keeps_the_good_ones(
    tmp_path: Path,
) -> None:
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path, every="1st", keep=None))
    trained = model()

    @engine.on("runstep", once=6)  # the 7th step (step 6) diverges
    def diverge(engine: runmodel.Engine) -> None:
        with torch.no_grad():
            trained.module[2].bias.fill_(float("nan"))

    with pytest.raises(FloatingPointError) as caught:
        engine.run(trained, epochs=3)
    message = str(caught.value)
    assert message.startswith(
        "not saving the checkpoint of epoch 1, step 7: parameters 2.bias hold NaN or inf"
    )
    assert "runmodel.packs.NaNGuard()" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"ckpt-{k // 4:05d}-{k:010d}.pt"  # an epoch's last step: its end, the next epoch
        for k in range(1, 7)
    ]
    weights = checkpoint.weights(tmp_path)  # the newest good one loads, finite
    assert all(bool(w.isfinite().all()) for w in weights.values())


def test_a_nan_metric_is_never_ranked_best(tmp_path: Path) -> None:
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path, every="1ep", keep=1, best=("score", "max")))
    scores = iter([0.5, float("nan"), 0.4])

    @engine.on("epoch_end", priority=10)  # before the checkpoint's save
    def score(engine: runmodel.Engine) -> None:
        engine.state.metrics["score"] = next(scores)

    engine.run(model(), epochs=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "best-score=0.5-00001-0000000004.pt",
        "ckpt-00003-0000000012.pt",
    ]

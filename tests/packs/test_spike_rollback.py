"""SpikeGuard(action="rollback"): a poisoned batch whose loss jumps about 50 times is
rolled back from an earlier checkpoint and left out; the run is then, bit for bit, the
run whose data leave that batch out, and a resumed run leaves it out again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import runmodel
from runmodel.checkpoint import checkpoints_in
from runmodel.packs import Checkpoint, SpikeGuard

BATCHES, POISONED, WINDOW, BACK = 12, 7, 4, 2


def model(data: Any = None, without: int | None = None) -> runmodel.TorchModel:
    """A small regression over ``BATCHES`` batches, the one at ``POISONED`` with targets
    8.5 away (``without``: that position left out of the list)."""
    torch.manual_seed(0)
    batches = [(torch.randn(8, 3), torch.randn(8, 1)) for _ in range(BATCHES)]
    x, y = batches[POISONED]
    batches[POISONED] = (x, y + 8.5)
    if without is not None:
        del batches[without]
    module = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Dropout(0.1), nn.Linear(8, 1))
    return runmodel.TorchModel.from_parts(
        module,
        optimizer=torch.optim.Adam(module.parameters(), lr=1e-2),
        loss_fn=nn.MSELoss(),
        train_data=batches if data is None else data,
    )


def weights(m: runmodel.TorchModel) -> list[torch.Tensor]:
    return [p.detach().clone() for p in m.module.parameters()]


def assert_equal(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[torch.Tensor], float]:
    """The run whose data never held the poisoned batch: its weights and mean loss (which
    a run folder keeps)."""
    m = model(without=POISONED)
    folder = tmp_path_factory.mktemp("straight")
    result = runmodel.Engine(progress=False).run(m, "train", epochs=1, run_dir=folder)
    return weights(m), result.metrics["loss"]


def rolling_back(folder: Path, **options: Any) -> tuple[runmodel.Engine, SpikeGuard]:
    guard = SpikeGuard("rollback", window=WINDOW, threshold=10.0, back=BACK)
    engine = runmodel.Engine(guard, Checkpoint(folder, every="2st", **options), progress=False)
    return engine, guard


def test_a_rollback_is_the_run_that_never_saw_the_batch(
    tmp_path: Path,
    straight: tuple[list[torch.Tensor], float],
    capsys: pytest.CaptureFixture[str],
) -> None:
    engine, guard = rolling_back(tmp_path / "ckpt")
    m = model()
    result = engine.run(m, "train", epochs=1, run_dir=tmp_path / "run")
    want, mean = straight
    assert_equal(weights(m), want)
    assert result.metrics["loss"] == mean  # the epoch's mean: from the checkpoint's sums on
    assert result.steps == BATCHES - 1 and engine.state.skipped == 1
    assert result.metrics["spikes"] == guard.spikes == 1
    # checkpoints every 2 steps, keep=2: at the spike, steps 4 and 6; 4 is BACK before
    assert f"loss spike at step {POISONED} (epoch 0, batch {POISONED})" in capsys.readouterr().err
    (entry,) = json.loads((tmp_path / "run" / "divergence.json").read_text())
    assert entry["action"] == "rollback" and entry["to_step"] == 4
    assert entry["batch"] == POISONED and entry["loss"] > 40 * entry["median"]
    assert guard.records == [entry] and guard.left_out == [[0, POISONED, 1]]


def test_a_resumed_rolled_back_run_leaves_the_batch_out_again(
    tmp_path: Path, straight: tuple[list[torch.Tensor], float]
) -> None:
    engine, guard = rolling_back(tmp_path)

    @engine.on("runstep", when=lambda e: guard.spikes == 1 and e.state.step == 5)
    def stop_after_the_rollback(engine: Any) -> None:  # at the replay's save of step 6
        engine.stop()

    result = engine.run(model(), "train", epochs=1)
    assert result.ended == "stopped" and guard.spikes == 1
    newest = checkpoints_in(tmp_path)[0]
    assert newest.name.endswith("0000000006.pt")  # before the poisoned batch comes again

    again, resumed = rolling_back(tmp_path)
    m = model()
    again.run(m, "train", epochs=1, resume=newest)
    assert_equal(weights(m), straight[0])
    assert resumed.spikes == 1 and resumed.records == guard.records  # none found again
    assert again.state.skipped == 1


@pytest.mark.parametrize("workers", [0])
def test_a_shuffled_loader_rolls_back_as_a_planned_leave_out(tmp_path: Path, workers: int) -> None:
    """Two epochs of a shuffled DataLoader: the rolled-back run equals the run that left
    the poisoned batch out from the start (the loader's order otherwise the same)."""

    def run(engine: runmodel.Engine) -> list[torch.Tensor]:
        torch.manual_seed(1)
        data = TensorDataset(torch.randn(96, 3), torch.randn(96, 1))
        loader = DataLoader(data, batch_size=8, shuffle=True, num_workers=workers)

        @engine.on("step_start")
        def poison(engine: Any) -> None:  # the epoch's batch at that position
            if engine.state.epoch == 0 and engine.batch_index() == POISONED:
                x, y = engine.state.batch
                engine.state.batch = (x, y + 8.5)

        m = model(loader)
        engine.run(m, "train", epochs=2)
        return weights(m)

    planned = runmodel.Engine(progress=False)
    planned.on("setup", lambda engine: engine.leave_out(0, [POISONED]))
    want = run(planned)
    engine, guard = rolling_back(tmp_path)
    assert_equal(run(engine), want)
    assert guard.spikes == 1 and engine.state.skipped == 1


def test_rollback_needs_a_checkpoint_pack() -> None:
    engine = runmodel.Engine(SpikeGuard("rollback", window=WINDOW), progress=False)
    with pytest.raises(ValueError, match="no Checkpoint pack is attached"):
        engine.run(model(), "train", epochs=1)


def test_with_no_checkpoint_old_enough_the_spike_is_skipped(tmp_path: Path) -> None:
    guard = SpikeGuard("rollback", window=WINDOW, back=POISONED + 1)
    engine = runmodel.Engine(guard, Checkpoint(tmp_path, every="2st"), progress=False)
    result = engine.run(model(), "train", epochs=1)
    assert result.steps == BATCHES and guard.spikes == 1 and not guard.left_out
    assert guard.records[0]["action"] == "skip"


def test_a_spike_that_comes_back_in_the_replay_is_skipped(tmp_path: Path) -> None:
    """A spike that is not the batch's (here a hook makes whatever batch comes at step
    POISONED bad, in the replay too): one rollback, then the spike in its replay is
    skipped, not rolled back again without end."""
    engine, guard = rolling_back(tmp_path / "ckpt")

    @engine.on("step_start", once=POISONED)
    def poison(engine: runmodel.Engine) -> None:
        x, y = engine.state.batch
        engine.state.batch = (x, y + 8.5)

    data = model(without=POISONED)
    result = engine.run(data, "train", epochs=1)
    assert [r["action"] for r in guard.records] == ["rollback", "skip"]
    assert [r["step"] for r in guard.records] == [POISONED, POISONED]
    assert guard.spikes == 2 and result.steps == BATCHES - 2  # one left out, one skipped

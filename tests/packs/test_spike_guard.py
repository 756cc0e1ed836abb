"""The SpikeGuard pack: a poisoned batch whose loss jumps about 50 times the running
median is skipped (the weights of a run that skips that update, bit for bit) or stops
the run; its record; its window and records across a resume; bad arguments."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import runmodel
from runmodel.checkpoint import checkpoints_in
from runmodel.packs import Checkpoint, SpikeGuard

SPIKE, WINDOW, STEPS = 7, 4, 10


def model() -> runmodel.TorchModel:
    torch.manual_seed(0)
    batches = [(torch.randn(8, 3), torch.randn(8, 1)) for _ in range(STEPS)]
    module = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Dropout(0.1), nn.Linear(8, 1))
    return runmodel.TorchModel.from_parts(
        module,
        optimizer=torch.optim.Adam(module.parameters(), lr=1e-2),
        loss_fn=nn.MSELoss(),
        train_data=batches,
    )


def poison(engine: runmodel.Engine) -> None:
    """The batch of step ``SPIKE`` gets targets 8.5 away: its loss jumps about 50 times."""

    @engine.on("step_start", once=SPIKE)
    def far_targets(engine: Any) -> None:
        x, y = engine.state.batch
        engine.state.batch = (x, y + 8.5)


def straight(steps: int = STEPS) -> list[torch.Tensor]:
    """The same run without a guard, whose update of step ``SPIKE`` is not taken."""
    engine = runmodel.Engine(progress=False)
    poison(engine)

    @engine.override("optimizer_step")
    def skip_the_spike(engine: Any, default: Any) -> None:
        if engine.state.step == SPIKE:
            engine.model.optimizer.zero_grad(set_to_none=True)
        else:
            default(engine)

    m = model()
    engine.run(m, "train", steps=steps)
    return [p.detach().clone() for p in m.module.parameters()]


@pytest.fixture(scope="module")
def reference() -> list[torch.Tensor]:
    return straight()


def assert_weights(m: runmodel.TorchModel, expected: list[torch.Tensor]) -> None:
    for got, want in zip(m.module.parameters(), expected, strict=True):
        assert torch.equal(got, want)


def test_a_spike_is_skipped_as_if_its_update_never_was(
    tmp_path: Path, reference: list[torch.Tensor], capsys: pytest.CaptureFixture[str]
) -> None:
    guard = SpikeGuard("skip", window=WINDOW)
    engine = runmodel.Engine(guard, progress=False)
    poison(engine)
    m = model()
    result = engine.run(m, "train", steps=STEPS, run_dir=tmp_path)
    assert result.steps == STEPS and result.metrics["spikes"] == 1 and guard.spikes == 1
    assert_weights(m, reference)
    assert f"loss spike at step {SPIKE} (epoch 0, batch {SPIKE})" in capsys.readouterr().err
    (entry,) = json.loads((tmp_path / "divergence.json").read_text())
    assert entry["step"] == SPIKE and entry["guard"] == "SpikeGuard"
    assert entry["loss"] > 40 * entry["median"]  # about 50 times
    assert engine.state.divergence == entry == guard.records[0]


def test_stop_ends_the_run_after_the_spike_without_its_update() -> None:
    engine = runmodel.Engine(SpikeGuard("stop", window=WINDOW), progress=False)
    poison(engine)
    m = model()
    result = engine.run(m, "train", steps=STEPS)
    assert result.ended == "stopped" and result.steps == SPIKE + 1
    assert "loss spike at step 7" in (result.reason or "")
    assert_weights(m, straight(SPIKE + 1))


@pytest.mark.parametrize("at", [3, 6])  # before the guard is armed (window 4), and after
def test_a_resumed_run_sees_the_same_window_and_skips_alike(
    tmp_path: Path, reference: list[torch.Tensor], at: int
) -> None:
    def run(resume: Path | None) -> tuple[SpikeGuard, runmodel.TorchModel]:
        guard = SpikeGuard(window=WINDOW)
        checkpoint = Checkpoint(tmp_path, every="3st", keep=None)
        engine = runmodel.Engine(guard, checkpoint, progress=False)
        poison(engine)
        m = model()
        engine.run(m, "train", steps=STEPS, resume=resume)
        return guard, m

    first, _ = run(None)
    (saved,) = [p for p in checkpoints_in(tmp_path) if p.name.endswith(f"{at:010d}.pt")]
    again, m = run(saved)  # before the spike: the window comes from the checkpoint
    assert again.spikes == 1 and again.records == first.records
    assert_weights(m, reference)


def test_no_spike_before_the_window_is_full() -> None:
    guard = SpikeGuard(window=STEPS)
    engine = runmodel.Engine(guard, progress=False)
    poison(engine)
    engine.run(model(), "train", steps=STEPS)
    assert guard.spikes == 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"action": "rewind"}, "action= must be"),
        ({"window": 1}, "window="),
        ({"threshold": 1.0}, "threshold="),
    ],
)
def test_bad_arguments_say_what_is_wanted(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        SpikeGuard(**kwargs)

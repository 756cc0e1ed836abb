"""The TensorBoard pack: real event files, read back with TensorBoard's own reader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import runmodel
from runmodel.packs import TensorBoard

from helpers import Tiny


def tiny(fail_at: int | None = None) -> Tiny:
    """A 3-class linear classifier on 4 fixed batches of 8; SGD(lr=0.1). With ``fail_at``,
    its forward raises at that step."""
    return Tiny(classes=3) if fail_at is None else Failing(fail_at)


class Failing(Tiny):
    def __init__(self, fail_at: int) -> None:
        super().__init__(classes=3)
        self.fail_at, self.forwards = fail_at, 0

    def compute_output(self, batch: Any) -> torch.Tensor:
        if self.forwards == self.fail_at:
            raise RuntimeError(f"boom at step {self.forwards}")
        self.forwards += 1
        return self.module(batch[0])


def read(directory: Path) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(directory))
    events.Reload()
    return {
        tag: [(s.step, s.value) for s in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


def as_float32(value: float) -> float:
    return torch.tensor(value, dtype=torch.float32).item()


def test_train_run_logs_loss_step_loss_and_lr(tmp_path: Path) -> None:
    engine = runmodel.Engine()
    engine.attach(TensorBoard(tmp_path, every_steps=2))
    losses: list[float] = []
    engine.on("runstep", lambda e: losses.append(e.state.loss.item()))

    @engine.on("epoch_end", priority=10)  # before the pack logs: a schedule
    def schedule(engine: runmodel.Engine) -> None:
        for group in engine.model.optimizer.param_groups:
            group["lr"] = 0.1 / (engine.state.epoch + 2)

    result = engine.run(tiny(), epochs=3)
    assert result.steps == 12
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("events.out.tfevents.")]) == 1
    scalars = read(tmp_path)
    assert sorted(scalars) == ["lr/group0", "train/loss", "train/loss_step"]
    # the epoch-end loss is the epoch's mean (issue 28: not its last step's), at the global
    # step; summed in float64 as the run sums it on its device
    assert scalars["train/loss"] == [
        (n, as_float32(sum(losses[n - 4 : n]) / 4)) for n in (4, 8, 12)
    ]
    # every 2nd step, labelled with the number of steps done
    assert scalars["train/loss_step"] == [(n, losses[n - 1]) for n in (2, 4, 6, 8, 10, 12)]
    assert scalars["lr/group0"] == [
        (4, as_float32(0.1 / 2)),
        (8, as_float32(0.1 / 3)),
        (12, as_float32(0.1 / 4)),
    ]
    assert losses[-1] < losses[0]


def test_without_every_steps_only_epochs_are_logged(tmp_path: Path) -> None:
    engine = runmodel.Engine()
    engine.attach(TensorBoard(tmp_path))
    engine.run(tiny(), epochs=2)
    scalars = read(tmp_path)
    assert sorted(scalars) == ["lr/group0", "train/loss"]
    assert [step for step, _ in scalars["train/loss"]] == [4, 8]
    assert scalars["lr/group0"] == [(4, as_float32(0.1)), (8, as_float32(0.1))]


def test_metrics_in_state_are_logged(tmp_path: Path) -> None:
    engine = runmodel.Engine()
    engine.attach(TensorBoard(tmp_path))

    @engine.on("epoch_end", priority=10)
    def measure(engine: runmodel.Engine) -> None:
        engine.state.metrics["double_epoch"] = 2 * engine.state.epoch
        engine.state.metrics["note"] = "not a number"

    engine.run(tiny(), epochs=2)
    scalars = read(tmp_path)
    assert scalars["train/double_epoch"] == [(4, 0.0), (8, 2.0)]
    assert "train/note" not in scalars


@pytest.fixture
def eval_run(tmp_path: Path) -> tuple[runmodel.RunResult, dict[str, list[tuple[int, float]]]]:
    engine = runmodel.Engine()
    engine.attach(TensorBoard(tmp_path, every_steps=1))
    model = tiny()
    result = engine.run(model, mode="eval")
    return result, read(tmp_path)


def test_eval_run_logs_its_metrics(
    eval_run: tuple[runmodel.RunResult, dict[str, list[tuple[int, float]]]],
) -> None:
    result, scalars = eval_run
    assert sorted(result.metrics) == ["accuracy", "loss"]
    assert result.steps == 4
    assert "eval/accuracy" in scalars and "eval/loss" in scalars
    assert not any(tag.startswith(("lr/", "train/")) for tag in scalars)
    assert scalars["eval/accuracy"] == [(4, as_float32(result.metrics["accuracy"]))]
    assert [step for step, _ in scalars["eval/loss_step"]] == [1, 2, 3, 4]


def test_eval_loss_is_logged_once_as_the_metric(
    eval_run: tuple[runmodel.RunResult, dict[str, list[tuple[int, float]]]],
) -> None:
    result, scalars = eval_run
    assert scalars["eval/loss"] == [(4, as_float32(result.metrics["loss"]))]


def test_the_writer_is_closed_after_the_run(tmp_path: Path) -> None:
    pack = TensorBoard(tmp_path)
    engine = runmodel.Engine()
    engine.attach(pack)
    writers: list[Any] = []
    engine.on("setup", lambda e: writers.append(pack.writer), priority=-10)
    engine.run(tiny(), epochs=1)
    [writer] = writers
    assert writer is not None and writer.all_writers is None  # SummaryWriter.close() ran
    assert pack.writer is None


def test_the_writer_is_closed_and_flushed_after_an_error(tmp_path: Path) -> None:
    pack = TensorBoard(tmp_path, every_steps=1)
    engine = runmodel.Engine()
    engine.attach(pack)
    writers: list[Any] = []
    engine.on("setup", lambda e: writers.append(pack.writer), priority=-10)
    with pytest.raises(RuntimeError, match="boom at step 6"):
        engine.run(tiny(fail_at=6), epochs=3)
    [writer] = writers
    assert writer.all_writers is None and pack.writer is None
    scalars = read(tmp_path)
    assert [step for step, _ in scalars["train/loss_step"]] == [1, 2, 3, 4, 5, 6]
    assert [step for step, _ in scalars["train/loss"]] == [4]
    # the pack opens a new writer for the next run
    engine.run(tiny(), epochs=1)
    assert pack.writer is None
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("events.out.")]) == 2


@pytest.mark.parametrize("every_steps", [0, -1, True, 1.5, "2"])
def test_bad_every_steps(tmp_path: Path, every_steps: Any) -> None:
    with pytest.raises(ValueError, match="every_steps= must be a whole number >= 1 or None"):
        TensorBoard(tmp_path, every_steps=every_steps)

"""The training loss shown and logged per epoch is the epoch's mean: a train run puts it
into ``state.metrics["loss"]`` at each epoch's end when a hook or pack of the run reads
that metric (``Progress`` does, and ``reads="loss"`` declares it), summed on the device
and read once an epoch. ``state.loss`` stays each step's; a run that reads nothing adds
nothing to its steps."""

from __future__ import annotations

import io

import torch

import runmodel
from runmodel.packs.progress import Progress

from helpers import Tiny


def step_losses(engine: runmodel.Engine) -> list[list[float]]:
    """Each epoch's step losses, as a script collects them (``loss.item()``)."""
    epochs: list[list[float]] = []
    engine.on("epoch_start", lambda e: epochs.append([]))
    engine.on("runstep", lambda e: epochs[-1].append(e.state.loss.item()))
    return epochs


def script_mean(losses: list[float]) -> float:
    total = 0.0
    for loss in losses:
        total += loss
    return total / len(losses)


def test_a_hook_that_reads_loss_sees_the_epochs_mean_at_its_end() -> None:
    engine = runmodel.Engine()
    epochs = step_losses(engine)
    seen: list[tuple[float, float]] = []
    engine.on(
        "epoch_end",
        lambda e: seen.append((e.state.metrics["loss"], e.state.loss.item())),
        reads="loss",
    )
    result = engine.run(Tiny(), epochs=3)
    assert seen == [(script_mean(losses), losses[-1]) for losses in epochs]
    assert result.metrics["loss"] == script_mean(epochs[-1])
    assert seen[0][0] != seen[0][1]  # the mean, not the last step's loss


def test_a_run_that_reads_no_loss_metric_adds_nothing_per_step() -> None:
    engine = runmodel.Engine()
    result = engine.run(Tiny(), epochs=1)
    assert "loss" not in result.metrics
    assert engine.dispatch.hooks["runstep"] == ()  # the step's phase has no built-in added


def test_progress_shows_the_epochs_mean_loss() -> None:
    out = io.StringIO()
    engine = runmodel.Engine(Progress(file=out))
    epochs = step_losses(engine)
    engine.run(Tiny(), epochs=2)
    lines = out.getvalue().splitlines()
    assert [line.split("  ")[2] for line in lines] == [
        f"loss {script_mean(losses):.4g}" for losses in epochs
    ]
    assert all(line.count(" loss ") == 1 for line in lines)  # once, not again as a metric
    assert f"{script_mean(epochs[0]):.4g}" != f"{epochs[0][-1]:.4g}"


def test_the_mean_is_summed_on_the_losss_device_in_double_precision() -> None:
    engine = runmodel.Engine()
    epochs = step_losses(engine)
    means: list[float] = []
    engine.on("epoch_end", lambda e: means.append(e.state.metrics["loss"]), reads="loss")
    engine.run(Tiny(), epochs=1)
    expected = torch.tensor(epochs[0], dtype=torch.float32).double().sum().item() / 4
    assert means == [expected]


def test_a_long_epoch_sums_every_step_once_in_order() -> None:
    """An epoch longer than the 1,024 steps whose losses a step keeps before they are
    summed: the mean is still a script's sum of its 2,500 losses, in order."""
    engine = runmodel.Engine()
    epochs = step_losses(engine)
    means: list[float] = []
    engine.on("epoch_end", lambda e: means.append(e.state.metrics["loss"]), reads="loss")
    engine.run(Tiny(batches=2500, batch_size=2), epochs=2)
    assert [len(losses) for losses in epochs] == [2500, 2500]
    assert means == [script_mean(losses) for losses in epochs]

"""The EarlyStopping pack: when a run stops, why (result.reason), resume, and mistakes.

Runs train ``helpers.Tiny`` (4 batches an epoch). Most tests give the metric a value per
epoch from a hook (``script``), so when the run must stop is known; others read the real
``eval_loss`` of the Evaluate pack.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

import runmodel
from runmodel.packs import Checkpoint
from runmodel.packs.early_stopping import EarlyStopping
from runmodel.packs.evaluate import Evaluate

from helpers import Tiny


def script(engine: runmodel.Engine, values: list[float], name: str = "score") -> None:
    """``state.metrics[name] = values[epoch]`` at each epoch end, before the check."""
    engine.on(
        "epoch_end",
        lambda e: e.state.metrics.__setitem__(name, values[e.state.epoch]),
        name="script",
    )


def run(
    pack: EarlyStopping, values: list[float], epochs: int | None = None, **options: Any
) -> runmodel.RunResult:
    engine = runmodel.Engine()
    engine.attach(pack)
    if options.get("resume") is not None:  # to take the checkpoint's own state
        engine.attach(Checkpoint(Path(options["resume"]) / "again"))
    script(engine, values)
    return engine.run(Tiny(), epochs=epochs or len(values), **options)


@pytest.mark.parametrize(
    ("values", "options", "stopped_at", "reason"),
    [
        (
            [1.0, 0.5, 0.6, 0.4, 0.45, 0.5, 0.3],
            {"patience": 2},
            5,
            "score did not improve for 2 epochs (best 0.4 at epoch 4, last 0.5)",
        ),
        (
            [1.0, 0.5, 0.6, 0.4, 0.45, 0.5, 0.3],
            {"patience": 2, "min_delta": 0.15},
            3,
            "score did not improve by more than 0.15 for 2 epochs (best 0.5 at epoch 2, last 0.4)",
        ),
        ([1.0, 0.5, 0.6, 0.4, 0.45, 0.5, 0.3], {"patience": 3}, None, None),
        (
            [0.1, 0.3, 0.2, 0.2, 0.2],
            {"patience": 2, "mode": "max"},
            3,
            "score did not improve for 2 epochs (best 0.3 at epoch 2, last 0.2)",
        ),
        (
            [0.1, 0.3, 0.3],
            {"patience": 1, "mode": "max"},
            2,  # equal is no improvement
            "score did not improve for 1 epoch (best 0.3 at epoch 2, last 0.3)",
        ),
        (
            [math.nan, math.nan, 1.0],
            {"patience": 2},
            1,
            "score did not improve for 2 epochs (no value that was a number, last nan)",
        ),
        ([1.0, math.nan, 0.5, math.nan], {"patience": 2}, None, None),  # a NaN is a bad epoch
    ],
)
def test_stops_after_patience_checks_without_improvement(
    values: list[float], options: dict[str, Any], stopped_at: int | None, reason: str | None
) -> None:
    result = run(EarlyStopping("score", **options), values)
    if stopped_at is None:
        assert (result.ended, result.epochs, result.reason) == ("completed", len(values), None)
    else:
        assert result.ended == "stopped"
        assert (result.epochs, result.steps) == (stopped_at + 1, 4 * (stopped_at + 1))
        assert result.reason == f"early stopping: {reason}"


def test_a_flat_loss_is_no_improvement_and_stops_the_run() -> None:
    """min: an equal value does not improve (``value < best - min_delta``, not ``<=``)."""
    result = run(EarlyStopping("score", patience=2), [0.5, 0.5, 0.5, 0.5, 0.5])
    assert (result.ended, result.epochs) == ("stopped", 3)
    assert result.reason == (
        "early stopping: score did not improve for 2 epochs (best 0.5 at epoch 1, last 0.5)"
    )


def test_every_two_epochs_checks_the_2nd_4th_and_so_on() -> None:
    values = [9.0, 1.0, 0.0, 2.0, 0.0, 3.0, 0.0, 0.0]  # epochs 0, 2, 4 are never checked
    pack = EarlyStopping("score", patience=2, every=2)
    result = run(pack, values)
    assert result.epochs == 6 and result.reason == (
        "early stopping: score did not improve for 2 checks 2 epochs apart (best 1 at epoch 2, "
        "last 3)"
    )


def test_reads_the_eval_loss_evaluate_puts_there() -> None:
    # the loss falls every epoch, so with mode="max" each epoch after the first is worse
    engine = runmodel.Engine()
    engine.attach(EarlyStopping("eval_loss", patience=2, mode="max"), Evaluate())  # any order
    losses: list[float] = []
    engine.on("epoch_end", lambda e: losses.append(e.state.metrics["eval_loss"]), priority=-10)
    result = engine.run(Tiny(), epochs=10)
    assert len(losses) == 3 and losses == sorted(losses, reverse=True)
    assert result.epochs == 3 and result.reason == (
        f"early stopping: eval_loss did not improve for 2 epochs (best {losses[0]:.6g} at "
        f"epoch 1, last {losses[2]:.6g})"
    )


def test_an_epoch_cut_short_is_not_a_check() -> None:
    pack = EarlyStopping("score", patience=1)
    result = run(pack, [1.0, 2.0], epochs=2, steps=6)  # epoch 1 ends after 2 of its steps
    assert (result.ended, result.reason) == ("budget", None)
    assert pack.state_dict() == {"best": 1.0, "best_epoch": 0, "bad": 0, "last": 1.0}


def test_eval_runs_are_left_alone() -> None:
    engine = runmodel.Engine()
    engine.attach(EarlyStopping("eval_loss", patience=1))
    assert engine.run(Tiny(), mode="eval").ended == "completed"


# -- resume ------------------------------------------------------------------------------------

VALUES = [1.0, 0.9, 0.95, 0.97, 0.99, 0.98, 0.97, 0.96]  # best at 1; 3 bad epochs by 4


def test_a_resumed_run_continues_the_count(tmp_path: Path) -> None:
    straight = run(EarlyStopping("score", patience=3), VALUES)
    assert (straight.epochs, straight.ended) == (5, "stopped")

    first = runmodel.Engine()
    first.attach(EarlyStopping("score", patience=3), Checkpoint(tmp_path))
    script(first, VALUES)
    first.run(Tiny(), epochs=3)  # one bad epoch (2) so far
    resumed = run(EarlyStopping("score", patience=3), VALUES, resume=tmp_path)
    assert (resumed.epochs, resumed.steps, resumed.reason) == (
        straight.epochs,
        straight.steps,
        straight.reason,
    )


def test_resuming_a_run_that_stopped_early_stops_at_once_unless_patience_grew(
    tmp_path: Path,
) -> None:
    engine = runmodel.Engine()
    engine.attach(EarlyStopping("score", patience=3), Checkpoint(tmp_path))
    script(engine, VALUES)
    stopped = engine.run(Tiny(), epochs=8)
    assert stopped.epochs == 5

    again = run(EarlyStopping("score", patience=3), VALUES, epochs=8, resume=tmp_path)
    assert (again.ended, again.steps, again.epochs, again.reason) == (
        "stopped",
        stopped.steps,
        5,
        stopped.reason,
    )
    more = run(EarlyStopping("score", patience=5), VALUES, epochs=8, resume=tmp_path)
    assert (more.ended, more.epochs) == ("stopped", 7)  # two epochs more: bad epochs 2..6


def test_a_run_from_the_start_forgets_the_last_runs_count() -> None:
    pack = EarlyStopping("score", patience=2)
    engine = runmodel.Engine()
    engine.attach(pack)
    script(engine, [1.0, 2.0, 2.0, 0.5])
    assert engine.run(Tiny(), epochs=4).epochs == 3
    assert engine.run(Tiny(), epochs=1).ended == "completed"
    assert pack.state_dict() == {"best": 1.0, "best_epoch": 0, "bad": 0, "last": 1.0}


# -- mistakes ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ({"patience": -1}, ValueError, r"patience=\) must be a whole number >= 1 .*got -1"),
        ({"patience": 0}, ValueError, r"patience=\) must be a whole number >= 1"),
        ({"patience": 1.5}, ValueError, r"patience=\) must be a whole number >= 1"),
        ({"patience": True}, ValueError, r"patience=\) must be a whole number >= 1"),
        (
            {"mode": "mx"},
            ValueError,
            r"mode=\) must be 'min' .* or 'max' .*; got 'mx'. Did you mean "
            r"'max'\?",
        ),
        ({"mode": "minimize"}, ValueError, r"mode=\) must be 'min'"),
        ({"min_delta": -0.1}, ValueError, r"min_delta=\) must be a number >= 0"),
        ({"min_delta": math.nan}, ValueError, r"min_delta=\) must be a number >= 0"),
        ({"min_delta": "0.1"}, ValueError, r"min_delta=\) must be a number >= 0"),
        ({"metric": ""}, TypeError, r"metric=\) names a metric in state.metrics"),
        ({"metric": 3}, TypeError, r"metric=\) names a metric in state.metrics"),
        ({"every": 0}, ValueError, r"every=\) must be a whole number of epochs >= 1"),
    ],
)
def test_bad_options_fail_at_construction(args: dict[str, Any], error: type, match: str) -> None:
    options = {"metric": "eval_loss", "patience": 3, **args}
    with pytest.raises(error, match=match) as caught:
        EarlyStopping(**options)
    assert "\n" not in str(caught.value)


def test_a_misspelt_metric_stops_the_run_at_setup_with_a_did_you_mean() -> None:
    engine = runmodel.Engine()
    engine.attach(EarlyStopping("eval_los", patience=2), Evaluate())
    with pytest.raises(ValueError) as caught:
        engine.run(Tiny(), epochs=3)
    assert str(caught.value).startswith(
        "EarlyStopping reads the metric 'eval_los', which nothing in this run writes. Did you "
        "mean 'eval_loss' (written by Evaluate)?"
    )
    assert engine.state.step == 0  # before the first step


def test_a_metric_nothing_writes_stops_the_run_at_setup_naming_where_it_comes_from() -> None:
    engine = runmodel.Engine()
    engine.attach(EarlyStopping("eval_accuracy", patience=2))  # no Evaluate attached
    with pytest.raises(ValueError) as caught:
        engine.run(Tiny(), epochs=3)
    assert str(caught.value).startswith(
        "EarlyStopping reads the metric 'eval_accuracy', which nothing in this run writes. "
        "Evaluation metrics come from an Evaluate pack: engine.attach(Evaluate()) measures "
        "'eval_accuracy' from the model's metric 'accuracy'. Declared: loss."
    )
    assert engine.state.step == 0  # before the first step


def test_beside_a_hook_that_declares_no_writes_an_unknown_metric_fails_at_the_first_check() -> None:
    engine = runmodel.Engine()
    engine.attach(EarlyStopping("eval_los", patience=2))  # nothing close is declared

    @engine.on("epoch_end")
    def score(engine: runmodel.Engine) -> None:  # may write metrics without declaring them
        engine.state.metrics["score"] = 1.0

    with pytest.raises(ValueError) as caught:
        engine.run(Tiny(), epochs=3)
    assert str(caught.value) == (
        "EarlyStopping: no metric 'eval_los' in state.metrics at the end of epoch 0. There are: "
        "score (attach Evaluate() for eval_loss and the other eval_ metrics; a hook that puts a "
        "metric there can declare it with writes=)"
    )
    assert engine.state.step == 4  # the first epoch ran, nothing after


def test_a_metric_that_is_not_a_number_is_a_clear_error() -> None:
    engine = runmodel.Engine()
    engine.attach(EarlyStopping("score", patience=2))
    engine.on("epoch_end", lambda e: e.state.metrics.__setitem__("score", "high"))
    with pytest.raises(TypeError, match=r"state.metrics\['score'\] is str 'high', not a number"):
        engine.run(Tiny(), epochs=1)


def test_checkpoint_keeps_the_best_epoch_by_the_metric_early_stopping_watches(
    tmp_path: Path,
) -> None:
    # mode="max" on a falling eval loss: epoch 0 is the best, and stays the kept one
    engine = runmodel.Engine()
    engine.attach(
        Evaluate(),
        EarlyStopping("eval_loss", patience=2, mode="max"),
        Checkpoint(tmp_path, best=("eval_loss", "max")),
    )
    losses: list[float] = []
    engine.on("epoch_end", lambda e: losses.append(e.state.metrics["eval_loss"]), priority=-10)
    result = engine.run(Tiny(), epochs=10)
    assert result.epochs == 3
    best = sorted(p.name for p in tmp_path.glob("best-*.pt"))
    assert best == [f"best-eval_loss={losses[0]:.6g}-00001-0000000004.pt"]

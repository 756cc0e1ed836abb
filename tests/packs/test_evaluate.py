"""The Evaluate pack: ignite metrics over eval data during training, into state.metrics.

The model (``helpers.Tiny``) is a 3-class classifier (cross-entropy, so its metrics are
loss and accuracy) or a regression, on 4 fixed batches of 8 an epoch, with 4 other fixed
batches as its eval data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from ignite.metrics import Accuracy, MeanAbsoluteError
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import DataLoader, TensorDataset

import runmodel
from runmodel.packs import Checkpoint, TensorBoard
from runmodel.packs.evaluate import Evaluate

from helpers import Counting, Tiny, assert_equal_params, dropout_mlp, make_data


def watch(model: Tiny) -> list[tuple[bool, bool]]:
    """(training, grad enabled) at each forward of the model's module."""
    calls: list[tuple[bool, bool]] = []
    model.module.register_forward_hook(
        lambda m, args, out: calls.append((m.training, torch.is_grad_enabled()))
    )
    return calls


def evaluations(calls: list[tuple[bool, bool]]) -> int:
    """How many evaluations of 4 batches the forwards were."""
    assert all(not grad for training, grad in calls if not training)  # no grad in any
    return sum(1 for training, _ in calls if not training) // 4


def test_each_epoch_end_puts_eval_metrics_the_eval_mode_would_compute() -> None:
    model, engine = Tiny(classes=3), runmodel.Engine()
    engine.attach(Evaluate())
    seen: list[dict[str, Any]] = []
    engine.on("epoch_end", lambda e: seen.append(dict(e.state.metrics)), priority=-10)
    calls = watch(model)
    result = engine.run(model, epochs=3)
    assert [sorted(m) for m in seen] == [["eval_accuracy", "eval_loss"]] * 3
    losses = [m["eval_loss"] for m in seen]
    assert losses == sorted(losses, reverse=True) and len(set(losses)) == 3  # it trains
    # 3 evaluations, without grad; the module back in train mode for the next step
    assert evaluations(calls) == 3
    assert [training for training, _ in calls[: 4 + 4 + 1]] == [True] * 4 + [False] * 4 + [True]
    assert model.module.training
    # what eval mode computes on the final weights, exactly
    evaluated = runmodel.Engine().run(model, mode="eval").metrics
    assert result.metrics == {
        "eval_loss": evaluated["loss"],
        "eval_accuracy": evaluated["accuracy"],
    }


def test_every_two_epochs_costs_nothing_in_between() -> None:
    model, engine = Tiny(classes=3), runmodel.Engine()
    engine.attach(Evaluate(every=2))
    calls = watch(model)
    done: list[int] = []
    engine.on("epoch_end", lambda e: done.append(evaluations(calls)), priority=-10)
    engine.run(model, epochs=5)
    assert done == [0, 1, 1, 2, 2]  # at the end of the 2nd and the 4th epoch


def test_every_three_steps_evaluates_after_those_steps() -> None:
    model, engine = Tiny(classes=3), runmodel.Engine()
    engine.attach(Evaluate(every="3st"))
    calls = watch(model)
    done: list[int] = []
    engine.on("runstep", lambda e: done.append(evaluations(calls)), priority=-10)
    result = engine.run(model, epochs=2)
    assert done == [0, 0, 1, 1, 1, 2, 2, 2]  # after the 3rd and the 6th step
    assert sorted(result.metrics) == ["eval_accuracy", "eval_loss"]


def test_given_data_metrics_and_prefix() -> None:
    data = make_data(2, classes=3, seed=5)
    model, engine = Tiny(classes=3), runmodel.Engine()
    engine.attach(Evaluate(data=data, metrics={"acc": Accuracy()}, prefix="val_"))
    result = engine.run(model, epochs=1)
    assert result.metrics == {"val_acc": runmodel.evaluate(model, data, {"acc": Accuracy()})["acc"]}


def test_regression_metrics_and_two_evaluations_side_by_side() -> None:
    model, engine = Tiny(), runmodel.Engine()
    engine.attach(
        Evaluate(),
        Evaluate(data=make_data(2, seed=7), metrics={"mae": MeanAbsoluteError()}, prefix="val_"),
    )  # test_ is the test split's (reserved)
    result = engine.run(model, epochs=2)
    assert sorted(result.metrics) == ["eval_loss", "val_mae"]
    assert (
        result.metrics["val_mae"]
        == runmodel.evaluate(model, make_data(2, seed=7), {"mae": MeanAbsoluteError()})["mae"]
    )


def test_evaluating_with_isolate_rng_does_not_change_the_training() -> None:
    # dropout draws from the generator, and so does iterating a shuffled DataLoader: unless
    # evaluation puts the generator back, the training after it takes other dropout masks
    x, y = make_data(1, 32)[0]
    shuffled = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    plain, evaluated = dropout_mlp(), dropout_mlp()
    torch.manual_seed(1)
    runmodel.Engine().run(plain, epochs=3)
    engine = runmodel.Engine()
    engine.attach(Evaluate(data=shuffled, isolate_rng=True))
    torch.manual_seed(1)
    result = engine.run(evaluated, epochs=3)
    assert "eval_loss" in result.metrics
    assert_equal_params(plain, evaluated)


def test_eval_runs_are_left_alone() -> None:
    model, engine = Tiny(classes=3), runmodel.Engine()
    engine.attach(Evaluate())
    calls = watch(model)
    result = engine.run(model, mode="eval")
    assert sorted(result.metrics) == ["accuracy", "loss"] and len(calls) == 4


def test_tensorboard_logs_the_eval_metrics(tmp_path: Path) -> None:
    engine = runmodel.Engine()
    engine.attach(Evaluate(), TensorBoard(tmp_path))
    seen: list[float] = []
    engine.on("epoch_end", lambda e: seen.append(e.state.metrics["eval_loss"]), priority=-10)
    engine.run(Tiny(classes=3), epochs=2)
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert {"train/eval_loss", "train/eval_accuracy"} <= set(events.Tags()["scalars"])
    logged = [(s.step, s.value) for s in events.Scalars("train/eval_loss")]
    assert logged == [(4, pytest.approx(seen[0], rel=1e-6)), (8, pytest.approx(seen[1], rel=1e-6))]


def test_a_resumed_run_has_the_metrics_a_straight_one_has(tmp_path: Path) -> None:
    # evaluated at the 2nd epoch only: the resumed run (the 3rd epoch) evaluates nothing, and
    # still ends with the values of the evaluation before the checkpoint
    straight = runmodel.Engine()
    straight.attach(Evaluate(every=2))
    expected = straight.run(Tiny(classes=3), epochs=3).metrics
    assert sorted(expected) == ["eval_accuracy", "eval_loss"]
    first = runmodel.Engine()
    first.attach(Evaluate(every=2), Checkpoint(tmp_path))
    first.run(Tiny(classes=3), epochs=2)
    second, model = runmodel.Engine(), Tiny(classes=3)
    second.attach(Evaluate(every=2), Checkpoint(tmp_path / "again", overwrite=True))
    calls = watch(model)
    result = second.run(model, epochs=3, resume=tmp_path)
    assert evaluations(calls) == 0
    assert result.metrics == expected
    # and a run from the start with the same pack does not inherit them
    assert second.run(Tiny(classes=3), epochs=1).metrics == {}


# -- mistakes -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ({"every": 0}, ValueError, r"every= must be at least 1"),
        ({"every": "3 parsecs"}, ValueError, r"is not a duration"),
        ({"data": iter(make_data(1))}, TypeError, r"data=\) is a one-shot iterator"),
        ({"data": 5}, TypeError, r"data=\) takes the batches to evaluate on"),
        ({"metrics": {"acc": 3}}, TypeError, r"metrics=\) takes a dict of names to pytorch-ignite"),
        ({"metrics": {}}, TypeError, r"metrics=\) takes a dict of names to pytorch-ignite"),
        ({"metrics": [Accuracy()]}, TypeError, r"metrics=\) takes a dict of names"),
        ({"prefix": 3}, TypeError, r"prefix=\) must be a string"),
        ({"modes": "trian"}, ValueError, r"unknown mode"),
    ],
)
def test_bad_options_fail_at_construction(args: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match) as caught:
        Evaluate(**args)
    assert "\n" not in str(caught.value)


class NoEvalData(Tiny):
    def setup(self, setup_options: dict[str, Any] | None = None) -> None:
        super().setup(setup_options)
        self.eval_data = None


@pytest.mark.parametrize(
    ("model", "error", "match"),
    [
        (
            NoEvalData(),
            ValueError,
            r"Evaluate: NoEvalData has no eval_data; set it in the model's "
            r"setup\(\) or give Evaluate\(data=...\)",
        ),
        (Counting(), TypeError, r"Evaluate needs a TorchModel"),
    ],
)
def test_a_model_it_cannot_evaluate_fails_before_the_first_step(
    model: Any, error: type, match: str
) -> None:
    engine = runmodel.Engine()
    engine.attach(Evaluate())
    steps: list[int] = []
    engine.on("runstep", lambda e: steps.append(e.state.step))
    with pytest.raises(error, match=match):
        engine.run(model, epochs=1)
    assert steps == []

"""MetricWatcher: one metric watched from check to check (better by min or max, by more
than min_delta; the best and its epoch; checks in a row without improvement against a
patience), shared by EarlyStopping, LRSchedule's plateau and best-K checkpoints."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from runmodel.packs.metric_watcher import MetricWatcher


def state(epoch: int, **metrics: float) -> SimpleNamespace:
    return SimpleNamespace(epoch=epoch, metrics=metrics, loss=None)


def test_min_counts_the_checks_without_an_improvement_beyond_min_delta() -> None:
    watcher = MetricWatcher("eval_loss", "min", min_delta=0.1, patience=2)
    found = [watcher.check(state(e, eval_loss=v)) for e, v in enumerate([1.0, 0.95, 0.8, 0.9])]
    assert found == [True, False, True, False]
    assert (watcher.best, watcher.best_epoch, watcher.bad, watcher.last) == (0.8, 2, 1, 0.9)
    assert not watcher.exhausted
    watcher.check(state(4, eval_loss=math.nan))  # NaN never improves
    assert watcher.exhausted and watcher.best == 0.8


def test_max_and_its_ranking_keep_the_best_first_and_the_older_of_equals() -> None:
    watcher = MetricWatcher("eval_accuracy", "max")
    assert watcher.improves(0.5) and watcher.update(0.5, 0) and not watcher.improves(0.5)
    ranked = watcher.best_first([(0.5, "a"), (0.7, "b"), (0.5, "c"), (0.6, "d")], keep=3)
    assert ranked == [(0.7, "b"), (0.6, "d"), (0.5, "a")]
    assert MetricWatcher("loss").best_first([(2.0, "x"), (1.0, "y")]) == [(1.0, "y"), (2.0, "x")]


def test_its_record_survives_a_checkpoint_and_a_reset_forgets_it() -> None:
    watcher = MetricWatcher("eval_loss", patience=3)
    for epoch, value in enumerate([1.0, 2.0, 3.0]):
        watcher.update(value, epoch)
    saved = watcher.state_dict()
    again = MetricWatcher("eval_loss", patience=3)
    again.load_state_dict(saved)
    assert again.state_dict() == saved == {"best": 1.0, "best_epoch": 0, "bad": 2, "last": 3.0}
    again.reset()
    assert again.state_dict() == {"best": None, "best_epoch": None, "bad": 0, "last": None}


def test_reading_a_missing_metric_names_the_reader_and_the_metrics_there_are() -> None:
    watcher = MetricWatcher("eval_los", owner="LRSchedule", reader="LRSchedule(metric='eval_los')")
    with pytest.raises(
        ValueError,
        match=r"LRSchedule\(metric='eval_los'\): no metric 'eval_los' "
        r"in state.metrics at the end of epoch 1. Did you mean "
        r"'eval_loss'\? There are: eval_loss",
    ):
        watcher.read(state(1, eval_loss=0.5))


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ({"metric": ""}, TypeError, r"Best\(metric=\) names a metric"),
        (
            {"mode": "mx"},
            ValueError,
            r"Best\(mode=\) must be 'min' .*; got 'mx'. Did you mean 'max'",
        ),
        ({"min_delta": -1}, ValueError, r"Best\(min_delta=\) must be a number >= 0"),
        ({"patience": 0}, ValueError, r"Best\(patience=\) must be a whole number >= 1 or None"),
    ],
)
def test_bad_options_are_refused_in_the_owners_name(
    args: dict[str, object], error: type, match: str
) -> None:
    with pytest.raises(error, match=match):
        MetricWatcher(**{"metric": "eval_loss", **args, "owner": "Best"})  # type: ignore[arg-type]

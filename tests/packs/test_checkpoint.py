"""The Checkpoint pack: checkpoint names, every=, keep= and pruning, in train runs only.

The model (``helpers.dropout_mlp``) trains a small MLP with dropout and Adam on 4 fixed
batches an epoch. What a checkpoint file holds, and resuming from it, are tested in
tests/checkpoint/test_resume_from_files.py.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch

import runmodel
from runmodel.checkpoint import checkpoints_in
from runmodel.packs import Checkpoint

from helpers import Tiny, assert_same, dropout_mlp, files, train_with_checkpoints

BATCHES = 4  # per epoch


# -- names, pruning, every= and keep= -------------------------------------------------------


def test_epoch_checkpoints_are_named_for_where_a_resume_starts_and_pruned(tmp_path: Path) -> None:
    engine = runmodel.Engine()
    pack = Checkpoint(tmp_path, every="1ep", keep=2)
    engine.attach(pack)
    seen: list[list[str]] = []
    engine.on("epoch_end", lambda e: seen.append(files(tmp_path)), priority=-2000)  # after save
    result = engine.run(dropout_mlp(), epochs=4)
    assert result.steps == 16
    assert seen == [
        ["ckpt-00001-0000000004.pt"],
        ["ckpt-00001-0000000004.pt", "ckpt-00002-0000000008.pt"],
        ["ckpt-00002-0000000008.pt", "ckpt-00003-0000000012.pt"],
        ["ckpt-00003-0000000012.pt", "ckpt-00004-0000000016.pt"],
    ]
    assert files(tmp_path) == seen[-1]
    assert pack.saved == seen[-1]
    assert [p.name for p in checkpoints_in(tmp_path)] == seen[-1][::-1]  # newest first
    for name in seen[-1]:
        epoch, step = map(int, re.fullmatch(r"ckpt-(\d{5})-(\d{10})\.pt", name).groups())
        state = torch.load(tmp_path / name, weights_only=True)
        assert state["engine"]["counters"] == {
            "epoch": epoch,
            "step": step,
            "epoch_step": 0,
            "skipped": 0,
        }


def test_every_two_epochs_and_keep_none(tmp_path: Path) -> None:
    train_with_checkpoints(tmp_path, epochs=5, every="2ep", keep=None)
    assert files(tmp_path) == ["ckpt-00002-0000000008.pt", "ckpt-00004-0000000016.pt"]


def test_every_three_steps_saves_after_each_third_step(tmp_path: Path) -> None:
    train_with_checkpoints(tmp_path, epochs=2, every="3st", keep=None)
    # 8 steps: saved after the 3rd (epoch 0) and the 6th (the 2nd of epoch 1)
    assert files(tmp_path) == ["ckpt-00000-0000000003.pt", "ckpt-00001-0000000006.pt"]
    first = torch.load(tmp_path / "ckpt-00000-0000000003.pt", weights_only=True)
    second = torch.load(tmp_path / "ckpt-00001-0000000006.pt", weights_only=True)
    assert first["engine"]["counters"] == {"step": 3, "epoch": 0, "epoch_step": 3, "skipped": 0}
    assert second["engine"]["counters"] == {"step": 6, "epoch": 1, "epoch_step": 2, "skipped": 0}
    # the weights are those after the 3rd optimizer step
    three = dropout_mlp()
    runmodel.Engine().run(three, steps=3)
    assert_same(first["model"]["module"], three.module.state_dict(), "model")
    assert_same(first["model"]["optimizer"], three.optimizer.state_dict(), "optimizer")


def test_a_mid_epoch_checkpoint_continues_the_counters(tmp_path: Path) -> None:
    train_with_checkpoints(tmp_path, epochs=1, every="3st", keep=None)
    starts: list[tuple[int, int]] = []
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path / "again", every="3st"))
    engine.on("step_start", lambda e: starts.append((e.state.epoch, e.state.step)))
    result = engine.run(dropout_mlp(), steps=5, resume=tmp_path / "ckpt-00000-0000000003.pt")
    # epoch 0 goes on after its 3 batches: its 4th is step 3; step 4 opens epoch 1
    assert starts == [(0, 3), (1, 4)]
    assert (result.steps, result.epochs, result.ended) == (5, 1, "budget")


@pytest.mark.parametrize(
    ("every", "error", "match"),
    [
        (0, ValueError, "every= must be at least 1"),
        (-2, ValueError, "every= must be at least 1"),
        ("0ep", ValueError, "more than zero"),
        ("1.5ep", ValueError, "whole numbers"),
        ("3 parsecs", ValueError, "is not a duration"),
        ("ep", ValueError, "is not a duration"),
        (True, TypeError, "every= takes a positive int or a duration"),
        (2.0, TypeError, "every= takes a positive int or a duration"),
        (None, TypeError, "every= takes a positive int or a duration"),
    ],
)
def test_bad_every_fails_at_construction(
    tmp_path: Path, every: Any, error: type, match: str
) -> None:
    with pytest.raises(error, match=match):
        Checkpoint(tmp_path, every=every)
    assert files(tmp_path) == []


@pytest.mark.parametrize("keep", [0, -1, True, False, 1.5, "2"])
def test_bad_keep_fails_at_construction(tmp_path: Path, keep: Any) -> None:
    with pytest.raises(ValueError, match=r"keep= must be a whole number >= 1 or None"):
        Checkpoint(tmp_path, keep=keep)


def test_keep_one(tmp_path: Path) -> None:
    train_with_checkpoints(tmp_path, epochs=3, keep=1)
    assert files(tmp_path) == ["ckpt-00003-0000000012.pt"]


# -- mid-epoch checkpoints, keep= across a resume, eval runs --------------------------------


def test_a_budget_that_ends_mid_epoch_does_not_mark_the_epoch_done(tmp_path: Path) -> None:
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path, keep=None))
    result = engine.run(dropout_mlp(), steps=6)  # epoch 0, and half of epoch 1
    assert (result.steps, result.epochs, result.ended) == (6, 1, "budget")
    assert not any(name.startswith("ckpt-00002-") for name in files(tmp_path))
    steps: list[tuple[int, int]] = []
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path / "second"))
    engine.on("runstep", lambda e: steps.append((e.state.epoch, e.state.step)))
    resumed = engine.run(dropout_mlp(), epochs=2, resume=tmp_path)
    assert resumed.steps >= 8 and (1, 7) in steps


def test_keep_still_holds_after_a_resume(tmp_path: Path) -> None:
    train_with_checkpoints(tmp_path, epochs=2, keep=2)
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path, keep=2))
    engine.run(dropout_mlp(), epochs=4, resume=tmp_path)
    assert files(tmp_path) == ["ckpt-00003-0000000012.pt", "ckpt-00004-0000000016.pt"]


def test_saving_leaves_no_temporary_files(tmp_path: Path) -> None:
    train_with_checkpoints(tmp_path, epochs=3, every="1st", keep=3)
    assert files(tmp_path) == [
        "ckpt-00002-0000000010.pt",
        "ckpt-00002-0000000011.pt",
        "ckpt-00003-0000000012.pt",
    ]


def test_no_checkpoints_in_eval_mode(tmp_path: Path) -> None:
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path / "ckpt", every="1st"))
    result = engine.run(dropout_mlp(), mode="eval")
    assert result.steps == BATCHES and not (tmp_path / "ckpt").exists()


# -- the best K by a metric -------------------------------------------------------------------

SCORES = [0.5, 0.9, 0.7, 0.95, 0.6, 0.8]  # eval_accuracy at the end of epochs 0..5


def scored(engine: runmodel.Engine, scores: list[float] = SCORES) -> None:
    """A hook that puts a known eval_accuracy into the metrics at each epoch's end, before
    the checkpoint is saved (as an Evaluate pack would)."""
    engine.on(
        "epoch_end",
        lambda e: e.state.metrics.update(
            eval_accuracy=scores[e.state.epoch], eval_loss=1 - scores[e.state.epoch]
        ),
    )


def best_files(directory: Path) -> list[str]:
    return [name for name in files(directory) if name.startswith("best-")]


def test_best_k_by_a_metric_beside_the_newest(tmp_path: Path) -> None:
    engine = runmodel.Engine()
    scored(engine)
    engine.attach(Checkpoint(tmp_path, keep=2, best=("eval_accuracy", "max"), keep_best=2))
    engine.run(dropout_mlp(), epochs=6)
    assert best_files(tmp_path) == [
        "best-eval_accuracy=0.9-00002-0000000008.pt",
        "best-eval_accuracy=0.95-00004-0000000016.pt",
    ]
    assert checkpoints_in(tmp_path)[0].name == "ckpt-00006-0000000024.pt"  # resume: the newest
    assert sorted(set(files(tmp_path)) - set(best_files(tmp_path))) == [
        "ckpt-00005-0000000020.pt",
        "ckpt-00006-0000000024.pt",
    ]
    # a best file is that epoch's checkpoint: it resumes where it was taken
    best = torch.load(tmp_path / "best-eval_accuracy=0.95-00004-0000000016.pt", weights_only=True)
    assert best["engine"]["counters"]["step"] == 16 and best["engine"]["counters"]["epoch"] == 4
    model, steps = dropout_mlp(), []
    again = runmodel.Engine()
    again.on("step_start", lambda e: steps.append(e.state.step))
    with pytest.warns(UserWarning, match="saved state of pack 'checkpoint' has no attached"):
        again.run(model, epochs=5, resume=tmp_path / "best-eval_accuracy=0.95-00004-0000000016.pt")
    assert steps == [16, 17, 18, 19]


def test_best_by_a_loss_keeps_the_lowest(tmp_path: Path) -> None:
    engine = runmodel.Engine()
    scored(engine)
    engine.attach(Checkpoint(tmp_path, keep=1, best=("eval_loss", "min")))
    engine.run(dropout_mlp(), epochs=6)
    [best] = best_files(tmp_path)
    assert best.startswith("best-eval_loss=0.05") and best.endswith("-00004-0000000016.pt")


@pytest.mark.parametrize("mode", ["max", "min"])
def test_a_nan_epoch_never_becomes_the_best(tmp_path: Path, mode: str) -> None:
    """NaN compares false with everything, so a sort leaves it where it is: taken first,
    it would stay the best of keep_best=1 whatever came after. The first epoch scores NaN
    (both metrics are NaN), the third the best."""
    engine = runmodel.Engine()
    scored(engine, [math.nan, 0.5, 0.6, 0.4])
    metric = "eval_accuracy" if mode == "max" else "eval_loss"
    pack = Checkpoint(tmp_path, keep=1, best=(metric, mode))
    engine.attach(pack)
    engine.run(dropout_mlp(), epochs=4)
    best = "eval_accuracy=0.6" if mode == "max" else "eval_loss=0.4"
    assert best_files(tmp_path) == [f"best-{best}-00003-0000000012.pt"]
    assert [value for value, _ in pack.best_saved] == [0.6 if mode == "max" else 0.4]


def test_the_best_ranking_carries_over_a_resume(tmp_path: Path) -> None:
    first = runmodel.Engine()
    scored(first)
    first.attach(Checkpoint(tmp_path, best=("eval_accuracy", "max")))
    first.run(dropout_mlp(), epochs=3)  # best so far: 0.9 at epoch 1
    second = runmodel.Engine()
    scored(second, [1.0, 1.0, 1.0, 0.85, 0.6, 0.8])  # after the resume, none beats 0.9
    second.attach(Checkpoint(tmp_path, best=("eval_accuracy", "max")))
    second.run(dropout_mlp(), epochs=6, resume=tmp_path)
    assert best_files(tmp_path) == ["best-eval_accuracy=0.9-00002-0000000008.pt"]


def test_a_best_metric_that_is_not_there_is_a_clear_error_at_the_first_save(tmp_path: Path) -> None:
    engine = runmodel.Engine()
    engine.on("epoch_end", lambda e: e.state.metrics.update(eval_loss=0.3))
    engine.attach(Checkpoint(tmp_path, best=("eval_acc", "max")))
    with pytest.raises(
        ValueError,
        match=r"no metric 'eval_acc' in engine.state.metrics at "
        r"epoch 1, step 4; there are: eval_loss",
    ):
        engine.run(dropout_mlp(), epochs=3)
    assert files(tmp_path) == []  # nothing half-written


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"best": "eval_accuracy"}, r"best= names a metric and whether lower or higher is better"),
        ({"best": ("eval_accuracy", "maximum")}, r"best= names a metric"),
        ({"best": ("eval_accuracy", "max"), "keep_best": 0}, r"keep_best= must be a whole number"),
    ],
)
def test_bad_best_options_fail_at_construction(
    tmp_path: Path, options: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        Checkpoint(tmp_path, **options)


def test_a_best_metric_a_typo_away_is_refused_at_setup(tmp_path: Path) -> None:
    """Checkpoint declares what it reads (``reads``): the setup check finds a typo in
    ``best=`` before the first step, not at the end of the first epoch."""
    from runmodel.packs import Evaluate

    engine, steps = runmodel.Engine(), []
    engine.on("step_start", lambda e: steps.append(e.state.step))
    pack = Checkpoint(tmp_path, best=("eval_acuracy", "max"))
    assert pack.reads == ("eval_acuracy",)
    engine.attach(Evaluate(), pack)
    with pytest.raises(
        ValueError,
        match=r"Checkpoint reads the metric 'eval_acuracy', which "
        r"nothing in this run writes\. Did you mean "
        r"'eval_accuracy' \(written by Evaluate\)",
    ):
        engine.run(Tiny(classes=3, hidden=8), epochs=2)  # a classifier: eval_accuracy
    assert steps == [] and files(tmp_path) == []


def test_two_checkpoint_packs_on_one_folder_are_refused_at_setup(tmp_path: Path) -> None:
    engine, steps = runmodel.Engine(), []
    engine.on("step_start", lambda e: steps.append(e.state.step))
    engine.attach(
        Checkpoint(tmp_path / "ckpt", every="1ep"),
        Checkpoint(tmp_path / "other" / ".." / "ckpt", every="2st", keep=1),
    )
    with pytest.raises(
        ValueError,
        match=r"Checkpoint packs 'checkpoint' and 'checkpoint#2' "
        r"both write to .*: each would delete the other's "
        r"checkpoints as its own old ones\. Give each its own "
        r"folder",
    ):
        engine.run(dropout_mlp(), epochs=1)
    assert steps == [] and not (tmp_path / "ckpt").exists()
    again = runmodel.Engine()  # two folders: both write
    again.attach(Checkpoint(tmp_path / "a", every="1ep"), Checkpoint(tmp_path / "b", every="2st"))
    again.run(dropout_mlp(), epochs=1)
    assert files(tmp_path / "a") == ["ckpt-00001-0000000004.pt"]
    assert files(tmp_path / "b") == ["ckpt-00000-0000000002.pt", "ckpt-00001-0000000004.pt"]

"""The Checkpoint pack: checkpoint names, every=, keep= and pruning, in train runs only.

The model (``helpers.dropout_mlp``) trains a small MLP with dropout and Adam on 4 fixed
batches an epoch. What a checkpoint file holds, and resuming from it, are tested in
tests/test_resume.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

import runmodel
from runmodel.checkpoint import checkpoints_in
from runmodel.packs import Checkpoint

from helpers import assert_same, dropout_mlp, files, train_with_checkpoints

BATCHES = 4  # per epoch


# -- names, pruning, every= and keep= -------------------------------------------------------

def test_epoch_checkpoints_are_named_for_where_a_resume_starts_and_pruned(
        tmp_path: Path) -> None:
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
        ["ckpt-00003-0000000012.pt", "ckpt-00004-0000000016.pt"]]
    assert files(tmp_path) == seen[-1]
    assert pack.saved == seen[-1]
    assert [p.name for p in checkpoints_in(tmp_path)] == seen[-1][::-1]  # newest first
    for name in seen[-1]:
        epoch, step = map(int, re.fullmatch(r"ckpt-(\d{5})-(\d{10})\.pt", name).groups())
        state = torch.load(tmp_path / name, weights_only=True)
        assert state["engine"]["counters"] == {"epoch": epoch, "step": step, "epoch_step": 0,
                                               "skipped": 0}


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
    assert second["engine"]["counters"] == {"step": 6, "epoch": 1, "epoch_step": 2,
                                            "skipped": 0}
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
    assert starts == [(0, 3), (0, 4)]
    assert (result.steps, result.epochs, result.ended) == (5, 0, "budget")


@pytest.mark.parametrize(("every", "error", "match"), [
    (0, ValueError, "every= must be at least 1"),
    (-2, ValueError, "every= must be at least 1"),
    ("0ep", ValueError, "more than zero"),
    ("1.5ep", ValueError, "whole numbers"),
    ("3 parsecs", ValueError, "is not a duration"),
    ("ep", ValueError, "is not a duration"),
    (True, TypeError, "every= takes a positive int or a duration"),
    (2.0, TypeError, "every= takes a positive int or a duration"),
    (None, TypeError, "every= takes a positive int or a duration"),
])
def test_bad_every_fails_at_construction(tmp_path: Path, every: Any, error: type,
                                         match: str) -> None:
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
    assert files(tmp_path) == ["ckpt-00002-0000000010.pt", "ckpt-00002-0000000011.pt",
                               "ckpt-00002-0000000012.pt"]


def test_no_checkpoints_in_eval_mode(tmp_path: Path) -> None:
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path / "ckpt", every="1st"))
    result = engine.run(dropout_mlp(), mode="eval")
    assert result.steps == BATCHES and not (tmp_path / "ckpt").exists()

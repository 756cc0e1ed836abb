"""Checkpoint files and the Checkpoint pack: names, pruning, contents, exact resume,
atomic writes, corrupt and hostile files, and resume= errors.

The model trains a small MLP with dropout and Adam on a fixed list of batches, so that
an exact resume needs the weights, the optimizer's state and the random number
generator's state all restored.
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import runmodel
from runmodel import checkpoint
from runmodel.checkpoint import checkpoints_in
from runmodel.packs import Checkpoint

BATCHES = 4  # per epoch


def make_data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8 * BATCHES, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.25
    return [(x[i:i + 8], y[i:i + 8]) for i in range(0, 8 * BATCHES, 8)]


class Tiny(runmodel.TorchModel):
    """Linear-dropout-linear, Adam: weights, optimizer and rng all matter on resume."""

    def __init__(self) -> None:
        super().__init__("cpu")
        torch.manual_seed(0)
        self.module = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.25), nn.Linear(8, 1))
        self.calls: list[str] = []

    def setup(self, setup_options: dict[str, Any] | None = None) -> None:
        self.calls.append("setup")
        self.optimizer = torch.optim.Adam(self.module.parameters(), lr=0.05)
        self.loss_fn = nn.MSELoss()
        self.train_data = make_data()

    def teardown(self) -> None:
        self.calls.append("teardown")


def params(model: Tiny) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.module.parameters()]


def assert_same(a: Any, b: Any, where: str = "state") -> None:
    """Nested dicts, lists and tuples of tensors and plain values, compared exactly."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a, key=str) == sorted(b, key=str), where
        for key in a:
            assert_same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def attach_filters(engine: runmodel.Engine, log: list[tuple[str, int, int]]) -> None:
    """Hooks with counting filters of each kind; each records where it fired."""
    def record(tag: str) -> Any:
        return lambda e: log.append((tag, e.state.epoch, e.state.step))

    engine.on("runstep", record("runstep every=3"), every=3)
    engine.on("epoch_end", record("epoch_end every=2"), every=2)
    engine.on("runstep", record("runstep every=1ep"), every="1ep")
    engine.on("epoch_end", record("epoch_end every=6st"), every="6st")
    engine.on("step_start", record("step_start once=10"), once=10)
    engine.on("epoch_start", record("epoch_start once=2"), once=2)
    engine.on("runstep", record("runstep once=3ep"), once="3ep")


def straight(epochs: int = 4) -> tuple[Tiny, runmodel.RunResult, list[tuple[str, int, int]]]:
    model, engine, log = Tiny(), runmodel.Engine(), []
    attach_filters(engine, log)
    result = engine.run(model, epochs=epochs)
    return model, result, log


def train_with_checkpoints(directory: Path, epochs: int = 2, **options: Any
                           ) -> tuple[Tiny, runmodel.Engine, list[tuple[str, int, int]]]:
    model, engine, log = Tiny(), runmodel.Engine(), []
    engine.attach(Checkpoint(directory, **options))
    attach_filters(engine, log)
    engine.run(model, epochs=epochs)
    return model, engine, log


def files(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


# -- names, pruning, every= ---------------------------------------------------------------

def test_epoch_checkpoints_are_named_for_where_a_resume_starts_and_pruned(
        tmp_path: Path) -> None:
    engine = runmodel.Engine()
    pack = Checkpoint(tmp_path, every="1ep", keep=2)
    engine.attach(pack)
    seen: list[list[str]] = []
    engine.on("epoch_end", lambda e: seen.append(files(tmp_path)), priority=-2000)  # after save
    result = engine.run(Tiny(), epochs=4)
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
    three = Tiny()
    runmodel.Engine().run(three, steps=3)
    assert_same(first["model"]["module"], three.module.state_dict(), "model")
    assert_same(first["model"]["optimizer"], three.optimizer.state_dict(), "optimizer")


def test_a_mid_epoch_checkpoint_continues_the_counters(tmp_path: Path) -> None:
    train_with_checkpoints(tmp_path, epochs=1, every="3st", keep=None)
    starts: list[tuple[int, int]] = []
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path / "again", every="3st"))
    engine.on("step_start", lambda e: starts.append((e.state.epoch, e.state.step)))
    result = engine.run(Tiny(), steps=5, resume=tmp_path / "ckpt-00000-0000000003.pt")
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


# -- contents ------------------------------------------------------------------------------

def test_a_checkpoint_holds_counters_weights_optimizer_and_rng(tmp_path: Path) -> None:
    model, _, _ = train_with_checkpoints(tmp_path, epochs=2, keep=None)
    torch_rng, python_rng = torch.get_rng_state(), random.getstate()
    state = torch.load(tmp_path / "ckpt-00002-0000000008.pt", weights_only=True)
    assert sorted(state) == ["engine", "format", "model", "rng"]
    assert sorted(state["model"]) == ["module", "optimizer"]
    assert state["format"] == 2
    assert state["engine"]["counters"] == {"step": 8, "epoch": 2, "epoch_step": 0, "skipped": 0}
    assert "checkpoint" in state["engine"]["packs"]
    assert list(state["model"]["module"]) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert_same(state["model"]["module"], model.module.state_dict(), "model")
    optimizer = state["model"]["optimizer"]
    assert sorted(optimizer["state"]) == [0, 1, 2, 3]
    assert int(optimizer["state"][0]["step"]) == 8
    assert_same(optimizer, model.optimizer.state_dict(), "optimizer")
    # the generators as they were after the last step (nothing drew from them since)
    assert torch.equal(state["rng"]["torch"], torch_rng)
    version, internal, gauss = state["rng"]["python"]
    assert (version, tuple(internal), gauss) == python_rng


# -- exact resume --------------------------------------------------------------------------

def test_resume_from_a_directory_is_exact(tmp_path: Path) -> None:
    reference, reference_result, reference_log = straight(epochs=4)

    _, _, first_log = train_with_checkpoints(tmp_path, epochs=2)
    torch.manual_seed(123)  # the generator's state now differs from the straight run's
    model, engine, log = Tiny(), runmodel.Engine(), []
    engine.attach(Checkpoint(tmp_path))
    attach_filters(engine, log)
    starts: list[tuple[int, int]] = []
    engine.on("step_start", lambda e: starts.append((e.state.epoch, e.state.step)))
    result = engine.run(model, epochs=4, resume=tmp_path)

    assert model.calls == ["setup", "teardown"]
    assert starts[0] == (2, 8) and len(starts) == 8
    assert (result.steps, result.epochs, result.ended) == (16, 4, "completed")
    assert (reference_result.steps, reference_result.epochs) == (16, 4)
    for p, q in zip(params(model), params(reference), strict=True):
        assert torch.equal(p, q)
    assert_same(model.optimizer.state_dict(), reference.optimizer.state_dict(), "optimizer")
    # every= and once= filters fire where they fire in one straight run
    assert first_log + log == reference_log
    # at step 10 and at epoch 2 or 3, counted from 0 like state.step and state.epoch
    assert {("step_start once=10", 2, 10), ("epoch_start once=2", 2, 8),
            ("runstep once=3ep", 3, 12)} <= set(log)


def test_resume_from_a_specific_file(tmp_path: Path) -> None:
    reference, _, reference_log = straight(epochs=4)
    _, _, first_log = train_with_checkpoints(tmp_path, epochs=2)
    older = tmp_path / "ckpt-00001-0000000004.pt"
    assert older.exists() and (tmp_path / "ckpt-00002-0000000008.pt").exists()

    model, engine, log = Tiny(), runmodel.Engine(), []
    engine.attach(Checkpoint(tmp_path / "second"))
    attach_filters(engine, log)
    result = engine.run(model, epochs=4, resume=older)
    assert (result.steps, result.epochs) == (16, 4)
    for p, q in zip(params(model), params(reference), strict=True):
        assert torch.equal(p, q)
    # the first run's log up to the end of epoch 0, then this run's
    assert [entry for entry in first_log if entry[2] < 4 or entry[:2] == (
        "epoch_end every=2", 0)] + log == reference_log


def test_a_resumed_run_with_the_finished_epochs_runs_no_steps(tmp_path: Path) -> None:
    model, _, _ = train_with_checkpoints(tmp_path, epochs=2)
    again, steps = Tiny(), []
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path))
    engine.on("runstep", lambda e: steps.append(e.state.step))
    result = engine.run(again, epochs=2, resume=tmp_path)
    assert steps == [] and (result.steps, result.epochs) == (8, 2)
    for p, q in zip(params(again), params(model), strict=True):
        assert torch.equal(p, q)


def test_the_counters_are_this_runs_only(tmp_path: Path) -> None:
    train_with_checkpoints(tmp_path, epochs=2)
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path / "other"))
    engine.run(Tiny(), epochs=3, resume=tmp_path)
    assert (engine.state.step, engine.state.epoch) == (12, 3)
    result = engine.run(Tiny(), epochs=1)  # a later run without resume= starts at zero
    assert (result.steps, result.epochs) == (4, 1)


def test_no_checkpoints_in_eval_mode(tmp_path: Path) -> None:
    class Eval(Tiny):
        def setup(self, setup_options: dict[str, Any] | None = None) -> None:
            super().setup(setup_options)
            self.eval_data = make_data()

    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path / "ckpt", every="1st"))
    result = engine.run(Eval(), mode="eval")
    assert result.steps == BATCHES and not (tmp_path / "ckpt").exists()


def test_a_budget_that_ends_mid_epoch_does_not_mark_the_epoch_done(tmp_path: Path) -> None:
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path, keep=None))
    result = engine.run(Tiny(), steps=6)  # epoch 0, and half of epoch 1
    assert (result.steps, result.epochs, result.ended) == (6, 1, "budget")
    assert not any(name.startswith("ckpt-00002-") for name in files(tmp_path))
    steps: list[tuple[int, int]] = []
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path / "second"))
    engine.on("runstep", lambda e: steps.append((e.state.epoch, e.state.step)))
    resumed = engine.run(Tiny(), epochs=2, resume=tmp_path)
    assert resumed.steps >= 8 and (1, 7) in steps


def test_keep_still_holds_after_a_resume(tmp_path: Path) -> None:
    train_with_checkpoints(tmp_path, epochs=2, keep=2)
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path, keep=2))
    engine.run(Tiny(), epochs=4, resume=tmp_path)
    assert files(tmp_path) == ["ckpt-00003-0000000012.pt", "ckpt-00004-0000000016.pt"]


# -- atomic writes, corrupt and hostile files ---------------------------------------------------

def corrupt(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[:len(data) // 2])
    elif how == "garbage":
        path.write_bytes(b"\x80\x02not a checkpoint at all" * 10)
    else:
        path.write_bytes(b"")


@pytest.mark.parametrize("how", ["truncated", "garbage", "empty"])
def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous(tmp_path: Path,
                                                                  how: str) -> None:
    reference, _, _ = straight(epochs=4)
    train_with_checkpoints(tmp_path, epochs=2)
    newest = tmp_path / "ckpt-00002-0000000008.pt"
    corrupt(newest, how)

    model, engine = Tiny(), runmodel.Engine()
    engine.attach(Checkpoint(tmp_path / "second"))
    starts: list[int] = []
    engine.on("step_start", lambda e: starts.append(e.state.step))
    with pytest.warns(UserWarning, match=r"skipping unreadable checkpoint .*"
                      r"ckpt-00002-0000000008\.pt"):
        result = engine.run(model, epochs=4, resume=tmp_path)
    assert starts == list(range(4, 16))  # from the epoch-1 checkpoint
    assert result.steps == 16
    for p, q in zip(params(model), params(reference), strict=True):
        assert torch.equal(p, q)


def test_resuming_from_a_corrupt_file_is_an_error(tmp_path: Path) -> None:
    train_with_checkpoints(tmp_path, epochs=2)
    newest = tmp_path / "ckpt-00002-0000000008.pt"
    corrupt(newest, "truncated")
    model, engine, steps = Tiny(), runmodel.Engine(), []
    engine.on("runstep", lambda e: steps.append(e.state.step))
    with pytest.raises(ValueError, match=r"ckpt-00002-0000000008\.pt.* is not a readable "
                                         r"checkpoint"):
        engine.run(model, epochs=4, resume=newest)
    assert steps == [] and model.calls == ["setup", "teardown"]


def test_no_readable_checkpoint_in_a_directory_is_an_error(tmp_path: Path) -> None:
    train_with_checkpoints(tmp_path, epochs=2)
    for path in tmp_path.glob("ckpt-*.pt"):
        corrupt(path, "garbage")
    with pytest.warns(UserWarning, match="skipping unreadable"), \
            pytest.raises(FileNotFoundError, match="no readable checkpoint"):
        runmodel.Engine().run(Tiny(), epochs=4, resume=tmp_path)


def test_saving_leaves_no_temporary_files(tmp_path: Path) -> None:
    train_with_checkpoints(tmp_path, epochs=3, every="1st", keep=3)
    assert files(tmp_path) == ["ckpt-00002-0000000010.pt", "ckpt-00002-0000000011.pt",
                               "ckpt-00002-0000000012.pt"]


def test_a_save_that_fails_midway_keeps_the_old_file(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    model, engine, _ = train_with_checkpoints(tmp_path, epochs=1)
    path = tmp_path / "ckpt-00001-0000000004.pt"
    before = path.read_bytes()

    def failing_save(obj: Any, file: Any, *args: Any, **kwargs: Any) -> None:
        file.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        checkpoint.save(path, engine.snapshot())
    assert path.read_bytes() == before
    assert files(tmp_path) == ["ckpt-00001-0000000004.pt"]
    monkeypatch.undo()
    assert checkpoint.save(path, engine.snapshot()) == path
    assert files(tmp_path) == ["ckpt-00001-0000000004.pt"]
    assert path.read_bytes() != before  # the model trained on, so the state differs ...
    state = torch.load(path, weights_only=True)
    assert_same(state["model"]["module"], model.module.state_dict(), "model")  # ... current


MARKER_NAME = "pickle-ran-code"


def make_marker(path: str) -> None:
    Path(path).write_text("code ran while loading a checkpoint")


class Hostile:
    """Unpickling it calls make_marker: code run by merely loading a file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (make_marker, (str(self.marker),))


def write_hostile(path: Path, marker: Path) -> None:
    torch.save({"format": 1, "engine": {"counters": {"step": 99}, "packs": {}},
                "rng": {}, "model": Hostile(marker), "optimizer": None}, path)


def test_a_checkpoint_that_would_run_code_is_refused(tmp_path: Path) -> None:
    # the file is truly hostile: a plain torch.load runs its code
    control = tmp_path / "control"
    control.mkdir()
    write_hostile(control / "ckpt.pt", control / MARKER_NAME)
    torch.load(control / "ckpt.pt", weights_only=False)
    assert (control / MARKER_NAME).exists()

    directory = tmp_path / "run"
    train_with_checkpoints(directory, epochs=1)
    hostile = directory / "ckpt-00009-0000000099.pt"
    marker = tmp_path / MARKER_NAME
    write_hostile(hostile, marker)
    model, steps = Tiny(), []
    engine = runmodel.Engine()
    engine.on("runstep", lambda e: steps.append(e.state.step))
    with pytest.raises(ValueError, match=r"ckpt-00009-0000000099\.pt.* is not a readable "
                                         r"checkpoint"):
        engine.run(model, epochs=2, resume=hostile)
    assert not marker.exists() and steps == []

    # from the directory: skipped with a warning, the good one is used
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path / "second"))
    with pytest.warns(UserWarning, match=r"skipping unreadable checkpoint .*ckpt-00009"):
        result = engine.run(Tiny(), epochs=2, resume=directory)
    assert not marker.exists()
    assert result.steps == 8


def test_a_file_that_is_not_a_runmodel_checkpoint_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "weights.pt"
    torch.save({"weight": torch.zeros(2)}, path)
    engine = runmodel.Engine()
    model = Tiny()
    engine.run(model, steps=1)
    with pytest.raises(ValueError, match="is not a runmodel checkpoint"):
        engine.restore(checkpoint.load(path)[1])


# -- resume= errors -----------------------------------------------------------------------------

def test_resume_from_a_missing_path_fails_before_setup(tmp_path: Path) -> None:
    model = Tiny()
    with pytest.raises(FileNotFoundError, match=r"resume=.*nowhere.*no such checkpoint"):
        runmodel.Engine().run(model, epochs=1, resume=tmp_path / "nowhere")
    assert model.calls == []


def test_resume_from_a_directory_without_checkpoints_fails(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("no checkpoints here")
    model, steps = Tiny(), []
    engine = runmodel.Engine()
    engine.on("runstep", lambda e: steps.append(e.state.step))
    with pytest.raises(FileNotFoundError, match="no checkpoint to resume from"):
        engine.run(model, epochs=1, resume=tmp_path)
    assert steps == []


def test_checkpoints_in_finds_a_run_directorys_checkpoint_folder(tmp_path: Path) -> None:
    train_with_checkpoints(tmp_path / "checkpoint", epochs=2)
    assert [p.name for p in checkpoints_in(tmp_path)] == [
        "ckpt-00002-0000000008.pt", "ckpt-00001-0000000004.pt"]
    assert checkpoints_in(tmp_path / "empty") == []


def test_a_foreign_newest_file_falls_back_to_the_previous_checkpoint(tmp_path: Path) -> None:
    train_with_checkpoints(tmp_path, epochs=2, keep=None)
    newest = sorted(tmp_path.glob("ckpt-*.pt"))[-1]
    torch.save({"weights": torch.zeros(2)}, newest)  # loads, but is not a checkpoint
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path / "resumed"))
    with pytest.warns(UserWarning, match="no runmodel checkpoint"):
        result = engine.run(Tiny(), epochs=2, resume=tmp_path)
    assert (result.steps, result.epochs) == (8, 2)  # resumed after epoch 1, ran epoch 2


def test_pack_state_that_cannot_load_back_is_refused_when_saving(tmp_path: Path) -> None:
    class PathState(runmodel.Pack):
        name = "paths"

        def state_dict(self) -> dict[str, Any]:
            return {"where": [tmp_path]}  # a Path: weights_only would refuse it on resume

    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path / "ckpt"), PathState())
    with pytest.raises(TypeError, match=r"pack 'paths' state_dict\(\)\['where'\]\[0\] holds "
                                        r"PosixPath"):
        engine.run(Tiny(), epochs=1)
    assert not list((tmp_path / "ckpt").glob("*"))  # nothing half-written

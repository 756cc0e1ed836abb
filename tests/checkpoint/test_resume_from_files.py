"""Checkpoint files and resuming from them: what a file holds, exact resume from a
directory or a file, checkpoints across devices, atomic writes, corrupt, foreign and
hostile files, and resume= errors.

The model (``helpers.dropout_mlp``) trains a small MLP with dropout and Adam on 4 fixed
batches an epoch, so that an exact resume needs the weights, the optimizer's state and the
random number generator's state all restored. The Checkpoint pack's own options (names,
every=, keep=) are tested in tests/packs/test_checkpoint.py.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

import runmodel
from runmodel import checkpoint
from runmodel.checkpoint import checkpoints_in
from runmodel.packs import Checkpoint

import helpers
from helpers import Tiny, assert_equal_params, assert_same, dropout_mlp, files, params

Log = list[tuple[str, int, int]]


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


def straight(epochs: int = 4, device: str = "cpu") -> tuple[Tiny, runmodel.RunResult, Log]:
    """One run of ``epochs`` without checkpoints: the reference."""
    model, engine, log = dropout_mlp(device), runmodel.Engine(), []
    attach_filters(engine, log)
    result = engine.run(model, epochs=epochs)
    return model, result, log


def train_with_checkpoints(
    directory: Path, epochs: int = 2, device: str = "cpu", **options: Any
) -> tuple[Tiny, runmodel.Engine, Log]:
    """``helpers.train_with_checkpoints`` with the filters of ``attach_filters`` logging."""
    engine, log = runmodel.Engine(), []
    attach_filters(engine, log)
    model, _ = helpers.train_with_checkpoints(
        directory, epochs, device=device, engine=engine, **options
    )
    return model, engine, log


# -- contents --------------------------------------------------------------------------------------


def test_a_checkpoint_holds_counters_weights_optimizer_and_rng(tmp_path: Path) -> None:
    model, _, _ = train_with_checkpoints(tmp_path, epochs=2, keep=None)
    torch_rng, python_rng = torch.get_rng_state(), random.getstate()
    state = torch.load(tmp_path / "ckpt-00002-0000000008.pt", weights_only=True)
    assert sorted(state) == ["engine", "format", "model", "position", "rng"]
    assert sorted(state["model"]) == ["module", "optimizer", "optimizer_class", "requires_grad"]
    assert state["position"] == {"batches": 0}  # an epoch's end: the next one starts afresh
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


# -- exact resume ----------------------------------------------------------------------------------


def test_resume_from_a_directory_is_exact(tmp_path: Path, device: str) -> None:
    reference, reference_result, reference_log = straight(epochs=4, device=device)

    _, _, first_log = train_with_checkpoints(tmp_path, epochs=2, device=device)
    torch.manual_seed(123)  # the generators' states now differ from the straight run's
    model, engine, log = dropout_mlp(device), runmodel.Engine(), []
    engine.attach(Checkpoint(tmp_path))
    attach_filters(engine, log)
    starts: list[tuple[int, int]] = []
    engine.on("step_start", lambda e: starts.append((e.state.epoch, e.state.step)))
    result = engine.run(model, epochs=4, resume=tmp_path)

    assert model.calls == ["model.setup", "model.teardown"]
    assert starts[0] == (2, 8) and len(starts) == 8
    assert (result.steps, result.epochs, result.ended) == (16, 4, "completed")
    assert (reference_result.steps, reference_result.epochs) == (16, 4)
    assert_equal_params(model, reference)
    assert_same(model.optimizer.state_dict(), reference.optimizer.state_dict(), "optimizer")
    # every= and once= filters fire where they fire in one straight run
    assert first_log + log == reference_log
    # at step 10 and at epoch 2 or 3, counted from 0 like state.step and state.epoch
    assert {
        ("step_start once=10", 2, 10),
        ("epoch_start once=2", 2, 8),
        ("runstep once=3ep", 3, 12),
    } <= set(log)


@pytest.mark.parametrize("to_cpu", [True, False], ids=["device-to-cpu", "cpu-to-device"])
def test_a_checkpoint_saved_on_one_device_resumes_on_another(
    tmp_path: Path, device: str, to_cpu: bool
) -> None:
    """Saved on ``device`` and resumed on the CPU, or saved on the CPU and resumed on
    ``device``: weights and optimizer state go to the resuming model's device."""
    saved_on, resumed_on = (device, "cpu") if to_cpu else ("cpu", device)
    saved, _ = helpers.train_with_checkpoints(tmp_path / "saved", epochs=1, device=saved_on)
    loaded: list[tuple[torch.Tensor, dict[str, Any]]] = []
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path / "resumed"))
    engine.on(
        "step_start",
        lambda e: loaded.append((params(e.model), e.model.optimizer.state_dict())),
        once=4,
    )  # the first step after the checkpoint
    model = dropout_mlp(resumed_on)
    result = engine.run(model, epochs=2, resume=tmp_path / "saved")
    assert (result.steps, result.epochs) == (8, 2)
    [(weights, optimizer)] = loaded
    assert weights.device.type == resumed_on
    assert torch.equal(weights.cpu(), params(saved).cpu())
    moments = [
        state[key] for state in optimizer["state"].values() for key in ("exp_avg", "exp_avg_sq")
    ]
    assert len(moments) == 8 and all(m.device.type == resumed_on for m in moments)
    assert all(p.device.type == resumed_on for p in model.module.parameters())


def test_resume_from_a_specific_file(tmp_path: Path) -> None:
    reference, _, reference_log = straight(epochs=4)
    _, _, first_log = train_with_checkpoints(tmp_path, epochs=2)
    older = tmp_path / "ckpt-00001-0000000004.pt"
    assert older.exists() and (tmp_path / "ckpt-00002-0000000008.pt").exists()

    model, engine, log = dropout_mlp(), runmodel.Engine(), []
    engine.attach(Checkpoint(tmp_path / "second"))
    attach_filters(engine, log)
    result = engine.run(model, epochs=4, resume=older)
    assert (result.steps, result.epochs) == (16, 4)
    assert_equal_params(model, reference)
    # the first run's log up to the end of epoch 0, then this run's
    assert [
        entry for entry in first_log if entry[2] < 4 or entry[:2] == ("epoch_end every=2", 0)
    ] + log == reference_log


def test_a_resumed_run_with_the_finished_epochs_runs_no_steps(tmp_path: Path) -> None:
    model, _, _ = train_with_checkpoints(tmp_path, epochs=2)
    again, steps = dropout_mlp(), []
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path))
    engine.on("runstep", lambda e: steps.append(e.state.step))
    result = engine.run(again, epochs=2, resume=tmp_path)
    assert steps == [] and (result.steps, result.epochs) == (8, 2)
    assert_equal_params(again, model)


def test_the_counters_are_this_runs_only(tmp_path: Path) -> None:
    train_with_checkpoints(tmp_path, epochs=2)
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path / "other", overwrite=True))
    engine.run(dropout_mlp(), epochs=3, resume=tmp_path)
    assert (engine.state.step, engine.state.epoch) == (12, 3)
    result = engine.run(dropout_mlp(), epochs=1)  # a later run without resume= starts at zero
    [moved] = (tmp_path / "other").glob("previous-*")  # overwrite=True: the old run aside
    assert sorted(p.name for p in moved.iterdir())[-1] == "ckpt-00003-0000000012.pt"
    assert (result.steps, result.epochs) == (4, 1)


# -- atomic writes, corrupt, foreign and hostile files ---------------------------------------------


def corrupt(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "garbage":
        path.write_bytes(b"\x80\x02not a checkpoint at all" * 10)
    else:
        path.write_bytes(b"")


@pytest.mark.parametrize("how", ["truncated", "garbage", "empty"])
def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous(tmp_path: Path, how: str) -> None:
    reference, _, _ = straight(epochs=4)
    train_with_checkpoints(tmp_path, epochs=2)
    newest = tmp_path / "ckpt-00002-0000000008.pt"
    corrupt(newest, how)

    model, engine = dropout_mlp(), runmodel.Engine()
    engine.attach(Checkpoint(tmp_path / "second"))
    starts: list[int] = []
    engine.on("step_start", lambda e: starts.append(e.state.step))
    with pytest.warns(
        UserWarning,
        match=r"skipping unreadable checkpoint .*"
        r"ckpt-00002-0000000008\.pt",
    ):
        result = engine.run(model, epochs=4, resume=tmp_path)
    assert starts == list(range(4, 16))  # from the epoch-1 checkpoint
    assert result.steps == 16
    assert_equal_params(model, reference)


def test_resuming_from_a_corrupt_file_is_an_error(tmp_path: Path) -> None:
    train_with_checkpoints(tmp_path, epochs=2)
    newest = tmp_path / "ckpt-00002-0000000008.pt"
    corrupt(newest, "truncated")
    model, engine, steps = dropout_mlp(), runmodel.Engine(), []
    engine.on("runstep", lambda e: steps.append(e.state.step))
    with pytest.raises(
        ValueError,
        match=r"ckpt-00002-0000000008\.pt.* is not a readable "
        r"checkpoint",
    ):
        engine.run(model, epochs=4, resume=newest)
    assert steps == [] and model.calls == ["model.setup", "model.teardown"]


def test_no_readable_checkpoint_in_a_directory_is_an_error(tmp_path: Path) -> None:
    train_with_checkpoints(tmp_path, epochs=2)
    for path in tmp_path.glob("ckpt-*.pt"):
        corrupt(path, "garbage")
    with (
        pytest.warns(UserWarning, match="skipping unreadable"),
        pytest.raises(FileNotFoundError, match="no readable checkpoint"),
    ):
        runmodel.Engine().run(dropout_mlp(), epochs=4, resume=tmp_path)


def test_a_save_that_fails_midway_keeps_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
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
    torch.save(
        {
            "format": 1,
            "engine": {"counters": {"step": 99}, "packs": {}},
            "rng": {},
            "model": Hostile(marker),
            "optimizer": None,
        },
        path,
    )


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
    model, steps = dropout_mlp(), []
    engine = runmodel.Engine()
    engine.on("runstep", lambda e: steps.append(e.state.step))
    with pytest.raises(
        ValueError,
        match=r"ckpt-00009-0000000099\.pt.* is not a readable "
        r"checkpoint",
    ):
        engine.run(model, epochs=2, resume=hostile)
    assert not marker.exists() and steps == []

    # from the directory: skipped with a warning, the good one is used
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path / "second"))
    with pytest.warns(UserWarning, match=r"skipping unreadable checkpoint .*ckpt-00009"):
        result = engine.run(dropout_mlp(), epochs=2, resume=directory)
    assert not marker.exists()
    assert result.steps == 8


def test_a_file_that_is_not_a_runmodel_checkpoint_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "weights.pt"
    torch.save({"weight": torch.zeros(2)}, path)
    engine = runmodel.Engine()
    model = dropout_mlp()
    engine.run(model, steps=1)
    with pytest.raises(ValueError, match="is not a runmodel checkpoint"):
        engine.restore(checkpoint.load(path)[1])


def test_a_foreign_newest_file_falls_back_to_the_previous_checkpoint(tmp_path: Path) -> None:
    train_with_checkpoints(tmp_path, epochs=2, keep=None)
    newest = sorted(tmp_path.glob("ckpt-*.pt"))[-1]
    torch.save({"weights": torch.zeros(2)}, newest)  # loads, but is not a checkpoint
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path / "resumed"))
    with pytest.warns(UserWarning, match="no runmodel checkpoint"):
        result = engine.run(dropout_mlp(), epochs=2, resume=tmp_path)
    assert (result.steps, result.epochs) == (8, 2)  # resumed after epoch 1, ran epoch 2


def test_pack_state_that_cannot_load_back_is_refused_when_saving(tmp_path: Path) -> None:
    class PathState(runmodel.Pack):
        name = "paths"

        def state_dict(self) -> dict[str, Any]:
            return {"where": [tmp_path]}  # a Path: weights_only would refuse it on resume

    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path / "ckpt"), PathState())
    with pytest.raises(
        TypeError,
        match=r"pack 'paths' state_dict\(\)\['where'\]\[0\] holds "
        r"PosixPath",
    ):
        engine.run(dropout_mlp(), epochs=1)
    assert not list((tmp_path / "ckpt").glob("*"))  # nothing half-written


# -- resume= errors, finding checkpoints -----------------------------------------------------------


def test_resume_from_a_missing_path_fails_before_setup(tmp_path: Path) -> None:
    model = dropout_mlp()
    with pytest.raises(FileNotFoundError, match=r"resume=.*nowhere.*no such checkpoint"):
        runmodel.Engine().run(model, epochs=1, resume=tmp_path / "nowhere")
    assert model.calls == []


def test_resume_from_a_directory_without_checkpoints_fails(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("no checkpoints here")
    model, steps = dropout_mlp(), []
    engine = runmodel.Engine()
    engine.on("runstep", lambda e: steps.append(e.state.step))
    with pytest.raises(FileNotFoundError, match="no checkpoint to resume from"):
        engine.run(model, epochs=1, resume=tmp_path)
    assert steps == []


def test_checkpoints_in_finds_a_run_directorys_checkpoint_folder(tmp_path: Path) -> None:
    train_with_checkpoints(tmp_path / "checkpoint", epochs=2)
    assert [p.name for p in checkpoints_in(tmp_path)] == [
        "ckpt-00002-0000000008.pt",
        "ckpt-00001-0000000004.pt",
    ]
    assert checkpoints_in(tmp_path / "empty") == []


# -- resume="auto" ---------------------------------------------------------------------------------


def test_resume_auto_starts_fresh_then_continues_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reference, _, _ = straight(epochs=4)
    folder = tmp_path / "ckpt"

    engine = runmodel.Engine()
    engine.attach(Checkpoint(folder))
    first = engine.run(dropout_mlp(), epochs=2, resume="auto")
    assert f"no checkpoint in {folder} yet: starting fresh" in capsys.readouterr().err
    assert (first.steps, first.epochs) == (8, 2)

    torch.manual_seed(7)  # the generators now differ from where the first run left them
    engine, model = runmodel.Engine(), dropout_mlp()
    engine.attach(Checkpoint(folder))
    result = engine.run(model, epochs=4, resume="auto")
    assert f"resuming from {folder / 'ckpt-00002-0000000008.pt'}" in capsys.readouterr().err
    assert (result.steps, result.epochs) == (16, 4)
    assert_equal_params(model, reference)


def test_resume_auto_takes_the_newest_of_several_checkpoint_packs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train_with_checkpoints(tmp_path / "a", epochs=1)
    later = runmodel.Engine()  # the same run goes on, writing its checkpoints into b
    later.attach(Checkpoint(tmp_path / "b"))
    later.run(dropout_mlp(), epochs=3, resume=tmp_path / "a")
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path / "a"), Checkpoint(tmp_path / "b"))
    result = engine.run(dropout_mlp(), epochs=4, resume="auto")
    assert f"resuming from {tmp_path / 'b' / 'ckpt-00003-0000000012.pt'}" in capsys.readouterr().err
    assert result.steps == 16


def test_resume_auto_without_a_checkpoint_pack_is_refused_before_setup() -> None:
    model = dropout_mlp()
    with pytest.raises(ValueError, match=r'resume="auto" .* none is attached: attach one'):
        runmodel.Engine().run(model, epochs=1, resume="auto")
    assert model.calls == []


# -- checkpoints that are not this run's -----------------------------------------------------------


def test_a_checkpoint_of_another_model_is_refused_naming_the_parameters(tmp_path: Path) -> None:
    train_with_checkpoints(tmp_path, epochs=1)
    written = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    wider = helpers.Tiny(hidden=16, dropout=0.25, optimizer=torch.optim.Adam)
    steps: list[int] = []
    engine = runmodel.Engine()
    engine.on("runstep", lambda e: steps.append(e.state.step))
    with pytest.raises(
        ValueError,
        match=r"another model than Tiny: the first parameter that "
        r"differs is 0\.weight: checkpoint \(8, 4\), Tiny "
        r"\(16, 4\) \(and 2 more: 0\.bias: checkpoint \(8,\)",
    ):
        engine.run(wider, epochs=2, resume=tmp_path)
    flat = helpers.Tiny(optimizer=torch.optim.Adam)  # Linear(4, 1): other names
    with pytest.raises(
        ValueError,
        match=r"differs is weight: checkpoint missing, Tiny \(1, 4\) "
        r"\(and 5 more: bias: .*0\.weight: checkpoint \(8, 4\), "
        r"Tiny missing",
    ):
        runmodel.Engine().run(flat, epochs=2, resume=tmp_path)
    assert steps == []
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == written  # untouched


def test_a_checkpoint_of_a_newer_format_is_refused_naming_the_versions(tmp_path: Path) -> None:
    train_with_checkpoints(tmp_path, epochs=2, keep=None)
    newest = sorted(tmp_path.glob("ckpt-*.pt"))[-1]
    state = torch.load(newest, weights_only=True)
    state["format"] = checkpoint.FORMAT + 1
    torch.save(state, newest)
    newer = checkpoint.FORMAT + 1
    message = (
        rf"written in checkpoint format {newer} by a newer runmodel; this one reads "
        rf"formats 1 to {checkpoint.FORMAT}: upgrade runmodel"
    )
    # from the folder too: not skipped for an older checkpoint, which would lose work
    for resume in (newest, tmp_path):
        with pytest.raises(checkpoint.FormatError, match=message):
            runmodel.Engine().run(dropout_mlp(), epochs=3, resume=resume)
    assert torch.load(newest, weights_only=True)["format"] == newer


def test_a_resume_at_an_epochs_last_step_sees_the_last_loss_and_metrics(tmp_path: Path) -> None:
    """A step checkpoint that falls on an epoch's last step is taken at that epoch's end
    (issue 37, R1): a run resumed from it starts the next epoch, ends the one before never
    again, and its epoch ends read the loss and metrics the straight run had there."""

    def run(resume: Path | None, log: list[Any], epochs: int = 3) -> None:
        engine = runmodel.Engine()
        engine.attach(Checkpoint(tmp_path / "ckpt", every="4st", keep=None))
        engine.on(
            "runstep",
            lambda e: e.state.metrics.update(last_step=e.state.step, doubled=e.state.loss * 2),
        )
        engine.on(
            "epoch_end",
            lambda e: log.append(
                (
                    e.state.epoch,
                    e.state.loss.item(),
                    e.state.metrics["last_step"],
                    float(e.state.metrics["doubled"]),
                )
            ),
        )
        engine.run(dropout_mlp(), epochs=epochs, resume=resume)

    straight_log: list[Any] = []
    run(None, straight_log)
    resumed_log: list[Any] = []
    run(tmp_path / "ckpt" / "ckpt-00002-0000000008.pt", resumed_log)  # after step 8, epoch 1's last
    assert resumed_log == straight_log[2:]
    assert resumed_log[0][2] == 11

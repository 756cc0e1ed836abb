"""A Checkpoint in a script's ``out_dir`` (issue 36 item 9): the folder's other files are
never moved or deleted, a rerun can replace the previous run's checkpoints, ``keep=0``
with ``best=`` writes only new bests, and what an evaluation measured before the first
step is the baseline a best checkpoint must beat."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import runmodel
from runmodel.packs import Checkpoint, Evaluate

from helpers import Tiny


def foreign_files(folder: Path) -> dict[str, bytes]:
    """A script's own files in its out_dir: a checkpoint of its own, exported weights."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({"model": torch.zeros(2)}, folder / "ckpt.pt")
    (folder / "weights.onnx").write_bytes(b"onnx bytes")
    (folder / "train.log").write_text("a log line\n")
    return {name: (folder / name).read_bytes() for name in ("ckpt.pt", "weights.onnx", "train.log")}


def checkpoint_names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(("ckpt-", "best-")))


def test_a_folder_of_other_files_needs_no_overwrite_and_keeps_them(tmp_path: Path) -> None:
    out = tmp_path / "out"
    before = foreign_files(out)
    runmodel.Engine(Checkpoint(out), progress=False).run(Tiny(), epochs=2)
    assert {name: (out / name).read_bytes() for name in before} == before
    assert checkpoint_names(out) == ["ckpt-00001-0000000004.pt", "ckpt-00002-0000000008.pt"]


@pytest.mark.parametrize("overwrite", [True, "replace"])
def test_a_rerun_moves_or_deletes_only_the_other_runs_checkpoints(
    tmp_path: Path, overwrite: bool | str
) -> None:
    out = tmp_path / "out"
    runmodel.Engine(Checkpoint(out), progress=False).run(Tiny(), epochs=2)
    before = foreign_files(out)
    first = checkpoint_names(out)
    runmodel.Engine(Checkpoint(out, overwrite=overwrite), progress=False).run(Tiny(), epochs=1)
    assert {name: (out / name).read_bytes() for name in before} == before  # never touched
    assert checkpoint_names(out) == ["ckpt-00001-0000000004.pt"]  # this run's alone
    previous = sorted(out.glob("previous-*"))
    if overwrite == "replace":  # deleted, not piled up
        assert previous == []
    else:
        [moved] = previous
        assert sorted(p.name for p in moved.iterdir()) == first


def test_overwrite_takes_true_false_or_replace() -> None:
    with pytest.raises(TypeError, match=r'overwrite= takes False .* or "replace"'):
        Checkpoint("out", overwrite="yes")  # type: ignore[arg-type]


def test_keep_0_with_best_writes_only_new_bests(tmp_path: Path) -> None:
    out = tmp_path / "out"
    losses = iter([3.0, 2.0, 5.0, 6.0])
    engine = runmodel.Engine(Checkpoint(out, keep=0, best=("eval_loss", "min")), progress=False)

    @engine.on("epoch_end", writes=["eval_loss"], priority=100)
    def measure(engine: runmodel.Engine) -> None:
        engine.state.metrics["eval_loss"] = next(losses)

    seen: list[tuple[int, list[str]]] = []

    @engine.on("epoch_end", priority=-2000)  # after the checkpoint's save
    def look(engine: runmodel.Engine) -> None:
        seen.append((os.stat(out).st_mtime_ns, checkpoint_names(out)))

    engine.run(Tiny(), epochs=4)
    names = [listed for _, listed in seen]
    assert names == [
        ["best-eval_loss=3-00001-0000000004.pt"],
        ["best-eval_loss=2-00002-0000000008.pt"],
        ["best-eval_loss=2-00002-0000000008.pt"],
        ["best-eval_loss=2-00002-0000000008.pt"],
    ]
    # no file was written (and deleted) in the folder at the epochs that were no new best
    assert seen[1][0] == seen[2][0] == seen[3][0]


def _still(engine: runmodel.Engine, out: Path, at_start: bool) -> Checkpoint:
    """A run whose weights never change (lr 0): every evaluation equals the first."""
    checkpoint = Checkpoint(out, keep=0, best=("eval_loss", "min"))
    engine.attach(Evaluate(at_start=at_start), checkpoint)
    engine.run(Tiny(lr=0.0), epochs=3)
    return checkpoint


def test_what_was_measured_before_the_first_step_is_the_baseline_to_beat(tmp_path: Path) -> None:
    with_baseline = _still(runmodel.Engine(progress=False), tmp_path / "a", at_start=True)
    assert with_baseline.baseline is not None and with_baseline.best_path is None
    assert checkpoint_names(tmp_path / "a") == []  # no epoch beat the untrained weights
    without = _still(runmodel.Engine(progress=False), tmp_path / "b", at_start=False)
    assert without.baseline is None
    assert checkpoint_names(tmp_path / "b") == [without.best_path.name]  # type: ignore[union-attr]


def test_the_baseline_is_kept_across_a_resume(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = Checkpoint(out, best=("eval_loss", "min"))
    runmodel.Engine(Evaluate(at_start=True), first, progress=False).run(Tiny(), epochs=1)
    assert first.baseline is not None
    again = Checkpoint(out, best=("eval_loss", "min"))
    runmodel.Engine(Evaluate(at_start=True), again, progress=False).run(
        Tiny(), epochs=2, resume=out
    )
    assert again.baseline == first.baseline  # restored, not measured again mid-run

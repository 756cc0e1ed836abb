"""The CSV pack: real files, read back with pandas (and the standard library's csv where
pandas is not installed)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

import runmodel
from runmodel.config.registry import make_pack
from runmodel.packs import CSV, Checkpoint, Evaluate

from helpers import Tiny


def run(
    run_dir: Path,
    epochs: int,
    interrupt_at: int | None = None,
    resume: str | Path = "auto",
    **options: object,
) -> runmodel.RunResult:
    """Tiny's classifier (4 steps an epoch) with Evaluate every 2 epochs, a Checkpoint
    every epoch and ``CSV(**options)``, in ``run_dir``, continued from ``resume``; with
    ``interrupt_at``, interrupted after that step."""
    engine = runmodel.Engine(
        Evaluate(every="2ep"), Checkpoint("checkpoint"), CSV(**options), progress=False
    )
    if interrupt_at is not None:
        engine.on("runstep", lambda e: e.interrupt(), once=f"{interrupt_at - 1}st")
    return engine.run(Tiny(classes=3), epochs=epochs, run_dir=run_dir, resume=resume)


def test_one_row_an_epoch_that_pandas_reads(tmp_path: Path) -> None:
    pandas = pytest.importorskip("pandas", reason="pandas is not installed (the dev extra has it)")
    losses: list[float] = []  # the epoch's loss metric: its mean (CSV reads it)
    steps: list[float] = []  # each step's loss
    engine = runmodel.Engine(
        Evaluate(every="2ep"), CSV(tmp_path / "log.csv", every_steps=3), progress=False
    )
    engine.on("runstep", lambda e: steps.append(e.state.loss.item()))
    engine.on("epoch_end", lambda e: losses.append(float(e.state.metrics["loss"])), priority=-10)
    result = engine.run(Tiny(classes=3), epochs=4)
    assert losses == pytest.approx([sum(steps[i : i + 4]) / 4 for i in range(0, 16, 4)])

    table = pandas.read_csv(tmp_path / "log.csv")
    assert list(table.columns) == [
        "epoch",
        "step",
        "loss",
        "lr/group0",
        "eval_loss",
        "eval_accuracy",
    ]
    assert table["epoch"].tolist() == [1, 2, 3, 4] and table["step"].tolist() == [4, 8, 12, 16]
    assert table["loss"].tolist() == losses  # floats written in full: read back the same
    assert table["lr/group0"].tolist() == [0.1] * 4
    # measured at epochs 2 and 4; a column first seen at epoch 2 is empty before it
    assert table["eval_accuracy"].isna().tolist() == [True, False, False, False]
    assert table["eval_accuracy"].iloc[-1] == result.metrics["eval_accuracy"]
    rows_of_steps = pandas.read_csv(tmp_path / "log_steps.csv")
    assert list(rows_of_steps.columns) == ["step", "epoch", "loss"]
    assert rows_of_steps["step"].tolist() == [3, 6, 9, 12, 15]
    assert rows_of_steps["epoch"].tolist() == [1, 2, 3, 3, 4]
    assert rows_of_steps["loss"].tolist() == [steps[i - 1] for i in (3, 6, 9, 12, 15)]


def test_a_resumed_run_writes_what_a_straight_run_writes(tmp_path: Path) -> None:
    """Interrupted mid-epoch after step 10, and resumed from the checkpoint before, at
    step 8 (as after a kill): the rows past it are dropped, and the files are those of one
    straight run, value for value (compared as text: bit for bit)."""
    run(tmp_path / "straight", 4, every_steps=2)
    with pytest.raises(runmodel.Interrupted):
        run(tmp_path / "resumed", 4, interrupt_at=10, every_steps=2)
    assert rows(tmp_path / "resumed" / "metrics_steps.csv")[-1]["step"] == "10"
    assert rows(tmp_path / "resumed" / "metrics.csv")[-1]["step"] == "8"
    run(
        tmp_path / "resumed",
        4,
        every_steps=2,
        resume=tmp_path / "resumed" / "checkpoint" / "ckpt-00002-0000000008.pt",
    )
    for name in ("metrics.csv", "metrics_steps.csv"):
        assert rows(tmp_path / "resumed" / name) == rows(tmp_path / "straight" / name)
    assert len(rows(tmp_path / "straight" / "metrics.csv")) == 4


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def test_a_new_run_moves_an_old_file_aside(tmp_path: Path) -> None:
    path = tmp_path / "log.csv"
    path.write_text("epoch,step,loss\n1,4,0.5\n")
    runmodel.Engine(CSV(path), progress=False).run(Tiny(classes=3), epochs=1)
    (old,) = tmp_path.glob("log.old-*.csv")
    assert old.read_text() == "epoch,step,loss\n1,4,0.5\n"
    assert [r["epoch"] for r in rows(path)] == ["1"]


def test_registered_for_configs() -> None:
    pack = make_pack({"type": "csv", "args": {"path": "m.csv", "every_steps": 5}})
    assert isinstance(pack, CSV) and pack.every_steps == 5


def test_bad_arguments_are_refused_when_made(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"\.csv file"):
        CSV(tmp_path / "log.txt")
    with pytest.raises(ValueError, match="every_steps"):
        CSV(every_steps=0)
    (tmp_path / "folder.csv").mkdir()
    with pytest.raises(IsADirectoryError, match=r"folder\.csv"):
        runmodel.Engine(CSV(tmp_path / "folder.csv"), progress=False).run(Tiny(classes=3), epochs=1)

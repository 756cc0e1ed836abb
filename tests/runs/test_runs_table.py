"""``runmodel runs`` (``runmodel/runs/table.py``): the table of run folders, read from their
JSON files without importing torch, folded to the terminal's width or cut to the columns
asked for."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import runmodel
from runmodel.cli import main
from runmodel.packs import Checkpoint
from runmodel.runs import list_runs
from runmodel.runs.table import runs_table

from helpers import dropout_mlp

#: A config run's folder as `runmodel run CONFIG` leaves it (its JSON files), with long
#: values: a run name and a pack list wider than a terminal.
CONFIG = {
    "model": {"type": "digits", "args": {"hidden": 128}},
    "optimizer": {"type": "adam", "args": {"lr": 0.005}},
    "packs": [
        {"type": "checkpoint", "args": {"every": "1ep", "keep": 2}},
        {"type": "tensorboard", "args": {"every_steps": 10}},
    ],
    "epochs": 20,
    "seed": 0,
}


def config_run(root: Path, name: str, lr: float, accuracy: float, packs: bool = True) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    config = json.loads(json.dumps(CONFIG))
    config["optimizer"]["args"]["lr"] = lr
    if not packs:
        config["packs"] = []
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "status.json").write_text(json.dumps({"status": "finished", "started": lr}))
    (folder / "metrics.json").write_text(
        json.dumps(
            {"metrics": {"eval_accuracy": accuracy, "eval_loss": 1 - accuracy}, "steps": 460}
        )
    )
    return folder


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real script run (``engine.run(..., run_dir=)``, with checkpoints) and two config
    run folders that differ in their learning rate and packs."""
    root = tmp_path_factory.mktemp("runs")
    engine = runmodel.Engine(progress=False)
    engine.attach(Checkpoint("checkpoint"))
    engine.run(dropout_mlp(), epochs=2, run_dir=root / "script-run")
    config_run(root, "digits-hidden128_adam-lr0.005_3f9a2c1b40-a-long-name", 0.005, 0.9611)
    config_run(
        root, "digits-hidden128_adam-lr0.002_77e01c2a95-a-long-name", 0.002, 0.9583, packs=False
    )
    return root


def test_listing_runs_reads_json_and_never_imports_torch(runs_root: Path) -> None:
    probe = textwrap.dedent("""
        import sys
        import runmodel.cli
        code = runmodel.cli.main(["runs", sys.argv[1]])
        print("exit", code, "torch imported:", "torch" in sys.modules)
    """)
    env = {**os.environ}  # (not the C environment pytest's process may have grown)
    done = subprocess.run(
        [sys.executable, "-c", probe, str(runs_root)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    lines = done.stdout.splitlines()
    assert lines[-1] == "exit 0 torch imported: False", done.stderr
    names = [line.split()[0] for line in lines[2:-1]]
    assert sorted(names) == [
        "digits-hidden128_adam-lr0.002_77e01c2a95-a-long-name",
        "digits-hidden128_adam-lr0.005_3f9a2c1b40-a-long-name",
        "script-run",
    ]
    [script] = [line.split() for line in lines[2:-1] if line.startswith("script-run ")]
    assert script[1] == "finished" and "8" in script  # 2 epochs of 4 steps


def test_a_wide_table_is_folded_to_the_terminals_width(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config_run(tmp_path, "digits-hidden128_adam-lr0.005_3f9a2c1b40-a-long-name", 0.005, 0.9611)
    config_run(
        tmp_path, "digits-hidden128_adam-lr0.002_77e01c2a95-a-long-name", 0.002, 0.9583, packs=False
    )
    runs_root = tmp_path
    runs = list_runs(runs_root)
    wide = runs_table(runs).splitlines()
    assert max(map(len, wide)) > 100
    folded = runs_table(runs, width=72).splitlines()
    assert max(map(len, folded)) <= 72 < max(map(len, wide))
    assert len(folded) > len(wide)  # rows over several lines
    # every cell is all there, its pieces one under the other in its column
    header = wide[0].split()
    assert folded[0].split()[:2] == ["run", "status"]
    [dashes] = [i for i, line in enumerate(folded) if set(line) == {"-", " "}]
    assert dashes > 1  # the header folded too
    run_width = len(folded[dashes].split()[0])  # the run column's
    assert "".join(line[:run_width].strip() for line in folded[dashes + 1 :]) == "".join(
        run.name for run in runs
    )
    monkeypatch.setenv("COLUMNS", "72")  # as a terminal of 72 columns says
    assert main(["runs", str(runs_root)]) == 0
    assert capsys.readouterr().out.splitlines() == folded
    monkeypatch.delenv("COLUMNS")  # capsys' output is no terminal: no folding
    assert main(["runs", str(runs_root)]) == 0
    assert capsys.readouterr().out.splitlines()[0].split() == header


def test_columns_picks_the_columns_and_a_wrong_name_is_one_line(
    runs_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["runs", str(runs_root), "--columns", "run,lr,eval_accuracy"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["run", "optimizer.args.lr", "eval_accuracy"]
    rows = {line.split()[0]: line.split()[1:] for line in out[2:]}
    assert rows["digits-hidden128_adam-lr0.005_3f9a2c1b40-a-long-name"] == ["0.005", "0.9611"]
    assert rows["script-run"] == ["-", "-"]
    assert main(["runs", str(runs_root), "--columns", "run,eval_acuracy"]) == 2
    captured = capsys.readouterr()
    [line] = captured.err.splitlines()
    assert line.startswith(
        "runmodel runs: error: --columns: no column 'eval_acuracy' (did you "
        "mean 'eval_accuracy'?); the runs have run, status, "
    ), line
    assert captured.out == ""
    assert main(["runs", str(runs_root), "--columns", "args.lr"]) == 0  # the end of one key
    assert capsys.readouterr().out.split()[0] == "optimizer.args.lr"


def test_runs_shows_the_steps_of_an_interrupted_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "killed"
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(
        json.dumps({"script": "/x/train.py", "argv": [], "epochs": 5})
    )
    (run_dir / "status.json").write_text(
        json.dumps({"status": "running", "pid": 2**22 + 7, "host": socket.gethostname()})
    )
    (run_dir / "run.log").write_text("start train at epoch 0, step 0\nepoch 0 step 17 loss 1\n")
    [listed] = list_runs(tmp_path / "runs")
    assert (listed.status, listed.steps) == ("interrupted", 17)

"""Every number a run records per epoch survives a stop and a resume (issue 37, R1): a
config run interrupted in the middle of an epoch (a real SIGINT) and resumed, and one
extended from a checkpoint taken at an epoch's last step (``every="4st"`` with 4 steps an
epoch... 8) with ``runmodel resume --epochs N``, record the straight run's ``run.log``
epoch lines, ``metrics.json`` and CSV rows, and ``EarlyStopping("loss")`` stops where the
straight run does. Real subprocesses through the command line; one straight run per
module."""

from __future__ import annotations

import csv
import json
import os
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import warm as subprocess

TIMEOUT = 240
EPOCHS = 4  # 8 steps each: 64 samples in batches of 8
ROOT = Path(__file__).resolve().parents[2]
ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "PYTHONIOENCODING": "utf-8",
    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
}
ENV.pop("TORCHELASTIC_RUN_ID", None)
RUNMODEL = (sys.executable, "-m", "runmodel")

MODEL = textwrap.dedent('''
    """A small classifier registered as "tiny": 64 samples in batches of 8."""
    import os
    import signal

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import runmodel
    from runmodel.packs import Evaluate


    class Tiny(runmodel.TorchModel):
        def __init__(self, device=None, init_options=None):
            super().__init__(device, init_options)
            self.module = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.1),
                                        nn.Linear(16, 2))

        def setup(self, setup_options=None):
            g = torch.Generator().manual_seed(0)
            x = torch.randn(64, 8, generator=g)
            y = (x[:, 0] + x[:, 1] > 0).long()
            self.train_data = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True,
                                         generator=torch.Generator().manual_seed(1))
            self.eval_data = DataLoader(TensorDataset(x[:32], y[:32]), batch_size=16)
            self.optimizer = torch.optim.SGD(self.module.parameters(), lr=0.05)
            self.loss_fn = nn.CrossEntropyLoss()


    runmodel.register_model("tiny", Tiny)


    def configure(engine):
        """Evaluate every epoch; a Ctrl-C to this process after step INTERRUPT_AT."""
        engine.attach(Evaluate())
        at = int(os.environ.get("INTERRUPT_AT", "-1"))

        @engine.on("runstep", when=lambda e: e.state.step == at)
        def interrupt(engine):
            os.kill(os.getpid(), signal.SIGINT)
''')

CONFIG = textwrap.dedent(f"""
    imports = ["tiny.py"]
    epochs = {EPOCHS}
    seed = 0

    [model]
    type = "tiny"

    [[packs]]
    type = "checkpoint"
    args = {{ every = "4st" }}

    [[packs]]
    type = "csv"

    [[packs]]
    type = "early_stopping"
    args = {{ metric = "loss", patience = 1 }}
""")


def _run(*args: str | Path, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RUNMODEL, *map(str, args), "--no-progress"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={**ENV, **env},
    )


def _only(runs: Path) -> Path:
    [folder] = runs.iterdir()
    return folder


def recorded(folder: Path) -> dict[str, Any]:
    """Every per-epoch number the run wrote: its log's epoch lines (times cut off),
    ``metrics.json``'s metrics and epoch, the CSV pack's rows; and its weights."""
    log = [
        re.sub(r"^\S+ \S+ ", "", line)
        for line in (folder / "run.log").read_text().splitlines()
        if re.search(r" epoch \d+ step ", line)
    ]
    metrics = json.loads((folder / "metrics.json").read_text())
    with open(folder / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return {
        "log": log,
        "metrics": {k: v for k, v in metrics.items() if k not in ("seconds", "timings")},
        "csv": rows,
        "weights": torch.load(folder / "model.pt", weights_only=True),
    }


def same(ours: dict[str, Any], straight: dict[str, Any]) -> None:
    assert ours["log"] == straight["log"]
    assert ours["metrics"] == straight["metrics"]
    assert ours["csv"] == straight["csv"]
    a, b = ours["weights"], straight["weights"]
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("epoch-numbers")
    (folder / "tiny.py").write_text(MODEL)
    (folder / "run.toml").write_text(CONFIG)
    return folder


@pytest.fixture(scope="module")
def straight(project: Path) -> dict[str, Any]:
    runs = project / "runs-straight"
    done = _run("run", "run.toml", "--runs-dir", runs, cwd=project)
    assert done.returncode == 0, done.stderr
    numbers = recorded(_only(runs))
    # the whole length: early stopping never fired (each epoch's loss is lower), so a
    # resumed run that stopped early is caught
    assert [row["epoch"] for row in numbers["csv"]] == [str(e) for e in range(1, EPOCHS + 1)]
    assert len(numbers["log"]) == EPOCHS
    return numbers


def test_a_run_interrupted_mid_epoch_and_resumed_records_the_straight_runs_numbers(
    project: Path, straight: dict[str, Any]
) -> None:
    runs = project / "runs-interrupted"
    stopped = _run("run", "run.toml", "--runs-dir", runs, cwd=project, INTERRUPT_AT="10")
    assert stopped.returncode == 130, stopped.stderr
    folder = _only(runs)
    assert json.loads((folder / "status.json").read_text())["step"] == 11  # epoch 2, 3 in
    resumed = _run("resume", folder, cwd=project)
    assert resumed.returncode == 0, resumed.stderr
    same(recorded(folder), straight)


def test_a_run_extended_from_an_epochs_last_step_records_each_epoch_once(
    project: Path, straight: dict[str, Any]
) -> None:
    """Its newest checkpoint is the one after step 16, epoch 2's last: that epoch's end.
    The extension neither logs epoch 2 again nor lets early stopping see it twice."""
    runs = project / "runs-extended"
    first = _run("run", "run.toml", "--runs-dir", runs, "--epochs", "2", cwd=project)
    assert first.returncode == 0, first.stderr
    folder = _only(runs)
    extended = _run("resume", folder, "--epochs", str(EPOCHS), cwd=project)
    assert extended.returncode == 0, extended.stderr
    same(recorded(folder), straight)

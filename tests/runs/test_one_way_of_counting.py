"""One way of counting for people (issue 19): for a 3-epoch config run, what the progress
lines, the run log, the checkpoint names, ``runmodel runs``, the plot's curves and the
learning-rate lines show agree: the epoch by its ordinal from 1, steps done by their
count. (The terminal's bar: tests/packs/test_progress.py.)"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest

import runmodel
from runmodel import cli
from runmodel.plot import load_runs

MODEL = """
import torch
from torch import nn

import runmodel


class Tiny(runmodel.TorchModel):
    def __init__(self, device=None, init_options=None):
        super().__init__(device, init_options)
        torch.manual_seed(0)
        self.module = nn.Linear(4, 3)

    def setup(self, setup_options=None):
        g = torch.Generator().manual_seed(1)
        x = torch.randn(32, 4, generator=g)
        y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=0.1)
        self.loss_fn = nn.CrossEntropyLoss()
        self.train_data = [(x[i:i + 8], y[i:i + 8]) for i in range(0, 32, 8)]  # 4 steps


runmodel.register_model({name!r}, Tiny)
"""

CONFIG = """
imports = ["tiny.py"]
epochs = 3
device = "cpu"

[model]
type = "{name}"

[optimizer]
type = "sgd"
args = {{ lr = 0.4 }}

[[packs]]
type = "checkpoint"
args = {{ every = "1ep", keep = 3 }}

[[packs]]
type = "lr_schedule"
args = {{ scheduler = {{ type = "ExponentialLR", args = {{ gamma = 0.5 }} }}, interval = "epoch" }}
"""

#: (epoch, steps done, lr) at each epoch's end: the first epoch is 1, its 4 steps used 0.4
EXPECTED = [(1, 4, 0.4), (2, 8, 0.2), (3, 12, 0.1)]


def test_progress_log_checkpoints_runs_and_plot_agree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = f"count-{uuid.uuid4().hex[:8]}"
    (tmp_path / "tiny.py").write_text(MODEL.format(name=name))
    (tmp_path / "config.toml").write_text(CONFIG.format(name=name))
    config = runmodel.load_config(tmp_path / "config.toml")
    result, directory = runmodel.execute(config, tmp_path / "runs", base=tmp_path)
    assert (result.epochs, result.steps) == (3, 12)

    # the progress lines (off a terminal: one per epoch)
    progress = [
        re.fullmatch(r"train epoch (\d)/3  step (\d+)  loss \S+  lr (\S+)  \(\S+s\)", line)
        for line in capsys.readouterr().err.splitlines()
    ]
    assert all(progress), progress
    assert [(int(m[1]), int(m[2]), float(m[3])) for m in progress if m] == EXPECTED

    # the run log
    log = (directory / "run.log").read_text().splitlines()
    epochs = [re.search(r" epoch (\d) step (\d+) loss \S+ lr (\S+)$", line) for line in log[1:-1]]
    assert [(int(m[1]), int(m[2]), float(m[3])) for m in epochs if m] == EXPECTED
    assert log[0].endswith("start train: 0 epochs, 0 steps done")
    assert log[-1].endswith("end: 3 epochs, 12 steps done")

    # checkpoint names: epochs and steps done
    assert sorted(p.name for p in (directory / "checkpoint").glob("ckpt-*.pt")) == [
        f"ckpt-{epoch:05d}-{steps:010d}.pt" for epoch, steps, _ in EXPECTED
    ]

    # runmodel runs
    assert cli.main(["runs", str(tmp_path / "runs")]) == 0
    [row] = capsys.readouterr().out.splitlines()[2:]
    assert row.split()[:3] == [directory.name, "finished", "12"]

    # the plot's curves: the x axis is steps done, and the lr each epoch trained with
    [run] = load_runs([directory])
    assert run.curves["train/loss"].steps == (4, 8, 12)
    lrs = run.curves["lr/group0"]
    assert list(zip(lrs.steps, lrs.values, strict=True)) == [
        (steps, pytest.approx(lr)) for _, steps, lr in EXPECTED
    ]

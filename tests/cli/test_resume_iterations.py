"""``runmodel resume RUN --iterations N`` (issue 36): the run's length in iterations from
its start, as ``--steps`` is in steps; a run of gradient accumulation extended so ends
with the weights and metrics of one straight run of that length, bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from runmodel.cli import main

MODEL = """\
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import runmodel


class Windows(runmodel.TorchModel):
    def __init__(self, device=None, init_options=None):
        super().__init__(device, init_options)
        torch.manual_seed(0)
        self.module = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.25), nn.Linear(8, 1))

    def setup(self, setup_options=None):
        self.optimizer = torch.optim.Adam(self.module.parameters(), lr=0.05)
        self.loss_fn = nn.MSELoss()
        x = torch.randn(40, 4, generator=torch.Generator().manual_seed(0))
        data = TensorDataset(x, x.sum(1, keepdim=True))
        self.train_data = DataLoader(data, batch_size=4, shuffle=True)  # 10 steps an epoch


runmodel.register_model("windows-{tag}", Windows)
"""

CONFIG = """\
imports = ["model.py"]
device = "cpu"
iterations = 3

[model]
type = "windows-{tag}"

[[packs]]
type = "grad_accumulation"
args = {{ k = 2 }}
"""


def finished(folder: Path) -> tuple[dict[str, torch.Tensor], dict[str, object]]:
    metrics = json.loads((folder / "metrics.json").read_text())
    return torch.load(folder / "model.pt", weights_only=True), metrics


def test_resume_with_more_iterations_ends_as_a_straight_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    tag = tmp_path.name[-12:].replace("_", "-")
    (tmp_path / "model.py").write_text(MODEL.format(tag=tag))
    (tmp_path / "windows.toml").write_text(CONFIG.format(tag=tag))

    assert main(["run", "windows.toml", "--iterations", "8", "--runs-dir", "straight"]) == 0
    assert main(["run", "windows.toml", "--no-progress"]) == 0  # 3 iterations: mid-epoch
    [folder] = [p.parent for p in (tmp_path / "runs").rglob("run.log")]
    capsys.readouterr()
    assert main(["resume", str(folder), "--iterations", "8", "--no-progress", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["steps"], result["iterations"]) == (16, 8)

    [straight] = [p.parent for p in (tmp_path / "straight").rglob("run.log")]
    (weights, metrics), (expected, expected_metrics) = finished(folder), finished(straight)
    assert weights.keys() == expected.keys()
    assert all(torch.equal(weights[k], expected[k]) for k in expected)
    assert metrics["metrics"] == expected_metrics["metrics"]
    status = json.loads((folder / "status.json").read_text())
    assert status["iterations"] == 8


def test_steps_and_iterations_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["resume", "somewhere", "--steps", "4", "--iterations", "2"])
    assert exited.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err

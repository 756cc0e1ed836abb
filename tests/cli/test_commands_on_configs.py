"""The command on configs as on any source (``runmodel/runs/target.py``): ``describe`` and
``benchmark`` a config, and bad input about a config run found before it runs, each one
line and exit 2 (issues 28 and 29): a ``ddp`` config outside torchrun, a config whose
model has no eval data for its ``Evaluate`` pack, a cut-short ``--checkpoint`` for
``eval``. In this process, through ``runmodel.cli.main``."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest

from runmodel.cli import main

MODEL = """\
import torch
from torch import nn

import runmodel


class Small(runmodel.TorchModel):
    init_defaults = {{"hidden": 8, "seed": 0}}

    def __init__(self, device=None, init_options=None):
        super().__init__(device, init_options)
        torch.manual_seed(self.init_options["seed"])
        self.module = nn.Sequential(nn.Linear(4, self.init_options["hidden"]), nn.ReLU(),
                                    nn.Linear(self.init_options["hidden"], 2))

    def setup(self, setup_options=None):
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=0.1)
        self.loss_fn = nn.CrossEntropyLoss()
        x = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
        self.train_data = [(x[:8], (x[:8, 0] > 0).long()), (x[8:], (x[8:, 0] > 0).long())]
        if {with_eval}:
            self.eval_data = self.train_data


runmodel.register_model({name!r}, Small)
"""

CONFIG = """\
imports = ["{file}"]
epochs = 1
device = "cpu"
{backend}
[model]
type = "{name}"
args = {{ hidden = 16 }}

[[packs]]
type = "evaluate"
"""


def config(folder: Path, *, with_eval: bool = True, backend: str = "") -> Path:
    """A config of a small registered model (a fresh name) in ``folder``."""
    name = f"small-{uuid.uuid4().hex[:8]}"
    (folder / f"{name}.py").write_text(MODEL.format(name=name, with_eval=with_eval))
    path = folder / f"{name}.toml"
    path.write_text(CONFIG.format(file=f"{name}.py", name=name, backend=backend))
    return path


def one_error_line(capsys: pytest.CaptureFixture[str], command: str = "run") -> str:
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    errors = [line for line in captured.err.splitlines() if not line.startswith("run directory")]
    [line] = errors
    prefix = f"runmodel {command}: error: "
    assert line.startswith(prefix), line
    return line[len(prefix) :]


def test_describe_a_config_shows_its_model_and_the_packs_its_run_has(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["describe", str(path), "--set", "model.args.hidden=4"]) == 0
    out = capsys.readouterr().out.splitlines()
    name = path.stem
    assert out[:5] == [
        f"model: Small from {path} (model {name!r})",
        "device: cpu",
        "module: Sequential, 30 parameters",  # 4*4+4 + 4*2+2
        "init options: hidden=4, seed=0",
        "",
    ]
    hooks = {
        line.split()[2] for line in out[7:] if len(line.split()) > 2 and line.split()[1].isdigit()
    }
    # the config's Evaluate pack, and what every config run has: its log, checkpoints,
    # TensorBoard events and progress
    assert {
        "evaluate",
        "run_log.epoch_end",
        "checkpoint.save",
        "tensorboard.epoch",
        "progress.epoch_end",
    } <= hooks, out
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def test_benchmark_a_config_times_the_model_it_builds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["benchmark", str(path), "--steps", "6", "--warmup", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["mode"], result["steps"]) == ("benchmark", 6)
    assert (result["timings"]["measured_steps"], result["timings"]["warmup"]) == (4, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no run folder


def test_a_ddp_config_outside_torchrun_is_one_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    path = config(tmp_path, backend='backend = "ddp"')
    assert main(["run", str(path), "--runs-dir", str(tmp_path / "runs")]) == 2
    assert one_error_line(capsys) == (
        f"{path}: the config's backend is 'ddp', which runs in processes torchrun starts: run "
        f"it with --nproc-per-node N (1 for one process)"
    )
    assert not (tmp_path / "runs").exists()


def test_a_config_run_without_the_eval_data_its_packs_need_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config(tmp_path, with_eval=False)
    assert main(["run", str(path), "--runs-dir", str(tmp_path / "runs"), "--no-progress"]) == 2
    assert re.fullmatch(
        r"ValueError: Evaluate: Small has no eval_data; .* \(refused at setup, "
        r"before the first step\)",
        one_error_line(capsys),
    )


def test_eval_with_a_cut_short_checkpoint_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config(tmp_path)
    runs = tmp_path / "runs"
    assert main(["run", str(path), "--runs-dir", str(runs), "--no-progress"]) == 0
    [run_dir] = runs.iterdir()
    [saved] = (run_dir / "checkpoint").glob("ckpt-*.pt")
    cut = tmp_path / "cut.pt"
    cut.write_bytes(saved.read_bytes()[: saved.stat().st_size // 2])
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--checkpoint", str(cut)]) == 2
    message = one_error_line(capsys, "eval")
    assert message.startswith(
        f"'{cut}' is not a readable checkpoint: it is cut short or damaged"
    ), message
    assert not (run_dir / "eval.json").exists()

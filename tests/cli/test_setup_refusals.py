"""Small input gaps (issue 37, R6): each is one clear error at setup, naming what was wrong
and what would be right, and nothing is written: no run folder (not even an empty one),
no exported file. A signal given by name from Python works as the command's
``--preempt-signal`` does.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import runmodel
from runmodel.cli import main

MODEL = textwrap.dedent("""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import runmodel


    class Small(runmodel.TorchModel):
        def __init__(self, device=None, init_options=None):
            super().__init__(device, init_options)
            self.module = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))

        def setup(self, setup_options=None):
            x = torch.randn(32, 4, generator=torch.Generator().manual_seed(0))
            self.train_data = DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=8)
            self.optimizer = torch.optim.SGD(self.module.parameters(), lr=0.1)
            self.loss_fn = nn.CrossEntropyLoss()


    runmodel.register_model("small_r6", Small)
""")

CONFIG = 'imports = ["small.py"]\nepochs = 2\n\n[model]\ntype = "small_r6"\n'


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("refusals")
    (folder / "small.py").write_text(MODEL)
    (folder / "run.toml").write_text(CONFIG)
    return folder


def _model() -> runmodel.TorchModel:
    x = torch.randn(16, 4)
    return runmodel.TorchModel.from_parts(
        nn.Linear(4, 2),
        optimizer=torch.optim.SGD,
        loss_fn=nn.CrossEntropyLoss(),
        train_data=DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=4),
    )


def test_sigkill_from_python_is_refused_clearly(tmp_path: Path) -> None:
    engine = runmodel.Engine(progress=False)
    with pytest.raises(ValueError, match=r"SIGKILL cannot be caught.*such as SIGTERM"):
        engine.run(_model(), epochs=1, run_dir=tmp_path / "run", preempt_signals=(signal.SIGKILL,))
    assert not (tmp_path / "run").exists()


def test_a_signal_given_by_name_from_python_preempts_the_run(tmp_path: Path) -> None:
    """``preempt_signals="SIGUSR1"`` (one name, not a tuple): a real SIGUSR1 preempts."""
    engine = runmodel.Engine(progress=False)
    engine.on("runstep", once=2)(lambda e: os.kill(os.getpid(), signal.SIGUSR1))
    with pytest.raises(runmodel.Preempted):
        engine.run(_model(), epochs=2, run_dir=tmp_path / "run", preempt_signals="SIGUSR1")
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert (status["status"], status["signal"], status["step"]) == ("preempted", "SIGUSR1", 3)


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (["--nnodes", "3:1"], "'3:1': MIN:MAX with MIN <= MAX, as in 1:3"),
        (["--preempt-grace", "10"], "--preempt-grace 10: torchrun's time to save"),
    ],
)
def test_launcher_options_that_cannot_work_are_refused_at_once(
    project: Path, given: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = project / "runs-launch"
    argv = ["run", str(project / "small.py"), "--epochs", "1", "--runs-dir", str(runs), *given]
    try:
        code = main(argv)
    except SystemExit as ended:  # argparse's refusal
        code = int(ended.code or 0)
    assert code == 2
    assert said in capsys.readouterr().err
    assert not runs.exists()


@pytest.mark.parametrize(
    ("packs", "said"),
    [
        ('[[packs]]\ntype = "swa"\nargs = {start = 2}\n', "SWA(start=2) averages from epoch 2"),
        (
            '[[packs]]\ntype = "ema"\nargs = {use_averaged = true}\n'
            '[[packs]]\ntype = "swa"\nargs = {use_averaged = true}\n',
            "both have use_averaged=True",
        ),
        ('[[packs]]\ntype = "mlflow"\n', "mlflow"),
    ],
)
def test_a_config_refused_at_setup_leaves_no_run_folder(
    project: Path,
    packs: str,
    said: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)  # an extra that is not installed
    config = project / "refused.toml"
    config.write_text(CONFIG + packs)
    runs = project / "runs-refused"
    assert main(["run", str(config), "--runs-dir", str(runs), "--no-progress"]) == 2
    assert said in capsys.readouterr().err
    assert not runs.exists() or not any(runs.iterdir())


def test_export_to_a_folder_is_refused_before_exporting(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = project / "runs-export"
    assert main(["run", str(project / "run.toml"), "--runs-dir", str(runs), "--no-progress"]) == 0
    [run] = runs.iterdir()
    out = project / "exported"
    out.mkdir()
    capsys.readouterr()
    assert main(["export", str(run), str(out), "--format", "pt2"]) == 2
    assert f"{out} is a folder: give the program's file, such as {out / 'model.pt2'}" in (
        capsys.readouterr().err
    )
    assert list(out.iterdir()) == []

"""Config runs resume exactly: a `runmodel run CONFIG` killed with SIGKILL (mid-epoch,
at an epoch's end, while writing a checkpoint) or stopped with Ctrl-C, then continued by
`runmodel resume RUN_DIR`, ends with the weights of one straight config run, bit for bit.

The model file registers a small MLP with dropout on a shuffled DataLoader; its
``configure(engine)`` (which config runs call, as source runs do) kills the process where
``$KILL`` says, with a real SIGKILL, or sends it a real SIGINT.
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

from runmodel.config.runconfig import load_config

import warm as subprocess

TIMEOUT = 240
MODEL = textwrap.dedent("""
    import os, signal
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    import runmodel
    import runmodel.checkpoint

    class Net(runmodel.TorchModel):
        def __init__(self, device=None, init_options=None):
            super().__init__("cpu", init_options)
            torch.manual_seed(0)
            self.module = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3),
                                        nn.Linear(16, 1))

        def setup(self, setup_options=None):
            g = torch.Generator().manual_seed(1)
            x = torch.randn(44, 6, generator=g)
            self.optimizer = torch.optim.Adam(self.module.parameters(), lr=1e-2)
            self.loss_fn = nn.MSELoss()
            self.train_data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)),
                                         batch_size=8, shuffle=True)

    runmodel.register_model("net", Net)

    def configure(engine):
        kind, _, at = os.environ.get("KILL", "").partition(":")
        if kind == "step":       # after step `at` and its checkpoint
            engine.on("runstep", lambda e: os.kill(os.getpid(), signal.SIGKILL), once=int(at),
                      priority=-2000)
        elif kind == "save":     # the `at`-th checkpoint is written, not yet renamed
            replace, saves = os.replace, [0]
            def replace_then_die(source, target):
                saves[0] += 1
                if saves[0] == int(at):
                    os.kill(os.getpid(), signal.SIGKILL)
                replace(source, target)
            runmodel.checkpoint.format.os.replace = replace_then_die
        elif kind == "ctrl-c":   # a real SIGINT, as a terminal's Ctrl-C sends
            engine.on("step_start", lambda e: os.kill(os.getpid(), signal.SIGINT),
                      once=int(at))
""")
CONFIG = textwrap.dedent("""
    imports = ["net.py"]
    epochs = 4
    [model]
    type = "net"
    [[packs]]
    type = "checkpoint"
    args = { every = "1st", keep = 2 }
""")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("config-resume")
    (folder / "net.py").write_text(MODEL)
    (folder / "run.toml").write_text(CONFIG)
    return folder


def runmodel_cli(*args: str, cwd: Path, kill: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KILL": kill, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "runmodel", *args, "--no-progress"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "model.pt", weights_only=True)


@pytest.fixture(scope="module")
def straight(project: Path) -> dict[str, torch.Tensor]:
    result = runmodel_cli("run", "run.toml", "--runs-dir", "straight", cwd=project)
    assert result.returncode == 0, result.stderr
    return weights(project / "straight" / load_config(project / "run.toml").run_name())


# (the kill matrix of tests/faults and tests/faults/test_exact_resume.py covers many more points;
# here the command line's path: mid-epoch, and during a save)
@pytest.mark.parametrize("kill", ["step:9", "save:14"])
def test_a_killed_config_run_resumed_with_runmodel_resume_ends_bit_identical(
    project: Path, straight: dict[str, torch.Tensor], kill: str
) -> None:
    # 6 batches an epoch: step 9 is mid-epoch 1, save 14 in epoch 2
    runs = f"runs-{kill.replace(':', '')}"
    run_dir = project / runs / load_config(project / "run.toml").run_name()
    killed = runmodel_cli("run", "run.toml", "--runs-dir", runs, cwd=project, kill=kill)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = runmodel_cli("resume", str(run_dir), cwd=project)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from" in resumed.stderr
    assert resumed.stdout.startswith("train: completed after 24 steps, 4 epochs")
    got = weights(run_dir)
    assert all(torch.equal(got[k], straight[k]) for k in straight), kill


def test_ctrl_c_saves_marks_the_run_interrupted_and_resume_finishes_it(
    project: Path, straight: dict[str, torch.Tensor]
) -> None:
    run_dir = project / "runs-ctrl-c" / load_config(project / "run.toml").run_name()
    stopped = runmodel_cli(
        "run", "run.toml", "--runs-dir", "runs-ctrl-c", cwd=project, kill="ctrl-c:8"
    )  # at step 8, the 3rd step of epoch 1
    assert stopped.returncode == 130, stopped.stderr
    assert "stopping after this step, then saving" in stopped.stderr
    relative = run_dir.relative_to(project)
    assert f"continue it with `runmodel resume {relative}`" in stopped.stderr
    # one interrupt: the run raised runmodel.Interrupted, as a script's does; no result
    assert "Ctrl-C stopped the run after step 9;" in stopped.stderr and stopped.stdout == ""
    status = json.loads((run_dir / "status.json").read_text())
    assert status["status"] == "interrupted" and status["step"] == 9
    assert status["error"] == "interrupted: Ctrl-C (after step 9)"
    # the final checkpoint is where it stopped (step 9, in epoch 1), not only the last one
    # of every="1st"
    assert (run_dir / "checkpoint" / "ckpt-00001-0000000009.pt").exists()
    resumed = runmodel_cli("resume", str(run_dir), cwd=project)
    assert resumed.returncode == 0, resumed.stderr
    got = weights(run_dir)
    assert all(torch.equal(got[k], straight[k]) for k in straight)

"""A stop inside a ``GradAccumulation`` window (issue 37, item 2): a run with
``GradAccumulation(2)`` interrupted by a real SIGINT after an odd step (the window half
full), or resumed from a ``Checkpoint(every="3st")`` save after an odd step, ends with the
straight run's weights, bit for bit: the checkpoint holds the window's gradients and the
resumed run completes the window. In one process and under torchrun (2 processes, gloo),
through the command line; one straight run per module and world size, both started as
the module begins."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

import warm as subprocess
from helpers import default_ctrl_c

TIMEOUT = 300
ROOT = Path(__file__).resolve().parents[2]
ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "PYTHONIOENCODING": "utf-8",
    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
}
ENV.pop("TORCHELASTIC_RUN_ID", None)
RUNMODEL = (sys.executable, "-m", "runmodel")
TWO = ("--nproc-per-node", "2")

MODEL = textwrap.dedent('''
    """A small classifier registered as "tiny": 64 samples in batches of 8."""
    import os
    import signal
    import time

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import runmodel


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
            self.optimizer = torch.optim.Adam(self.module.parameters(), lr=0.01)
            self.loss_fn = nn.CrossEntropyLoss()


    runmodel.register_model("tiny", Tiny)


    def configure(engine):
        """After step INTERRUPT_AT of process rank 0, a Ctrl-C to the command (under
        torchrun to the launcher, which hands it on to every process); slow steps after it,
        so that the processes' next check together comes after the signal reached them."""
        at = int(os.environ.get("INTERRUPT_AT", "-1"))

        @engine.on("runstep", when=lambda e: e.state.step == at and e.state.rank == 0)
        def interrupt(engine):
            launched = "LOCAL_WORLD_SIZE" in os.environ  # torchrun's process: its parent
            os.kill(os.getppid() if launched else os.getpid(), signal.SIGINT)

        @engine.on("runstep", when=lambda e: 0 <= at < e.state.step)
        def slowly(engine):
            time.sleep(0.1)
''')

PACKS = """
    [[packs]]
    type = "grad_accumulation"
    args = { k = 2 }

    [[packs]]
    type = "checkpoint"
    args = { every = "3st", keep = 20 }
"""
CONFIG = textwrap.dedent('imports = ["tiny.py"]\nepochs = 3\nseed = 0\n[model]\ntype = "tiny"\n')
# under torchrun the processes check for a signal together every 5 steps: signalled
# after step 1, they stop after step 5 of 12 (each has 4 an epoch), inside a window
DDP = CONFIG + '[backend]\ntype = "ddp"\nargs = { preempt_check_every = 5 }\n'


def _run(*args: str | Path, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The command, Ctrl-C as a terminal delivers it."""
    return subprocess.run(
        [*RUNMODEL, *map(str, args), "--no-progress"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={**ENV, **env},
        preexec_fn=default_ctrl_c,
    )


def _only(runs: Path) -> Path:
    [folder] = runs.iterdir()
    return folder


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return torch.load(folder / "model.pt", weights_only=True)


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    assert [k for k in a if not torch.equal(a[k], b[k])] == []


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("accumulation")
    (folder / "tiny.py").write_text(MODEL)
    (folder / "run.toml").write_text(CONFIG + textwrap.dedent(PACKS))
    (folder / "ddp.toml").write_text(DDP + textwrap.dedent(PACKS))
    return folder


@pytest.fixture(scope="module")
def straight(project: Path) -> Iterator[Callable[[str], dict[str, torch.Tensor]]]:
    """The straight run of each config, both started at once in the background (a test's
    own runs go on beside them: the cores are busier, the tests shorter); its weights,
    awaited when a test asks."""
    launches = {"run.toml": ("--no-progress",), "ddp.toml": (*TWO, "--no-progress")}
    processes = {
        config: subprocess.Popen(
            [*RUNMODEL, "run", config, "--runs-dir", f"straight-{config}", *launch],
            cwd=project,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
            start_new_session=True,  # killed with its processes
        )
        for config, launch in launches.items()
    }

    def weights(config: str) -> dict[str, torch.Tensor]:
        _, err = processes[config].communicate(timeout=TIMEOUT)
        assert processes[config].returncode == 0, err
        return _weights(_only(project / f"straight-{config}"))

    try:
        yield weights
    finally:
        for process in processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.communicate()


def _interrupted(project: Path, config: str, at: int, *launch: str) -> tuple[Path, int]:
    """The run stopped by a Ctrl-C after its step ``at``: its folder and its step."""
    runs = project / f"runs-interrupted-{config}"
    stopped = _run("run", config, "--runs-dir", runs, *launch, cwd=project, INTERRUPT_AT=str(at))
    assert stopped.returncode == 130, stopped.stderr
    folder = _only(runs)
    step = int(json.loads((folder / "status.json").read_text())["step"])
    assert step % 2 == 1, step  # inside a window of 2
    return folder, step


def test_one_process_interrupted_inside_a_window_resumes_bit_identical(
    project: Path, straight: Callable[[str], dict[str, torch.Tensor]]
) -> None:
    folder, step = _interrupted(project, "run.toml", 10)
    assert step == 11
    checkpoints = sorted((folder / "checkpoint").iterdir())
    resumed = _run("resume", folder, cwd=project)
    assert resumed.returncode == 0, resumed.stderr
    _same(_weights(folder), straight("run.toml"))

    # the every="3st" save after step 9 (inside a window), the newest once those after
    # it are gone: resumed from it, the same
    assert [p.name[-7:] for p in checkpoints] == ["0003.pt", "0006.pt", "0009.pt", "0011.pt"]
    for path in (folder / "checkpoint").iterdir():
        if path not in checkpoints[:3]:
            path.unlink()
    (folder / "model.pt").unlink()
    again = _run("resume", folder, cwd=project)
    assert again.returncode == 0, again.stderr
    _same(_weights(folder), straight("run.toml"))


def test_two_processes_interrupted_inside_a_window_resume_bit_identical(
    project: Path, straight: Callable[[str], dict[str, torch.Tensor]]
) -> None:
    folder, step = _interrupted(project, "ddp.toml", 0, *TWO)
    assert step == 5
    resumed = _run("resume", folder, cwd=project)
    assert resumed.returncode == 0, resumed.stderr
    _same(_weights(folder), straight("ddp.toml"))

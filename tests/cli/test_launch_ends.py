"""How a launch (``runmodel run ... --nproc-per-node N``, or any launcher option) ends when
one of its processes ends it on purpose (issue 37, R2, R3, R5): a refusal at setup ends
the launch at once with exit 2, never restarted under ``--max-restarts`` into a resume of
the finished run, nothing written; a preemption signal sent to one process (not the
launcher) ends the run ``preempted``, exit 143, never restarted, no ``failed_rank``; and
a run of one process under ``fsdp`` saves the step its status names. Real torchrun, real
signals.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import warm as subprocess
from helpers import signal_when_ready

TIMEOUT = 300  # seconds for one command (a launch takes ten or more on a busy machine)
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8"}
ENV.pop("TORCHELASTIC_RUN_ID", None)
ENV["PYTHONPATH"] = os.pathsep.join(
    [str(Path(__file__).resolve().parents[2]), *filter(None, [os.environ.get("PYTHONPATH")])]
)
RUNMODEL = (sys.executable, "-m", "runmodel")

MODEL = textwrap.dedent('''
    """A small classifier registered as "tiny"; SAMPLES (64) training samples."""
    import os
    import time

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import runmodel

    SAMPLES = int(os.environ.get("SAMPLES", "64"))


    class Tiny(runmodel.TorchModel):
        def __init__(self, device=None, init_options=None):
            super().__init__(device, init_options)
            self.module = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))

        def setup(self, setup_options=None):
            g = torch.Generator().manual_seed(0)
            x = torch.randn(SAMPLES, 8, generator=g)
            y = (x[:, 0] + x[:, 1] > 0).long()
            self.train_data = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True,
                                         generator=torch.Generator().manual_seed(1))
            self.optimizer = torch.optim.SGD(self.module.parameters(), lr=0.1)
            self.loss_fn = nn.CrossEntropyLoss()


    runmodel.register_model("tiny", Tiny)


    def configure(engine):
        """From READY_AT on, slow steps (PAUSE s), saying "ready" (rank 0) once each
        process wrote its pid into PIDS; EVERY: a Checkpoint pack saving every EVERY steps
        (in "every")."""
        if os.environ.get("EVERY"):
            from runmodel.packs import Checkpoint

            engine.attach(Checkpoint("every", every=f"{os.environ['EVERY']}st"))
        ready_at = int(os.environ.get("READY_AT", "-1"))
        if ready_at >= 0:
            @engine.on("runstep", when=lambda e: e.state.step >= ready_at)
            def slowly(engine):
                pids = os.environ.get("PIDS")
                if pids:
                    with open(f"{pids}/{engine.state.rank}", "w") as f:
                        f.write(str(os.getpid()))
                if engine.state.rank == 0 and (not pids or len(os.listdir(pids)) > 1):
                    print("ready", flush=True)
                time.sleep(float(os.environ.get("PAUSE", "0.05")))
''')

CONFIG = 'imports = ["tiny.py"]\nepochs = 2\n\n[model]\ntype = "tiny"\n'
KEPT = ("status.json", "metrics.json", "run.log")


def _run(*args: str | Path, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={**ENV, **env},
    )


def _read(folder: Path, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / name).read_text())
    return data


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("launch-ends")
    (folder / "tiny.py").write_text(MODEL)
    (folder / "run.toml").write_text(CONFIG)
    return folder


def test_a_refusal_at_setup_ends_the_launch_at_once_with_exit_2(project: Path) -> None:
    """R2: ``runmodel run CONFIG --max-restarts 2`` (one process: no --nproc-per-node) on
    a config whose run is there: refused once, exit 2, the finished run's files as they
    were (torchrun restarted it into a resume that rewrote them); a bad source under
    ``--nproc-per-node 2 --max-restarts 2``: refused once, not 1 + 2 times."""
    runs = project / "runs-refused"
    first = _run(*RUNMODEL, "run", "run.toml", "--runs-dir", runs, "--no-progress", cwd=project)
    assert first.returncode == 0, first.stderr[-3000:]
    [folder] = runs.iterdir()
    before = {name: (folder / name).read_bytes() for name in KEPT}

    again = _run(
        *RUNMODEL, "run", "run.toml", "--runs-dir", runs, "--no-progress", "--max-restarts", "2",
        cwd=project,
    )  # fmt: skip
    assert again.returncode == 2, again.stderr[-3000:]
    assert again.stderr.count("holds a run of this config already") == 1, again.stderr[-3000:]
    assert {name: (folder / name).read_bytes() for name in KEPT} == before
    assert [p.name for p in runs.iterdir()] == [folder.name]

    bad = _run(
        *RUNMODEL, "run", "tiny.py:Nope", "--epochs", "1", "--runs-dir", project / "runs-bad",
        "--no-progress", "--nproc-per-node", "2", "--max-restarts", "2",
        cwd=project,
    )  # fmt: skip
    assert bad.returncode == 2, bad.stderr[-3000:]
    said = bad.stderr.count("'Nope' is not defined")
    assert 1 <= said <= 2, bad.stderr[-3000:]  # each process once at most: no restart
    assert "death signal" not in bad.stderr, bad.stderr[-3000:]
    assert not (project / "runs-bad").exists()


def test_sigterm_to_one_process_is_a_preemption_never_restarted(
    project: Path, tmp_path: Path
) -> None:
    """R3: SIGTERM to the process of rank 1 alone (not the launcher), under
    ``--max-restarts 1``: both processes stop at one step and save, the run ends
    ``preempted`` (no ``failed_rank``, no restart), the launcher exits 143."""
    runs, pids = project / "runs-one-rank", tmp_path / "pids"
    pids.mkdir()
    proc = subprocess.Popen(
        [
            *RUNMODEL, "run", "run.toml", "--runs-dir", str(runs), "--no-progress",
            "--nproc-per-node", "2", "--max-restarts", "1",
        ],
        cwd=project,
        env={**ENV, "SAMPLES": "256", "READY_AT": "3", "PAUSE": "0.2", "PIDS": str(pids)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        while (line := proc.stdout.readline()) != "ready\n":
            assert line, f"ended before it was ready: {proc.communicate()}"
        os.kill(int((pids / "1").read_text()), signal.SIGTERM)
        _, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 143, err[-4000:]
    [folder] = runs.iterdir()
    status = _read(folder, "status.json")
    assert (status["status"], status.get("signal")) == ("preempted", "SIGTERM"), status
    assert "failed_rank" not in status and "restarts" not in status, status
    step = int(status["step"])
    assert status["files"]["last_checkpoint"] == f"checkpoint/ckpt-00000-{step:010d}.pt"
    assert (folder / status["files"]["last_checkpoint"]).is_file()


def test_fsdp_in_one_process_saves_the_step_its_status_names(project: Path) -> None:
    """R5: ``--nproc-per-node 1 --backend fsdp`` with a Checkpoint pack saving every 5
    steps, SIGTERM in the middle of the run: the checkpoint the status names holds the
    step the status names (the pack skipped the save at the stop, taking the process's
    own stop for one the processes did not agree on, and the status named its save
    before)."""
    runs = project / "runs-fsdp"
    code, err = signal_when_ready(
        [
            *RUNMODEL, "run", "tiny.py", "--epochs", "2", "--runs-dir", str(runs),
            "--no-progress", "--nproc-per-node", "1", "--backend", "fsdp",
        ],
        project,
        signal.SIGTERM,
        env={**ENV, "SAMPLES": "256", "READY_AT": "13", "PAUSE": "0.2", "EVERY": "5"},
        timeout=TIMEOUT,
        group=False,
    )  # fmt: skip
    assert code == 143, err[-4000:]
    [folder] = runs.iterdir()
    status = _read(folder, "status.json")
    assert status["status"] == "preempted", status
    step = int(status["step"])
    assert step % 5 and status["files"]["last_checkpoint"] == f"every/ckpt-00000-{step:010d}"
    saved = torch.load(folder / status["files"]["last_checkpoint"] / "run-0.pt", weights_only=False)
    assert saved["engine"]["counters"]["step"] == step, saved["engine"]["counters"]

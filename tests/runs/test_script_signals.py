"""A script's run in its folder (``python train.py RUN``: ``Checkpoint(RUN +
"/checkpoint")``, ``run_dir=RUN``) under real signals and a real closed pipe (issue 37):

- R4: a second SIGTERM 0.05-0.1 s after the first (a wrapper forwarding it, a scheduler
  signalling the group) is the same preemption: the save is not killed, the status says
  ``preempted`` (never ``running``), the checkpoint it names holds the step it names;
- item 8: ``python train.py RUN 2>&1 | tee log`` and Ctrl-C to the group ends ``tee``;
  a ``print`` in the script's own hook then meets the closed pipe before the step is
  done, and the run still ends as the Ctrl-C asks: saved, ``interrupted``, 130;
- item 7: the run folder copied (``cp -r runs/a runs/b``) and ``runmodel resume runs/b``:
  the Checkpoint folder the script spelled ``runs/a/checkpoint`` is found in the copy.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import warm as subprocess
from helpers import default_ctrl_c, signal_when_ready

TIMEOUT = 120
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8"}
ENV.pop("TORCHELASTIC_RUN_ID", None)
ENV["PYTHONPATH"] = os.pathsep.join(
    [str(Path(__file__).resolve().parents[2]), *filter(None, [os.environ.get("PYTHONPATH")])]
)

#: 2 epochs of 8 steps; from step READY_AT on each step says "ready", sleeps PAUSE s and
#: then says "done" (the print that meets a closed pipe).
SCRIPT = textwrap.dedent("""
    import os
    import signal
    import sys
    import time

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import runmodel
    from runmodel.packs import Checkpoint

    RUN = sys.argv[1]
    torch.manual_seed(0)
    x = torch.randn(64, 8)
    y = (x[:, 0] > 0).long()
    model = runmodel.TorchModel.from_parts(
        nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)),
        optimizer=torch.optim.SGD, loss_fn=nn.CrossEntropyLoss(),
        train_data=DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True,
                              generator=torch.Generator().manual_seed(1)))
    engine = runmodel.Engine(Checkpoint(RUN + "/checkpoint", every="1ep"), progress=False)
    ready_at = int(os.environ.get("READY_AT", "-1"))

    @engine.on("runstep", when=lambda e: ready_at >= 0 and e.state.step >= ready_at)
    def slowly(engine):
        print("ready", flush=True)
        time.sleep(float(os.environ.get("PAUSE", "0.3")))
        print("done", engine.state.step, flush=True)

    engine.run(model, epochs=2, run_dir=RUN, preempt_signals=[signal.SIGTERM])
""")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("script-signals")
    (folder / "train.py").write_text(SCRIPT)
    return folder


def _status(run: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run / "status.json").read_text())
    return data


def _saved_at_the_step_named(run: Path, how: str) -> int:
    status = _status(run)
    assert status["status"] == how, status
    step = int(status["step"])
    assert status["files"]["last_checkpoint"] == f"checkpoint/ckpt-00000-{step:010d}.pt", status
    saved = torch.load(run / status["files"]["last_checkpoint"], weights_only=False)
    assert saved["engine"]["counters"]["step"] == step
    return step


def test_a_second_sigterm_soon_after_the_first_does_not_cost_the_save(project: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "train.py", "runs/twice"],
        cwd=project,
        env={**ENV, "READY_AT": "3"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_ctrl_c,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        while (line := proc.stdout.readline()) != "ready\n":
            assert line, f"ended before it was ready: {proc.communicate()}"
        proc.send_signal(signal.SIGTERM)  # the wrapper's
        time.sleep(0.07)
        os.killpg(proc.pid, signal.SIGTERM)  # the scheduler's, to the group
        _, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == -signal.SIGTERM, err  # 143 in a shell
    assert _saved_at_the_step_named(project / "runs" / "twice", "preempted") > 3, err


def test_a_second_sigterm_later_stops_at_once_and_says_so_in_the_status(
    project: Path,
) -> None:
    """Past the window (2 s), a second SIGTERM stops the run at once: nothing more saved,
    the status ``interrupted`` (not ``running``), the process ended by SIGTERM."""
    proc = subprocess.Popen(
        [sys.executable, "train.py", "runs/late"],
        cwd=project,
        env={**ENV, "READY_AT": "3", "PAUSE": "30"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        while (line := proc.stdout.readline()) != "ready\n":
            assert line, f"ended before it was ready: {proc.communicate()}"
        proc.send_signal(signal.SIGTERM)
        time.sleep(2.5)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == -signal.SIGTERM, err
    status = _status(project / "runs" / "late")
    assert status["status"] == "interrupted" and "SIGTERM again" in status["error"], status
    assert not list((project / "runs" / "late").glob("checkpoint/ckpt-*"))


def test_a_closed_output_during_ctrl_c_ends_the_run_as_the_interrupt(project: Path) -> None:
    code, _ = signal_when_ready(
        [sys.executable, "train.py", "runs/piped"],
        project,
        signal.SIGINT,
        env={**ENV, "READY_AT": "3"},
        timeout=TIMEOUT,
        close_output=True,
    )
    assert code == -signal.SIGINT  # 130 in a shell
    _saved_at_the_step_named(project / "runs" / "piped", "interrupted")


def test_a_copied_script_run_finds_its_checkpoints_in_the_copy(project: Path) -> None:
    runs = project / "runs"
    first = subprocess.run(
        [sys.executable, "train.py", "runs/a"],
        cwd=project,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert first.returncode == 0, first.stderr
    started = sorted(p.name for p in (runs / "a" / "checkpoint").iterdir())
    assert started[-1] == "ckpt-00002-0000000016.pt"
    shutil.copytree(runs / "a", runs / "b")
    resumed = subprocess.run(
        [sys.executable, "-m", "runmodel", "resume", "runs/b", "--epochs", "3", "--no-progress"],
        cwd=project,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert _status(runs / "b")["status"] == "finished"
    assert max(p.name for p in (runs / "b" / "checkpoint").iterdir()) == (
        "ckpt-00003-0000000024.pt"
    )
    assert not (runs / "b" / "runs").exists()
    assert sorted(p.name for p in (runs / "a" / "checkpoint").iterdir()) == started

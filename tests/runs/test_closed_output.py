"""A run whose output closes with no signal (``python train.py RUN | head -n 3``: the
reader has its lines and goes away) ends as an interrupt, in real processes (issue 37,
item 8): the ``print`` that meets the closed pipe fails nothing, the step under way is
saved, the status says ``interrupted`` (its error: the output closed), the process ends
as Ctrl-C does (130), and the run resumed from there finishes as a straight run does."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import warm as subprocess

TIMEOUT = 120
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8"}
ENV.pop("TORCHELASTIC_RUN_ID", None)
ENV["PYTHONPATH"] = os.pathsep.join(
    [str(Path(__file__).resolve().parents[2]), *filter(None, [os.environ.get("PYTHONPATH")])]
)

#: 2 epochs of 8 steps; with PRINT set, each step from step 2 on prints a line to stdout
SCRIPT = textwrap.dedent("""
    import os
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

    @engine.on("runstep", when=lambda e: "PRINT" in os.environ and e.state.step >= 2)
    def say(engine):
        print("step", engine.state.step, flush=True)  # no guard of the user's own
        time.sleep(0.2)  # head has its lines and is gone before the next print

    engine.run(model, epochs=2, run_dir=RUN)
""")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("closed-output")
    (folder / "train.py").write_text(SCRIPT)
    straight = _python(folder, "train.py", "runs/straight")
    assert straight.returncode == 0, straight.stderr
    return folder


def _python(folder: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=folder,
        env={**ENV, **env},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def _final(run: Path) -> dict[str, Any]:
    saved: dict[str, Any] = torch.load(
        run / "checkpoint" / "ckpt-00002-0000000016.pt", weights_only=False
    )
    return saved


def test_a_pipe_closed_by_its_reader_stops_saves_and_resumes_exactly(project: Path) -> None:
    piped = subprocess.run(  # the exit code of python's side of the pipe, not head's
        ["bash", "-c", 'PRINT=1 "$0" train.py runs/piped | head -n 3; exit "${PIPESTATUS[0]}"',
         sys.executable],
        cwd=project,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )  # fmt: skip
    assert piped.stdout == "step 2\nstep 3\nstep 4\n"
    assert piped.returncode == 130, piped.stderr  # ended as Ctrl-C ends a process
    assert "BrokenPipeError" not in piped.stderr
    assert "a closed output stopped the run after step" in piped.stderr, piped.stderr
    run = project / "runs" / "piped"
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "interrupted" and "output closed" in status["error"], status
    step = int(status["step"])
    assert 5 <= step < 16, status
    name = status["files"]["last_checkpoint"]
    assert name == f"checkpoint/ckpt-{step // 8:05d}-{step:010d}.pt", status
    assert torch.load(run / name, weights_only=False)["engine"]["counters"]["step"] == step

    resumed = _python(project, "-m", "runmodel", "resume", "runs/piped", "--no-progress")
    assert resumed.returncode == 0, resumed.stderr
    straight, after = _final(project / "runs" / "straight"), _final(run)
    _assert_same(after["model"], straight["model"], "model")
    metrics = [
        json.loads((project / "runs" / r / "metrics.json").read_text())["metrics"]
        for r in ("straight", "piped")
    ]
    assert metrics[0] == metrics[1]


def _assert_same(got: Any, want: Any, where: str) -> None:
    """``got`` equal to ``want``, tensors bit for bit, nested mappings and lists alike."""
    if isinstance(want, torch.Tensor):
        assert torch.equal(got, want), where
    elif isinstance(want, dict):
        assert got.keys() == want.keys(), where
        for key in want:
            _assert_same(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _assert_same(g, w, f"{where}[{i}]")
    else:
        assert got == want, where

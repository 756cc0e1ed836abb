"""The everyday packs together on the digits model (Unfreeze, Evaluate, EarlyStopping, a
best-K Checkpoint, LRSchedule, GradClip, Progress), killed with a real SIGKILL and rerun
with ``resume="auto"``: the rerun ends with the parameters of one straight run, bit for
bit, and the packs' own state (the unfrozen set, the schedule, the best checkpoints, the
patience count) carries across."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import warm as subprocess

pytest.importorskip("sklearn")

SCRIPT = textwrap.dedent("""
    import os, signal
    import torch
    from sklearn.datasets import load_digits
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    import runmodel
    from runmodel.packs import (Checkpoint, EarlyStopping, Evaluate, GradClip, LRSchedule,
                                Progress, Unfreeze)

    torch.manual_seed(0)
    x, y = load_digits(return_X_y=True)
    data = TensorDataset(torch.tensor(x, dtype=torch.float32) / 16, torch.tensor(y))
    train, test = torch.utils.data.random_split(data, [1437, 360])
    model = runmodel.TorchModel.from_parts(
        nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 10)),
        optimizer=lambda params: torch.optim.Adam(params, lr=1e-2, weight_decay=1e-3),
        loss_fn=nn.CrossEntropyLoss(), train_data=DataLoader(train, 64, shuffle=True),
        eval_data=DataLoader(test, 256), device="cpu")

    engine = runmodel.Engine()
    engine.attach(
        Unfreeze({0: ["3"], 2: "all"}),
        Evaluate(), EarlyStopping("eval_loss", patience=10),
        Checkpoint("checkpoints", best=("eval_accuracy", "max"), keep_best=2),
        LRSchedule(lambda opt: torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.7),
                   interval="epoch"),
        GradClip(max_norm=0.5), Progress())
    kill = os.environ.get("KILL_AT")
    if kill:  # after the step (and any checkpoint of it): a real SIGKILL
        phase, _, at = kill.partition(":")
        engine.on(phase, lambda e: os.kill(os.getpid(), signal.SIGKILL), once=at,
                  priority=-2000)
    result = engine.run(model, epochs=5, resume="auto")
    torch.save(model.module.state_dict(), "final.pt")
    print(result.ended, result.steps, f"{result.metrics['eval_accuracy']:.4f}",
          f"{result.metrics['lr']:.6f}")
""")
TIMEOUT = 180


def run_script(folder: Path, kill: str = "") -> subprocess.CompletedProcess[str]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.py").write_text(SCRIPT)
    env = {**os.environ, "KILL_AT": kill}
    return subprocess.run(
        [sys.executable, "train.py"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("straight")
    result = run_script(folder)
    assert result.returncode == 0, result.stderr
    assert "starting fresh" in result.stderr
    return folder, result.stdout


# 23 batches an epoch: step 50 is mid-epoch 2, 1ep the end of epoch 1 after its checkpoint
@pytest.mark.parametrize("kill", ["runstep:50st", "epoch_end:1ep"])
def test_killed_and_rerun_the_packs_end_as_one_straight_run(
    tmp_path: Path, straight: tuple[Path, str], kill: str
) -> None:
    reference, printed = straight
    killed = run_script(tmp_path, kill)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    saved = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert any(name.startswith("best-eval_accuracy=") for name in saved), saved

    rerun = run_script(tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    assert "runmodel: resuming from" in rerun.stderr
    assert rerun.stdout == printed  # same end, steps, accuracy and learning rate
    got = torch.load(tmp_path / "final.pt", weights_only=True)
    want = torch.load(reference / "final.pt", weights_only=True)
    assert all(torch.equal(got[k], want[k]) for k in want)
    # the best two by accuracy and the newest two, the same files as the straight run's
    assert sorted(os.listdir(tmp_path / "checkpoints")) == sorted(
        os.listdir(reference / "checkpoints")
    )

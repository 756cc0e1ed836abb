"""The training that tests/test_exact_resume.py kills and resumes: run in processes of
their own (forked from a forkserver that imported torch once), killed with SIGKILL.

A small MLP with dropout, Adam, a shuffled DataLoader of 60 samples in batches of 8 (8
batches an epoch, the last one short), 4 epochs; a checkpoint after every step.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import torch
import torch._dynamo  # the first optimizer step imports it: do it once, here
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import runmodel
import runmodel.checkpoint
import runmodel.engine  # the rest of runmodel, also once in the forkserver
from runmodel.packs import Checkpoint

EPOCHS, SAMPLES, BATCH = 4, 60, 8
BATCHES = -(-SAMPLES // BATCH)  # per epoch
STEPS = EPOCHS * BATCHES


class Net(runmodel.TorchModel):
    def __init__(self, workers: int) -> None:
        super().__init__("cpu")
        self.workers = workers
        torch.manual_seed(0)
        self.module = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3),
                                    nn.Linear(16, 1))

    def setup(self, setup_options: dict[str, object] | None = None) -> None:
        g = torch.Generator().manual_seed(1)
        x = torch.randn(SAMPLES, 6, generator=g)
        self.optimizer = torch.optim.Adam(self.module.parameters(), lr=1e-2)
        self.loss_fn = nn.MSELoss()
        self.train_data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=BATCH,
                                     shuffle=True, num_workers=self.workers,
                                     persistent_workers=self.workers > 0,
                                     # what a script gets on Linux; a process forked by
                                     # the forkserver would start its workers through it
                                     multiprocessing_context="fork" if self.workers else None)


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def train(folder: str, workers: int, kill: tuple[str, int] | None, out: str) -> None:
    """Train; resume from ``folder`` if it holds a checkpoint; die at ``kill``:
    ``("step", k)`` after step k and its checkpoint, ``("epoch", e)`` as epoch e starts,
    ``("save", k)`` in the middle of writing the k-th checkpoint (written, not renamed).
    Writes the final parameters to ``out``."""
    torch.set_num_threads(1)
    engine = runmodel.Engine()
    if folder:
        engine.attach(Checkpoint(folder, every="1st", keep=2))
    if kill is not None:
        kind, at = kill
        if kind == "step":  # after the checkpoint of step `at` (priority below Checkpoint's)
            engine.on("runstep", lambda e: _die(), once=at, priority=-2000)
        elif kind == "epoch":
            engine.on("epoch_start", lambda e: _die(), once=at)
        else:
            replace, saves = os.replace, [0]

            def replace_then_die(source: str, target: str) -> None:
                saves[0] += 1
                if saves[0] == at:  # the temporary file is complete and fsynced
                    _die()
                replace(source, target)
            runmodel.checkpoint.os.replace = replace_then_die  # type: ignore[attr-defined]
    model = Net(workers)
    resume = folder if folder and any(Path(folder).glob("ckpt-*.pt")) else None
    engine.run(model, epochs=EPOCHS, resume=resume)
    torch.save([p.detach() for p in model.module.parameters()], out)

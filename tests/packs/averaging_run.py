"""The training that test_weight_averaging.py kills with SIGKILL and resumes, in processes
of its own: a small MLP with batch norm and dropout, Adam, a shuffled DataLoader with its
own generator, 3 epochs of 5 batches, the EMA and SWA packs (SWALR from epoch 1) and a
checkpoint after every step.

    python averaging_run.py FOLDER OUT [KILL_AT_STEP]

writes the final module weights and both averages to OUT (torch.save)."""

from __future__ import annotations

import os
import signal
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import runmodel
from runmodel.packs import EMA, SWA, Checkpoint

EPOCHS = 3


class Net(runmodel.TorchModel):
    def __init__(self) -> None:
        super().__init__("cpu")
        torch.manual_seed(0)
        self.module = nn.Sequential(
            nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1)
        )

    def setup(self, setup_options: dict[str, object] | None = None) -> None:
        g = torch.Generator().manual_seed(1)
        x = torch.randn(40, 6, generator=g)
        self.optimizer = torch.optim.Adam(self.module.parameters(), lr=1e-2)
        self.loss_fn = nn.MSELoss()
        self.train_data = DataLoader(
            TensorDataset(x, x.sum(1, keepdim=True)),
            batch_size=8,
            shuffle=True,
            generator=torch.Generator().manual_seed(5),
        )


def main(folder: str, out: str, kill_at: int | None) -> None:
    torch.set_num_threads(1)
    engine = runmodel.Engine()
    ema, swa = EMA(decay=0.8), SWA(start=1, swa_lr=5e-3, anneal_epochs=1)
    engine.attach(ema, swa, Checkpoint(folder, every="1st", keep=2))
    if kill_at is not None:  # after the checkpoint of that step (Checkpoint's priority -1000)
        engine.on(
            "runstep", lambda e: os.kill(os.getpid(), signal.SIGKILL), once=kill_at, priority=-2000
        )
    model = Net()
    engine.run(model, epochs=EPOCHS, resume="auto")
    assert ema.averaged is not None and swa.averaged is not None
    torch.save(
        {
            "module": model.module.state_dict(),
            "ema": ema.averaged.state_dict(),
            "swa": swa.averaged.state_dict(),
            "lr": model.optimizer.param_groups[0]["lr"],
        },
        out,
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else None)

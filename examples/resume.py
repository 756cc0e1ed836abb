"""Resume after an interruption: run it, kill it (Ctrl-C, ``kill -9``, a lost machine),
run the same command again, and it goes on where the newest checkpoint left off, ending
with the same weights as a run that was never interrupted.

    python examples/resume.py [--dir runs/resume] [--epochs 8] [--pace 0]
    # kill it mid-run, then the same command again:
    python examples/resume.py [--dir runs/resume] [--epochs 8]

A ``Checkpoint`` pack saves twice an epoch into ``DIR/checkpoints``, and
``engine.run(..., resume="auto")`` continues from the newest checkpoint there, or starts
fresh when there is none; runmodel says which on stderr. The checkpoints hold where the
epoch's data stood (the shuffled order, the batches drawn) and every RNG, so a run cut
mid-epoch resumes exactly (dropout and shuffling included). The final weights go to
``DIR/final.pt``. ``--pace`` sleeps that many seconds per step, to have time to kill it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import runmodel
from runmodel.packs import Checkpoint

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--dir", type=Path, default=Path("runs/resume"))
parser.add_argument("--epochs", type=int, default=8)
parser.add_argument("--pace", type=float, default=0.0, help="seconds to sleep per step")
args = parser.parse_args()

torch.manual_seed(0)  # the same model and data in every process
x = torch.randn(512, 16)
y = (x[:, :4].sum(1) > 0).long()
model = runmodel.TorchModel.from_parts(
    nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 2)),
    optimizer=lambda params: torch.optim.Adam(params, lr=1e-3), loss_fn=nn.CrossEntropyLoss(),
    train_data=DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True,
                          generator=torch.Generator().manual_seed(1)))

engine = runmodel.Engine()
engine.attach(Checkpoint(args.dir / "checkpoints", every="8st", keep=2))  # 16 steps an epoch

if args.pace:
    engine.on("runstep", lambda engine: time.sleep(args.pace))


@engine.on("epoch_end", priority=-2000)  # after Checkpoint (-1000) saved this epoch's end
def report(engine: runmodel.Engine) -> None:
    # (no loss here: a run resumed at an epoch's last step has run no step yet)
    print(f"epoch {engine.state.epoch} done: step {engine.state.step}", flush=True)


result = engine.run(model, epochs=args.epochs, resume="auto")
assert model.module is not None
torch.save(model.module.state_dict(), args.dir / "final.pt")
print(f"{result.ended}: {result.steps} steps, {result.epochs} epochs; "
      f"weights in {args.dir / 'final.pt'}")

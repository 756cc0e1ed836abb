"""Uses the shared ``GradNorm`` pack (``grad_norm.py`` here) beside the built-in packs: a
classifier of Gaussian blobs whose epoch mean gradient norm shows in the progress lines,
in TensorBoard (``runs/blobs/tensorboard``, tag ``train/grad_norm``) and in the result.

    python examples/packs_shared/blobs_tensorboard.py [--epochs 10] [--every 5]
    tensorboard --logdir runs/blobs/tensorboard

GradNorm measures only every ``--every``-th step here: the epoch's mean is over those.
"""

from __future__ import annotations

import argparse

import torch
from grad_norm import GradNorm  # this folder is on sys.path when the script runs
from torch import nn

import runmodel
from runmodel.packs import Progress, TensorBoard

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--every", type=int, default=5)
args = parser.parse_args()

torch.manual_seed(0)
centres = 3 * torch.randn(4, 2)  # four blobs, one class each
y = torch.randint(4, (2048,))
x = centres[y] + torch.randn(2048, 2)
model = runmodel.TorchModel.from_parts(
    nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 4)),
    optimizer=lambda params: torch.optim.Adam(params, lr=1e-2), loss_fn=nn.CrossEntropyLoss(),
    train_data=[(x[i:i + 64], y[i:i + 64]) for i in range(0, 1536, 64)],
    eval_data=[(x[1536:], y[1536:])])

engine = runmodel.Engine()
engine.attach(GradNorm(every=args.every), Progress(), TensorBoard("runs/blobs/tensorboard"))
result = engine.run(model, epochs=args.epochs)
print(f"train grad_norm {result.metrics['grad_norm']:.4f} at the end; "
      f"test accuracy {runmodel.evaluate(model)['accuracy']:.1%}")

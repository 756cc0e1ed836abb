"""Uses the shared ``GradNorm`` pack (``grad_norm.py`` here) to stop a regression once its
gradient has vanished: the fit has converged, so further epochs would change nothing.

    python examples/packs_shared/line_fit.py [--epochs 200] [--stop-below 0.01]

Prints the mean gradient norm every few epochs, then how the run ended and the line found.
"""

from __future__ import annotations

import argparse

import torch
from grad_norm import GradNorm  # this folder is on sys.path when the script runs
from torch import nn

import runmodel

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--epochs", type=int, default=200)
parser.add_argument("--stop-below", type=float, default=0.01)
args = parser.parse_args()

torch.manual_seed(0)
x = torch.linspace(-1, 1, 256).unsqueeze(1)
y = 3 * x - 1  # no noise, so the gradient can really vanish
model = runmodel.TorchModel.from_parts(
    nn.Linear(1, 1), optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
    loss_fn=nn.MSELoss(), train_data=[(x[i:i + 64], y[i:i + 64]) for i in range(0, 256, 64)])

engine = runmodel.Engine()
grad_norm = GradNorm(stop_below=args.stop_below)
engine.attach(grad_norm)


@engine.on("epoch_end", every=10)
def report(engine: runmodel.Engine) -> None:
    print(f"epoch {engine.state.epoch + 1:4d}  grad_norm {engine.state.metrics['grad_norm']:.4f}")


result = engine.run(model, epochs=args.epochs)
linear = model.module
assert isinstance(linear, nn.Linear)
print(f"{result.ended} after {result.epochs} epochs: {result.reason or 'all epochs ran'}")
print(f"y = {linear.weight.item():.3f}x {linear.bias.item():+.3f} (target 3x - 1); "
      f"last grad_norm {grad_norm.history[-1]:.4f}")

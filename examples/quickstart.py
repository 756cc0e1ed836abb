"""The smallest useful runmodel script: a model keeps its loop, hooks change the run.

    python examples/quickstart.py
"""

from __future__ import annotations

import torch
from torch import nn

import runmodel


class LineFit(runmodel.TorchModel):
    """Fit y = 3x - 1 with one linear layer, on data generated here."""

    def __init__(self, device=None, init_options=None):
        super().__init__(device, init_options)
        torch.manual_seed(0)
        self.module = nn.Linear(1, 1)

    def setup(self, setup_options=None):
        x = torch.linspace(-1, 1, 256).unsqueeze(1)
        y = 3 * x - 1 + 0.01 * torch.randn_like(x)
        self.train_data = [(x[i:i + 32], y[i:i + 32]) for i in range(0, 256, 32)]
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=0.05)
        self.loss_fn = nn.MSELoss()


def main() -> None:
    engine = runmodel.Engine()

    @engine.on("epoch_end", every=5)
    def report(engine: runmodel.Engine) -> None:
        print(f"epoch {engine.state.epoch + 1:3d}  loss {engine.state.loss.item():.5f}")

    @engine.on("epoch_end", when=lambda e: e.state.loss.item() < 2e-4)
    def converged(engine: runmodel.Engine) -> None:
        print(f"converged after {engine.state.epoch + 1} epochs")
        engine.stop()

    model = LineFit()
    result = engine.run(model, epochs=100)
    weight, bias = model.module.weight.item(), model.module.bias.item()
    print(f"{result.ended}: {result.steps} steps in {result.seconds:.2f}s; "
          f"y = {weight:.3f}x {bias:+.3f} (target 3x - 1)")
    print()
    print(engine.describe())


if __name__ == "__main__":
    main()

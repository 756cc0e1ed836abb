"""Handwritten digits: a small MLP on scikit-learn's bundled 8x8 digits (nothing downloaded).

    runmodel run examples/digits.py --epochs 20
    runmodel run examples/digits.py --epochs 20 --set hidden=256 --set lr=0.002
    runmodel benchmark examples/digits.py
    runmodel describe examples/digits.py
    python examples/digits.py                 # the same training, from Python

``configure(engine)`` is what the runmodel command calls before a run: here it attaches
an ``Evaluate`` pack, so each epoch's progress line shows the test accuracy.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import runmodel
from runmodel.extras import require
from runmodel.packs import Evaluate, Progress


def digits_split(seed: int) -> tuple[TensorDataset, TensorDataset]:
    """80/20 train/test split of the 1,797 digits, pixels scaled to [0, 1]."""
    # scikit-learn is optional (runmodel[examples]): without it, say what to install
    datasets = require("sklearn.datasets", needed_by="examples/digits.py")
    x, y = datasets.load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32) / 16.0
    y = torch.tensor(y, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    cut = int(0.8 * len(x))
    train, test = order[:cut], order[cut:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[test], y[test])


class Digits(runmodel.TorchModel):
    init_defaults = {"hidden": 128, "seed": 0}
    setup_defaults = {"lr": 5e-3, "batch_size": 64}

    def __init__(self, device: str | None = None,
                 init_options: dict[str, Any] | None = None) -> None:
        super().__init__(device, init_options)
        hidden = self.init_options["hidden"]
        if hidden < 1:
            raise ValueError(f"init option 'hidden' must be at least 1, got {hidden}")
        torch.manual_seed(self.init_options["seed"])
        self.module = nn.Sequential(nn.Flatten(), nn.Linear(64, hidden), nn.ReLU(),
                                    nn.Linear(hidden, 10))

    def setup(self, setup_options: dict[str, Any] | None = None) -> None:
        options = setup_options or self.setup_defaults
        train, test = digits_split(self.init_options["seed"])
        self.optimizer = torch.optim.Adam(self.module.parameters(), lr=options["lr"])
        self.loss_fn = nn.CrossEntropyLoss()
        self.train_data = DataLoader(train, batch_size=options["batch_size"], shuffle=True,
                                     generator=torch.Generator().manual_seed(0))
        self.eval_data = DataLoader(test, batch_size=256)


runmodel.register_model("digits", Digits)  # so configs can name it (configs/digits.toml)


def configure(engine: runmodel.Engine) -> None:
    """What the runmodel command calls before a run of this model (a source or a config
    run): evaluate on the test split at each training epoch's end, so that the progress
    line (and TensorBoard, and metrics.json) shows the test accuracy."""
    engine.attach(Evaluate())


if __name__ == "__main__":
    engine = runmodel.Engine()
    configure(engine)
    engine.attach(Progress())
    result = engine.run(Digits(), epochs=20)
    print(f"test accuracy {result.metrics['eval_accuracy']:.2%}")

"""The sweep tests' model, registered as "clusters": the digits example's MLP (a
``hidden`` init option, at least 1; ``configure`` attaches ``Evaluate``) on 4 Gaussian
clusters made by torch. The digits data would cost each trial's process an import of
scikit-learn (about 2 s of CPU); these make 8 steps an epoch, and lr 0.01 learns them in
one epoch while lr 1e-7 stays at chance."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import runmodel
from runmodel.packs import Evaluate

FEATURES, CLASSES, TRAIN, TEST = 16, 4, 256, 1024


def clusters(seed: int) -> tuple[TensorDataset, TensorDataset]:
    generator = torch.Generator().manual_seed(seed)
    centres = 0.4 * torch.randn(CLASSES, FEATURES, generator=generator)
    y = torch.randint(CLASSES, (TRAIN + TEST,), generator=generator)
    x = centres[y] + torch.randn(TRAIN + TEST, FEATURES, generator=generator)
    return TensorDataset(x[:TRAIN], y[:TRAIN]), TensorDataset(x[TRAIN:], y[TRAIN:])


class Clusters(runmodel.TorchModel):
    init_defaults = {"hidden": 32, "seed": 0}
    setup_defaults = {"lr": 5e-3}

    def __init__(
        self, device: str | None = None, init_options: dict[str, Any] | None = None
    ) -> None:
        super().__init__(device, init_options)
        hidden = self.init_options["hidden"]
        if hidden < 1:
            raise ValueError(f"init option 'hidden' must be at least 1, got {hidden}")
        torch.manual_seed(self.init_options["seed"])
        self.module = nn.Sequential(
            nn.Linear(FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, CLASSES)
        )

    def setup(self, setup_options: dict[str, Any] | None = None) -> None:
        options = setup_options or self.setup_defaults
        train, test = clusters(self.init_options["seed"])
        self.optimizer = torch.optim.Adam(self.module.parameters(), lr=options["lr"])
        self.loss_fn = nn.CrossEntropyLoss()
        self.train_data = DataLoader(
            train, batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(0)
        )
        self.eval_data = DataLoader(test, batch_size=TEST)


runmodel.register_model("clusters", Clusters)


def configure(engine: runmodel.Engine) -> None:
    engine.attach(Evaluate())

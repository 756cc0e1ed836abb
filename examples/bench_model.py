"""A model file for benchmarking and profiling from the command line: an MLP on random
data made in ``setup`` (nothing downloaded, nothing written).

    runmodel benchmark examples/bench_model.py                      # train steps: steps/s, ms/step
    runmodel benchmark examples/bench_model.py --measure infer --json
    runmodel benchmark examples/bench_model.py --set width=1024 --set batch_size=256
    runmodel profile examples/bench_model.py --steps 20 --warmup 5 --dir runs/profile-mlp
    runmodel describe examples/bench_model.py

``profile`` writes a ``*.pt.trace.json`` under ``--dir`` (open it in Perfetto,
ui.perfetto.dev, or TensorBoard's profiler plugin), with each phase and hook labelled
``runmodel/<phase>`` or ``runmodel/<phase>/<hook>``, and prints each hook's time (here
the ``GradClip`` pack that ``configure`` attaches); ``--json`` prints the result, timings
included, as JSON.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import runmodel
from runmodel.packs import GradClip


class MLP(runmodel.TorchModel):
    init_defaults = {"width": 256, "depth": 3}
    setup_defaults = {"batch_size": 128, "batches": 16, "lr": 1e-3}

    def __init__(self, device: str | None = None,
                 init_options: dict[str, Any] | None = None) -> None:
        super().__init__(device, init_options)
        width, depth = self.init_options["width"], self.init_options["depth"]
        if width < 1 or depth < 1:
            raise ValueError(f"width and depth must be at least 1, got {width} and {depth}")
        torch.manual_seed(0)
        layers: list[nn.Module] = [nn.Linear(64, width), nn.ReLU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(width, width), nn.ReLU()]
        self.module = nn.Sequential(*layers, nn.Linear(width, 10))

    def setup(self, setup_options: dict[str, Any] | None = None) -> None:
        options = setup_options or self.setup_defaults
        g = torch.Generator().manual_seed(0)
        n = options["batch_size"]
        self.train_data = [(torch.randn(n, 64, generator=g), torch.randint(10, (n,), generator=g))
                           for _ in range(options["batches"])]
        self.eval_data = self.train_data
        self.optimizer = torch.optim.Adam(self.module.parameters(), lr=options["lr"])
        self.loss_fn = nn.CrossEntropyLoss()


def configure(engine: runmodel.Engine) -> None:
    """Called by the runmodel command before the run: clip gradients, so that the
    profile shows what a pack's override costs per step."""
    engine.attach(GradClip(max_norm=1.0))

"""E4: training throughput of an MLP 784-1024-1024-10 on random data, batch 256, warm-up
steps dropped (benchmarks/README.md)."""

import torch
from torch import nn

import runmodel

model = runmodel.TorchModel.from_parts(
    nn.Sequential(
        nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)
    ),
    optimizer=torch.optim.Adam,
    loss_fn=nn.CrossEntropyLoss(),
    train_data=[(torch.randn(256, 784), torch.randint(10, (256,)))],
)
timings = runmodel.Engine().run(model, runmodel.Benchmark(warmup=10), steps=60).timings
print(f"{timings['steps_per_s']:.1f} steps/s, median step {timings['step_ms_median']:.2f} ms")

"""The long soak, opt-in (``pytest -m soak``): a million steps with ten hooks and a
checkpoint every 5,000 keep the process's memory and open files flat. Its last figures
are in benchmarks/README.md. ``RUNMODEL_SOAK_STEPS`` sets the steps (default 1,000,000).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import runmodel
from runmodel.packs import Checkpoint

STEPS = int(os.environ.get("RUNMODEL_SOAK_STEPS", "1000000"))


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.soak
def test_a_million_steps_keep_memory_and_files_flat(tmp_path: Path) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    x = torch.randn(64, 8)
    batches = [(x[i : i + 8], x[i : i + 8].sum(1, keepdim=True)) for i in range(0, 64, 8)]
    model = runmodel.TorchModel.from_parts(
        nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)),
        optimizer=lambda p: torch.optim.Adam(p, lr=1e-3),
        loss_fn=nn.MSELoss(),
        train_data=batches,
    )
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path, every="5000st", keep=2))
    counted = [0]
    for i in range(10):  # ten hooks on the step, as a busy run has
        engine.on("runstep", lambda e: counted.__setitem__(0, counted[0] + 1), name=f"hook{i}")
    samples: list[tuple[int, float, int]] = []

    @engine.on("runstep", every=STEPS // 20)
    def sample(engine: runmodel.Engine) -> None:
        samples.append((engine.state.step, rss_mib(), open_files()))

    started = time.perf_counter()
    result = engine.run(model, steps=STEPS, epochs=None)
    seconds = time.perf_counter() - started
    assert result.steps == STEPS and counted[0] == 10 * STEPS
    warm = samples[2:]  # after the first checkpoints and the allocator's warm-up
    growth = warm[-1][1] - warm[0][1]
    print(
        f"\nsoak: {STEPS} steps in {seconds:.0f} s; RSS {warm[0][1]:.1f} -> "
        f"{warm[-1][1]:.1f} MiB (max {max(s[1] for s in warm):.1f}); open files "
        f"{warm[0][2]} -> {warm[-1][2]}"
    )
    assert growth < 8, samples  # MiB
    assert warm[-1][2] <= warm[0][2], samples
    assert len(list(tmp_path.iterdir())) == 2

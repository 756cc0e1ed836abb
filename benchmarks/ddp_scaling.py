"""runmodel's ``ddp`` backend against a plain DistributedDataParallel loop, 2 gloo
processes on the CPU, a compute-bound model.

The work: an MLP 256 -> 1024 -> 1024 -> 10 (1.3M parameters), batch 64 a process,
cross-entropy, SGD, one thread a process; each process reads its half of the same data
(dealt out by a ``DistributedSampler``), as the same batches in memory for every variant.
Variants, in the same processes, a fresh model each repeat and the order rotated:

* ``plain``: ``DistributedDataParallel`` and the textbook loop
  (``zero_grad``, ``loss.backward()``, ``step``);
* ``runmodel``: ``Engine().run(model, backend=DDP(shard_data=False))`` on the same
  batches (the data is dealt out already);
* ``plain again``: the plain loop once more, to show how much two identical loops differ.

Every iteration is timed from one batch fetch to the next (``StampedData``), framework
included; a repeat's figure is its median iteration, after 5 warm-up iterations, divided
by the mean of the two plain loops' in the same repeat. A step costs tens of milliseconds
here and runmodel adds microseconds, so on a busy machine these block ratios wander by
more than what they measure. So, last, the two are run step by step side by side
(``paired``): a model whose loop runs each batch through the plain DDP step and through
runmodel's ``runstep``, in alternating order, each timed; the ratio of the median step
times is the cleanest figure. After each repeat the runmodel model's parameters are
checked equal to the plain loop's.

    python benchmarks/ddp_scaling.py            # starts itself under torchrun, 2 processes
    python benchmarks/ddp_scaling.py --quick    # fewer steps and repeats, a smoke test
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

import runmodel
from runmodel.backends import DDP

BATCH, FEATURES, HIDDEN, CLASSES, WARMUP = 64, 256, 1024, 10, 5
Batches = list[tuple[torch.Tensor, torch.Tensor]]


class StampedData:
    """This process's batches; ``perf_counter_ns`` recorded at every fetch."""

    def __init__(self, batches: Batches) -> None:
        self.batches = batches
        self.stamps: list[int] = []

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        clock, stamps = time.perf_counter_ns, self.stamps
        for batch in self.batches:
            stamps.append(clock())
            yield batch
        stamps.append(clock())

    def median_ms(self) -> float:
        gaps = [b - a for a, b in zip(self.stamps, self.stamps[1:], strict=False)][WARMUP:]
        return statistics.median(gaps) / 1e6


def module() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(FEATURES, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, CLASSES),
    )


def my_batches(steps: int) -> Batches:
    """This process's share of the same data: a DistributedSampler's indices, in batches."""
    n = steps * BATCH * dist.get_world_size()
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, FEATURES, generator=g), torch.randint(0, CLASSES, (n,), generator=g)
    indices = list(DistributedSampler(range(n), shuffle=True, seed=0))
    return [
        (x[indices[i : i + BATCH]], y[indices[i : i + BATCH]])
        for i in range(0, len(indices), BATCH)
    ]


def plain(batches: Batches) -> tuple[float, nn.Module]:
    net = module()
    model = DistributedDataParallel(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    data = StampedData(batches)
    for x, y in data:
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        optimizer.step()
    return data.median_ms(), net


def with_runmodel(batches: Batches) -> tuple[float, nn.Module]:
    net = module()
    data = StampedData(batches)
    model = runmodel.TorchModel.from_parts(
        net,
        optimizer=lambda p: torch.optim.SGD(p, lr=1e-3),
        loss_fn=nn.CrossEntropyLoss(),
        train_data=data,
        device="cpu",
    )
    runmodel.Engine().run(model, epochs=1, backend=DDP(shard_data=False))
    return data.median_ms(), net


class Paired(runmodel.TorchModel):
    """Each batch through a plain DDP step and through runmodel's runstep, side by side."""

    def __init__(self, batches: Batches) -> None:
        super().__init__("cpu")
        self.module, self.train_data = module(), batches
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=1e-3)
        self.loss_fn = nn.CrossEntropyLoss()
        self.twin = module()
        self.twin_ddp = DistributedDataParallel(self.twin)
        self.twin_optimizer = torch.optim.SGD(self.twin_ddp.parameters(), lr=1e-3)
        self.times: dict[str, list[int]] = {"plain": [], "runmodel": []}

    def setup(self, setup_options: dict[str, Any] | None = None) -> None:
        pass  # made in __init__

    def plain_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        x, y = batch
        self.twin_optimizer.zero_grad(set_to_none=True)
        self.loss_fn(self.twin_ddp(x), y).backward()  # type: ignore[misc]
        self.twin_optimizer.step()

    def run(self, runstep: Any, steps: int | None = None, *args: Any, **kwargs: Any) -> None:
        clock, plain_t, runmodel_t = (
            time.perf_counter_ns,
            self.times["plain"],
            self.times["runmodel"],
        )
        for _ in runstep.epochs():
            for i, batch in enumerate(self.train_data):  # type: ignore[arg-type]
                for first in (0, 1) if i % 2 == 0 else (1, 0):
                    t = clock()
                    if first == 0:
                        self.plain_step(batch)
                        plain_t.append(clock() - t)
                    else:
                        runstep(batch)
                        runmodel_t.append(clock() - t)


def paired(batches: Batches) -> tuple[float, float]:
    """Median step (ms) of the plain step and of runmodel's, side by side."""
    model = Paired(batches)
    runmodel.Engine().run(model, epochs=1, backend=DDP(shard_data=False))
    for a, b in zip(
        model.twin.state_dict().values(),
        runmodel.models.unwrap(model.module).state_dict().values(),
        strict=True,
    ):
        assert torch.equal(a, b), "runmodel's parameters differ from the plain step's"
    return (
        statistics.median(model.times["plain"][WARMUP:]) / 1e6,
        statistics.median(model.times["runmodel"][WARMUP:]) / 1e6,
    )


def worker(steps: int, repeats: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    batches = my_batches(steps)
    variants: dict[str, Callable[[Batches], tuple[float, nn.Module]]] = {
        "plain": plain,
        "runmodel": with_runmodel,
        "plain again": plain,
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for repeat in range(repeats):
        order = names[repeat % len(names) :] + names[: repeat % len(names)]
        trained = {}
        for name in order:
            dist.barrier()
            ms, trained[name] = variants[name](batches)
            times[name].append(ms)
        for (key, a), b in zip(
            trained["plain"].state_dict().items(),
            trained["runmodel"].state_dict().values(),
            strict=True,
        ):
            assert torch.equal(a, b), f"runmodel's {key} differs from the plain loop's"
    side_by_side = [paired(batches) for _ in range(repeats)]
    if rank == 0:
        print(report(times, side_by_side, steps, repeats))
    dist.destroy_process_group()


def report(
    times: dict[str, list[float]], side_by_side: list[tuple[float, float]], steps: int, repeats: int
) -> str:
    plain_ms = [(a + b) / 2 for a, b in zip(times["plain"], times["plain again"], strict=True)]
    lines = [
        f"2 processes (gloo), {steps} steps each, {repeats} repeats, 1 thread a process; "
        f"MLP {FEATURES}-{HIDDEN}-{HIDDEN}-{CLASSES}, batch {BATCH} a process",
        "",
        "| variant | median step (ms) | vs the plain DDP loops: median [min, max] | overhead |",
        "|---|---|---|---|",
    ]
    for name, values in times.items():
        ratios = [v / p for v, p in zip(values, plain_ms, strict=True)]
        ratio = statistics.median(ratios)
        lines.append(
            f"| {name} | {statistics.median(values):.2f} | {ratio:.4f} "
            f"[{min(ratios):.4f}, {max(ratios):.4f}] | {(ratio - 1) * 100:+.2f}% |"
        )
    ratios = [r / p for p, r in side_by_side]
    ratio = statistics.median(ratios)
    lines.append(
        f"| runmodel, step by step beside the plain step | "
        f"{statistics.median(r for _, r in side_by_side):.2f} (plain "
        f"{statistics.median(p for p, _ in side_by_side):.2f}) | {ratio:.4f} "
        f"[{min(ratios):.4f}, {max(ratios):.4f}] | {(ratio - 1) * 100:+.2f}% |"
    )
    lines += [
        "",
        f"machine: {cpu_name()}, {os.cpu_count()} cores; torch {torch.__version__}, "
        f"python {platform.python_version()}",
    ]
    return "\n".join(lines)


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=60, help="steps a repeat (default 60)")
    parser.add_argument("--repeats", type=int, default=7, help="repeats (default 7)")
    parser.add_argument("--quick", action="store_true", help="20 steps, 2 repeats")
    args = parser.parse_args(argv)
    steps, repeats = (20, 2) if args.quick else (args.steps, args.repeats)
    if steps <= WARMUP + 1 or repeats < 1:
        parser.error(f"--steps must be > {WARMUP + 1} and --repeats >= 1")
    if "TORCHELASTIC_RUN_ID" in os.environ:  # one of the processes torchrun started
        worker(steps, repeats)
        return 0
    from torch.distributed.run import get_args_parser, run

    run(
        get_args_parser().parse_args(
            [
                "--standalone",
                "--nproc-per-node",
                "2",
                __file__,
                "--steps",
                str(steps),
                "--repeats",
                str(repeats),
            ]
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""runmodel's ``fsdp`` backend: per-step time against a hand-written FSDP2 loop, per-process
memory against DDP, and what a sharded checkpoint save costs. 2 processes (gloo on the
CPU, nccl on GPUs), started under torchrun by the script itself.

Three parts (``--part``):

* ``step``: an MLP 256 -> 1024 -> 1024 -> 10 (1.3M parameters), batch 64 a process, SGD,
  each linear layer a shard unit. ``plain`` is the textbook FSDP2 loop (``fully_shard``
  on each layer and the root, ``zero_grad``/``backward``/``step``); ``runmodel`` is
  ``Engine().run(model, backend=FSDP(shard_data=False))`` on the same batches. Fresh
  model every repeat, order rotated; a repeat's figure is its median step (after 5
  warm-up steps) over the mean of the two plain loops of that repeat. On a busy machine
  these block figures wander more than what they measure, so last the two run side by
  side: each batch through the plain step and through runmodel's ``runstep`` (two
  models, alternating which goes first), their weights checked equal after.
* ``memory``: a 52M-parameter MLP (1024 -> 4608 -> 4608 -> 4608 -> 1024) with Adam, one
  step taken, in a launch of its own per backend (``ddp``, ``fsdp``): the bytes this
  process holds in parameters, gradients and optimizer state (a DTensor's local shard),
  and the process's peak RSS.
* ``save``: the same 50M model with Adam after a step: a sharded save (every process
  writes its shard, ``torch.distributed.checkpoint``), the time ``async_save=True`` keeps
  the training waiting (the copy into CPU memory) and its whole background write, and a
  single-file save of the same state by rank 0 alone (``torch.save``: the ``ddp``
  backend's checkpoint), each fsynced, median of repeats.

gloo has no reduce-scatter of its own: FSDP's reduce-scatter of gradients is emulated
with all-reduces, so on the CPU FSDP moves more bytes than DDP; nccl does not.

    python benchmarks/fsdp_cost.py                 # every part
    python benchmarks/fsdp_cost.py --part memory   # one part
    python benchmarks/fsdp_cost.py --quick         # fewer steps and repeats
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

BATCH, FEATURES, HIDDEN, CLASSES, WARMUP = 64, 256, 1024, 10, 5
Batches = list[tuple[torch.Tensor, torch.Tensor]]


class StampedData:
    """This process's batches; ``perf_counter_ns`` at every fetch."""

    def __init__(self, batches: Batches) -> None:
        self.batches, self.stamps = batches, []  # type: ignore[var-annotated]

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for batch in self.batches:
            self.stamps.append(time.perf_counter_ns())
            yield batch
        self.stamps.append(time.perf_counter_ns())

    def median_ms(self) -> float:
        gaps = [b - a for a, b in zip(self.stamps, self.stamps[1:], strict=False)][WARMUP:]
        return statistics.median(gaps) / 1e6


def small() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(FEATURES, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, CLASSES),
    )


def large() -> nn.Module:
    """About 50M parameters (51.9M)."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(1024, 4608),
        nn.ReLU(),
        nn.Linear(4608, 4608),
        nn.ReLU(),
        nn.Linear(4608, 4608),
        nn.ReLU(),
        nn.Linear(4608, 1024),
    )


def shard(module: nn.Module) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    for child in module.children():
        if next(child.parameters(), None) is not None:
            fully_shard(child)
    fully_shard(module)
    return module


def batches(steps: int, features: int = FEATURES, classes: int = CLASSES) -> Batches:
    g = torch.Generator().manual_seed(1 + dist.get_rank())
    return [
        (
            torch.randn(BATCH, features, generator=g),
            torch.randint(0, classes, (BATCH,), generator=g),
        )
        for _ in range(steps)
    ]


# -- step ------------------------------------------------------------------------------------


def plain_loop(data: Batches) -> float:
    module = shard(small())
    optimizer = torch.optim.SGD(module.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    stamped = StampedData(data)
    for x, y in stamped:
        optimizer.zero_grad()
        loss_fn(module(x), y).backward()
        optimizer.step()
    return stamped.median_ms()


def runmodel_loop(data: Batches) -> float:
    import runmodel
    from runmodel.backends import FSDP

    stamped = StampedData(data)

    class Model(runmodel.TorchModel):
        def __init__(self) -> None:
            super().__init__("cpu")
            self.module = small()

        def setup(self, setup_options: Any = None) -> None:
            self.optimizer = torch.optim.SGD(self.module.parameters(), lr=0.01)
            self.loss_fn = nn.CrossEntropyLoss()
            self.train_data = stamped

    runmodel.Engine().run(Model(), epochs=1, backend=FSDP(shard_data=False))
    return stamped.median_ms()


def paired(data: Batches) -> tuple[float, float]:
    """Median step (ms) of the plain FSDP2 step and of runmodel's ``runstep``, each batch
    through both, side by side, which goes first alternating; then their weights are
    checked equal."""
    import runmodel
    from runmodel.backends import FSDP

    class Paired(runmodel.TorchModel):
        def __init__(self) -> None:
            super().__init__("cpu")
            self.module = small()
            self.twin = shard(small())
            self.times: dict[str, list[int]] = {"plain": [], "runmodel": []}

        def setup(self, setup_options: Any = None) -> None:
            self.optimizer = torch.optim.SGD(self.module.parameters(), lr=0.01)
            self.twin_optimizer = torch.optim.SGD(self.twin.parameters(), lr=0.01)
            self.loss_fn = nn.CrossEntropyLoss()
            self.train_data = data

        def plain_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> None:
            x, y = batch
            self.twin_optimizer.zero_grad()
            self.loss_fn(self.twin(x), y).backward()  # type: ignore[misc]
            self.twin_optimizer.step()

        def run(self, runstep: Any, steps: int | None = None, *args: Any, **kw: Any) -> None:
            clock, times = time.perf_counter_ns, self.times
            for _ in runstep.epochs():
                for i, batch in enumerate(data):
                    for first in (0, 1) if i % 2 == 0 else (1, 0):
                        t = clock()
                        if first == 0:
                            self.plain_step(batch)
                            times["plain"].append(clock() - t)
                        else:
                            runstep(batch)
                            times["runmodel"].append(clock() - t)

    model = Paired()
    runmodel.Engine().run(model, epochs=1, backend=FSDP(shard_data=False))
    for a, b in zip(model.twin.parameters(), model.module.parameters(), strict=True):
        assert torch.equal(a.to_local(), b.to_local()), "runmodel's weights differ"
    return (
        statistics.median(model.times["plain"][WARMUP:]) / 1e6,
        statistics.median(model.times["runmodel"][WARMUP:]) / 1e6,
    )


def part_step(quick: bool) -> dict[str, Any]:
    steps, repeats = (25, 3) if quick else (60, 7)
    data = batches(steps)
    variants = {"plain": plain_loop, "runmodel": runmodel_loop, "plain again": plain_loop}
    ratios: dict[str, list[float]] = {name: [] for name in variants}
    medians: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for repeat in range(repeats):
        order = names[repeat % 3 :] + names[: repeat % 3]
        times = {name: variants[name](data) for name in order}
        reference = (times["plain"] + times["plain again"]) / 2
        for name, ms in times.items():
            medians[name].append(ms)
            ratios[name].append(ms / reference)
    result = {
        name: {
            "median_ms": statistics.median(medians[name]),
            "ratio": statistics.median(ratios[name]),
            "min": min(ratios[name]),
            "max": max(ratios[name]),
        }
        for name in variants
    }
    side_by_side = [paired(data) for _ in range(repeats)]
    ratios_paired = [r / p for p, r in side_by_side]
    result["runmodel, step by step beside the plain step"] = {
        "median_ms": statistics.median(r for _, r in side_by_side),
        "ratio": statistics.median(ratios_paired),
        "min": min(ratios_paired),
        "max": max(ratios_paired),
    }
    return result


# -- memory ----------------------------------------------------------------------------------


def local_bytes(tensor: torch.Tensor) -> int:
    local = getattr(tensor, "_local_tensor", tensor)
    return local.numel() * local.element_size()


def part_memory(backend: str) -> dict[str, Any]:
    module = large()
    count = sum(p.numel() for p in module.parameters())
    wrap = shard if backend == "fsdp" else nn.parallel.DistributedDataParallel
    module = wrap(module)
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-4)
    x, y = batches(1, 1024, 1024)[0]
    nn.functional.cross_entropy(module(x), y).backward()
    optimizer.step()
    params = list(module.parameters())
    state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return {
        "parameters": count,
        "param_bytes": sum(local_bytes(p) for p in params),
        "grad_bytes": sum(local_bytes(p.grad) for p in params if p.grad is not None),
        "optim_bytes": sum(local_bytes(v) for v in state),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


# -- save ------------------------------------------------------------------------------------


def part_save(quick: bool, folder: Path) -> dict[str, Any]:
    import datetime

    from runmodel import checkpoint
    from runmodel.checkpoint.sharded import Sharded, ShardedWriter, save

    module = shard(large())
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-4)
    x, y = batches(1, 1024, 1024)[0]
    nn.functional.cross_entropy(module(x), y).backward()
    optimizer.step()
    holder = type("Holder", (), {})()
    holder.module, holder.optimizer = module, optimizer
    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=600))
    sharded = Sharded(holder, group, dist.get_rank(), dist.get_world_size(), "bench")
    snapshot = {"engine": {"counters": {}}, "rng": checkpoint.rng_state()}
    writer = ShardedWriter(sharded)
    repeats = 2 if quick else 5
    times: dict[str, list[float]] = {
        "sharded": [],
        "async stall": [],
        "async whole": [],
        "single file": [],
    }
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    for repeat in range(repeats):
        dist.barrier()
        started = time.perf_counter()
        save(folder / f"sync-{repeat}", snapshot, sharded)
        times["sharded"].append(time.perf_counter() - started)
        dist.barrier()
        started = time.perf_counter()
        writer.submit(folder / f"async-{repeat}", snapshot)
        times["async stall"].append(time.perf_counter() - started)
        writer.wait()
        times["async whole"].append(time.perf_counter() - started)
        # the single file: rank 0 writes the whole state (as under ddp, where every
        # process holds it whole already: the gather is not counted)
        state = {
            "model": {
                "module": get_model_state_dict(module, options=full),
                "optimizer": get_optimizer_state_dict(module, optimizer, options=full),
            }
        }
        dist.barrier()
        if dist.get_rank() == 0:
            started = time.perf_counter()
            checkpoint.save(folder / f"single-{repeat}.pt", {**snapshot, **state})
            times["single file"].append(time.perf_counter() - started)
        dist.barrier()
        for old in folder.iterdir():
            if old.is_dir():
                shutil.rmtree(old)
            else:
                old.unlink()
    return {
        name: {"median_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts)}
        for name, ts in times.items()
        if ts
    }


# -- launching -------------------------------------------------------------------------------


def worker(args: argparse.Namespace) -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    if args.part == "step":
        result: dict[str, Any] = part_step(args.quick)
    elif args.part == "memory":
        result = part_memory(args.backend)
    else:
        result = part_save(args.quick, Path(args.folder))
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(result), flush=True)
    dist.destroy_process_group()


def launch(part: str, quick: bool, **extra: str) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        __file__,
        "--worker",
        "--part",
        part,
    ]
    command += ["--quick"] if quick else []
    for key, value in extra.items():
        command += [f"--{key}", value]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        sys.exit(f"{part} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("step", "memory", "save", "all"), default="all")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--backend", default="fsdp", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    print(
        f"{time.strftime('%Y-%m-%d')}, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, torch {torch.__version__}, Python "
        f"{platform.python_version()}, load average {os.getloadavg()[0]:.1f}"
    )
    parts = ["step", "memory", "save"] if args.part == "all" else [args.part]
    if "step" in parts:
        print("\n| variant | median step (ms) | vs the plain FSDP2 loops: median [min, max] |")
        print("|---|---|---|")
        for name, row in launch("step", args.quick).items():
            print(
                f"| {name} | {row['median_ms']:.2f} | {row['ratio']:.4f} "
                f"[{row['min']:.4f}, {row['max']:.4f}] |"
            )
    if "memory" in parts:
        rows = {
            backend: launch("memory", args.quick, backend=backend) for backend in ("ddp", "fsdp")
        }
        print(f"\n{rows['ddp']['parameters'] / 1e6:.1f}M parameters, Adam; per process (MB):")
        print("\n| backend | parameters | gradients | optimizer state | total | peak RSS |")
        print("|---|---|---|---|---|---|")
        for backend, row in rows.items():
            parts_mb = [row[k] / 2**20 for k in ("param_bytes", "grad_bytes", "optim_bytes")]
            print(
                f"| {backend} | "
                + " | ".join(f"{v:.0f}" for v in parts_mb)
                + f" | {sum(parts_mb):.0f} | {row['peak_rss_bytes'] / 2**20:.0f} |"
            )
    if "save" in parts:
        folder = Path(tempfile.mkdtemp(prefix="fsdp-bench-", dir=os.environ.get("BENCH_DIR")))
        try:
            rows = launch("save", args.quick, folder=str(folder))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        print("\n| save of the 50M model with Adam | median (s) | [min, max] |")
        print("|---|---|---|")
        for name, row in rows.items():
            print(f"| {name} | {row['median_s']:.3f} | [{row['min_s']:.3f}, {row['max_s']:.3f}] |")


if __name__ == "__main__":
    main()

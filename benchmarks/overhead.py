"""Per-step overhead of runmodel over a plain PyTorch loop, with pytorch-ignite as peer.

The work: Linear 32->32, batch 64, MSE, SGD, 20,000 steps, one thread. Every variant
reads its batches from the same iterable, which stamps the time of each fetch; the gap
between two fetches is one whole iteration, framework included, measured the same way
for all. A step here costs ~100x the overhead being measured and wall-clock totals
wander by more than that, so each repeat compares the *median* iteration time of each
variant with the plain loop's; the repeats are interleaved and the median of 5 is
reported. Final parameters are asserted identical to the plain loop's.

Then the dispatch cost of one event with 0, 1, 10 and 100 no-op hooks, measured on a
model whose step does nothing, so the hooks are all there is to time.

    python benchmarks/overhead.py            # prints a markdown table
    python benchmarks/overhead.py --quick    # fewer steps, for a smoke test
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
import timeit
from collections.abc import Callable, Iterator
from typing import Any

import ignite
import ignite.engine
import torch
from torch import nn

import runmodel

SEED = 0


class StampedData:
    """An iterable of batches that records ``perf_counter_ns`` at every fetch."""

    def __init__(self, batches: list[Any], steps: int) -> None:
        self.batches, self.steps = batches, steps
        self.stamps: list[int] = []

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[Any]:
        stamps, batches, n = self.stamps, self.batches, len(self.batches)
        clock = time.perf_counter_ns
        for i in range(self.steps):
            stamps.append(clock())
            yield batches[i % n]
        stamps.append(clock())


class Reference:
    """The plain step on its own copy of the work, timed; every variant calls it once
    per iteration, so each iteration carries its own yardstick measured moments apart."""

    def __init__(self) -> None:
        self.module, self.optimizer, self.loss_fn = make_work()
        self.times: list[int] = []

    def __call__(self, batch: Any) -> None:
        start = time.perf_counter_ns()
        x, y = batch
        loss = self.loss_fn(self.module(x), y)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.times.append(time.perf_counter_ns() - start)

    def measure(self, data: StampedData) -> tuple[float, float]:
        """Median variant step (µs) and median of (variant step - reference step) (µs)."""
        gaps = [b - a for a, b in zip(data.stamps, data.stamps[1:], strict=False)]
        # ignite never fetches past its last batch, so its final gap may be missing
        own = [g - r for g, r in zip(gaps, self.times, strict=False)]
        diff = [o - r for o, r in zip(own, self.times, strict=False)]
        return statistics.median(own) / 1e3, statistics.median(diff) / 1e3


def make_work() -> tuple[nn.Module, torch.optim.Optimizer, nn.Module]:
    torch.manual_seed(SEED)
    module = nn.Linear(32, 32)
    return module, torch.optim.SGD(module.parameters(), lr=0.01), nn.MSELoss()


def plain(data: StampedData, ref: Reference) -> nn.Module:
    module, optimizer, loss_fn = make_work()
    for batch in data:
        ref(batch)
        x, y = batch
        loss = loss_fn(module(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return module


class Bench(runmodel.TorchModel):
    def __init__(self, data: StampedData, ref: Reference) -> None:
        super().__init__()
        self.data, self.ref = data, ref
        self.module, self.optimizer, self.loss_fn = make_work()

    def run(
        self, runstep: runmodel.RunStep, steps: int | None = None, *args: Any, **kwargs: Any
    ) -> None:
        ref = self.ref
        for batch in self.data:
            ref(batch)
            runstep(batch)


def with_runmodel(hooks: int) -> Callable[[StampedData, Reference], nn.Module]:
    def run(data: StampedData, ref: Reference) -> nn.Module:
        engine = runmodel.Engine()
        for n in range(hooks):
            engine.on("runstep", lambda engine: None, name=f"noop{n}")
        model = Bench(data, ref)
        engine.run(model, steps=data.steps)
        return model.module

    return run


def with_ignite(data: StampedData, ref: Reference) -> nn.Module:
    module, optimizer, loss_fn = make_work()

    def step(engine: ignite.engine.Engine, batch: Any) -> None:
        ref(batch)
        x, y = batch
        loss = loss_fn(module(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    ignite.engine.Engine(step).run(data, max_epochs=1)
    return module


def overhead_table(steps: int, repeats: int) -> list[str]:
    torch.manual_seed(1)
    batches = [(torch.randn(64, 32), torch.randn(64, 32)) for _ in range(200)]
    variants = {
        "plain PyTorch loop": plain,
        "runmodel, 0 hooks": with_runmodel(0),
        "runmodel, 10 hooks on runstep": with_runmodel(10),
        f"pytorch-ignite {ignite.__version__} Engine": with_ignite,
    }
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    reference = None
    for _ in range(repeats):
        for name, fn in variants.items():  # interleaved: one of each per repeat
            data, ref = StampedData(batches, steps), Reference()
            params = torch.cat([p.detach().flatten() for p in fn(data, ref).parameters()])
            if reference is None:
                reference = params
            assert torch.equal(params, reference), f"{name}: parameters differ from plain loop"
            results[name].append(ref.measure(data))
    rows = [
        "| variant | median step (µs) | overhead vs plain (µs/step) | ratio to plain |",
        "|---|---:|---:|---:|",
    ]
    base_step = statistics.median(s for s, _ in results["plain PyTorch loop"])
    base_diff = [d for _, d in results["plain PyTorch loop"]]
    for name, values in results.items():
        step = statistics.median(s for s, _ in values)
        over = statistics.median(d - b for (_, d), b in zip(values, base_diff, strict=True))
        rows.append(f"| {name} | {step:.2f} | {over:+.2f} | {(base_step + over) / base_step:.3f} |")
    return rows


class Noop(runmodel.Model):
    """A model whose step does nothing: what is left to time is the engine."""

    def __init__(self, steps: int) -> None:
        super().__init__()
        self.steps = steps
        self.stamps: list[int] = []

    def step(self, batch: Any) -> None:
        return None

    def run(
        self, runstep: runmodel.RunStep, steps: int | None = None, *args: Any, **kwargs: Any
    ) -> None:
        clock, stamps = time.perf_counter_ns, self.stamps
        for _ in range(self.steps):
            stamps.append(clock())
            runstep(None)
        stamps.append(clock())


def dispatch_table(steps: int, repeats: int) -> list[str]:
    counts = (0, 1, 10, 100)
    per_step: dict[int, list[float]] = {n: [] for n in counts}
    for _ in range(repeats):
        for n in counts:
            engine = runmodel.Engine()
            for k in range(n):
                engine.on("runstep", lambda engine: None, name=f"noop{k}")
            model = Noop(steps)
            engine.run(model, runmodel.Infer(collect=False))
            gaps = [b - a for a, b in zip(model.stamps, model.stamps[1:], strict=False)]
            per_step[n].append(statistics.median(gaps))
    empty = _empty_phase_ns()
    rows = [
        "| hooks on the phase | engine step (ns) | dispatch cost (ns) | per hook (ns) |",
        "|---:|---:|---:|---:|",
    ]
    base = statistics.median(per_step[0])
    for n in counts:
        step = statistics.median(per_step[n])
        cost = step - base + empty
        per_hook = f"{(step - base) / n:.0f}" if n else "-"
        rows.append(f"| {n} | {step:.0f} | {cost:.0f} | {per_hook} |")
    rows.append(
        f"\nA phase with no hooks (its dispatch entry read and found empty, timed alone): "
        f"{empty:.0f} ns."
    )
    return rows


def _empty_phase_ns() -> float:
    """What runstep spends on a phase with nothing to do: reading its entry in the
    dispatch and finding it empty."""
    engine = runmodel.Engine()
    engine.run(Noop(1), runmodel.Infer(collect=False))
    env = {"dispatch": engine.dispatch, "engine": engine}
    loop = "fire = dispatch.step_start\nif fire is not None:\n    fire(engine)"
    number = 1_000_000
    timed = min(timeit.repeat(loop, globals=env, number=number, repeat=5))
    empty = min(timeit.repeat("pass", globals=env, number=number, repeat=5))
    return (timed - empty) / number * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2,000 steps, 3 repeats")
    args = parser.parse_args()
    steps, repeats = (2_000, 3) if args.quick else (20_000, 5)
    torch.set_num_threads(1)
    print(
        f"machine: {platform.processor() or platform.machine()}, {platform.system()}, "
        f"Python {platform.python_version()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread; {steps} steps, median of {repeats} repeats\n"
    )
    print("\n".join(overhead_table(steps, repeats)))
    print()
    print("\n".join(dispatch_table(steps * 10, repeats)))


if __name__ == "__main__":
    main()

"""What ``engine.ignite`` costs per step, with pytorch-ignite's own ``Engine.run`` as peer.

The model's step does nothing (it returns its batch), so what is timed is the dispatch
alone: runmodel's loop and hooks, the mirror's seven hooks and ignite's ``_fire_event``,
or ignite's own loop. Variants:

* runmodel, an engine that never reads ``.ignite`` (no ignite hooks, no ignite import);
* runmodel, ``.ignite`` read, no ignite handlers (the mirror's hooks run, fire nothing);
* runmodel, ``.ignite`` with one no-op ITERATION_COMPLETED handler;
* ignite's ``Engine.run``, no handlers;
* ignite's ``Engine.run``, one no-op ITERATION_COMPLETED handler.

Each repeat runs every variant once (interleaved, so the machine's drift hits all alike)
for ``--steps`` steps and takes its wall time per step; the table gives the median over
``--repeats`` repeats, and the spread (min-max) of those.

    python benchmarks/ignite_bridge.py            # ~20 s; prints a markdown table
    python benchmarks/ignite_bridge.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import gc
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import ignite
import torch
from ignite.engine import Engine, Events

import runmodel


class Noop(runmodel.Model):
    """A model whose step does nothing: one epoch over ``range(steps)``."""

    def __init__(self, steps: int) -> None:
        super().__init__()
        self.data = range(steps)

    def setup(self, setup_options: dict[str, Any] | None = None) -> None:
        pass

    def step(self, batch: Any) -> Any:
        return batch

    def run(
        self, runstep: runmodel.RunStep, steps: int | None = None, *args: Any, **kwargs: Any
    ) -> None:
        for _ in runstep.epochs():
            for batch in self.data:
                runstep(batch)


def noop(engine: Engine) -> None:
    pass


def on_runmodel(setup: Callable[[runmodel.Engine], Any]) -> Callable[[int], float]:
    def run(steps: int) -> float:
        engine, model = runmodel.Engine(), Noop(steps)
        setup(engine)
        gc.collect()
        start = time.perf_counter()
        result = engine.run(model, "train", epochs=1)
        seconds = time.perf_counter() - start
        assert result.steps == steps, result
        return seconds

    return run


def on_ignite(setup: Callable[[Engine], Any]) -> Callable[[int], float]:
    def run(steps: int) -> float:
        engine = Engine(lambda engine, batch: batch)
        setup(engine)
        gc.collect()
        start = time.perf_counter()
        state = engine.run(range(steps), max_epochs=1)
        seconds = time.perf_counter() - start
        assert state.iteration == steps, state
        return seconds

    return run


VARIANTS: dict[str, Callable[[int], float]] = {
    "runmodel, never reads `.ignite`": on_runmodel(lambda engine: None),
    "runmodel, `.ignite` read, no handlers": on_runmodel(lambda engine: engine.ignite),
    "runmodel, `.ignite` + 1 no-op ITERATION_COMPLETED handler": on_runmodel(
        lambda engine: engine.ignite.add_event_handler(Events.ITERATION_COMPLETED, noop)
    ),
    "ignite `Engine.run`, no handlers": on_ignite(lambda engine: None),
    "ignite `Engine.run`, 1 no-op ITERATION_COMPLETED handler": on_ignite(
        lambda engine: engine.add_event_handler(Events.ITERATION_COMPLETED, noop)
    ),
}


def measure(steps: int, repeats: int) -> dict[str, list[float]]:
    """µs per step of each variant, one list entry per repeat (interleaved)."""
    for run in VARIANTS.values():  # warm up: imports, first-call costs
        run(min(steps, 1000))
    found: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(repeats):
        for name, run in VARIANTS.items():
            found[name].append(run(steps) / steps * 1e6)
    return found


def machine() -> str:
    return (
        f"{platform.platform()}, {platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}, torch {torch.__version__}, "
        f"pytorch-ignite {ignite.__version__}, runmodel {runmodel.__version__}, "
        f"{torch.get_num_threads()} torch thread(s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--quick", action="store_true", help="2,000 steps, 3 repeats")
    args = parser.parse_args()
    steps, repeats = (2_000, 3) if args.quick else (args.steps, args.repeats)
    torch.set_num_threads(1)
    found = measure(steps, repeats)
    base = statistics.median(found["runmodel, never reads `.ignite`"])
    print(f"{machine()}; {steps:,} steps a run, median of {repeats} interleaved repeats\n")
    print("| variant | µs/step (median) | min-max | vs runmodel without `.ignite` |")
    print("|---|---:|---:|---:|")
    for name, values in found.items():
        median = statistics.median(values)
        print(
            f"| {name} | {median:.2f} | {min(values):.2f}-{max(values):.2f} | "
            f"{median - base:+.2f} |"
        )


if __name__ == "__main__":
    main()

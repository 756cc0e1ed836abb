"""What the everyday packs cost per step while they have nothing to do.

The work of ``overhead.py`` (Linear 32->32, batch 64, MSE, SGD, one thread) in epochs of
1,000 steps: a plain PyTorch loop; runmodel with no hooks; runmodel with packs attached
but idle between epochs: ``Unfreeze`` (all trainable from epoch 0), a ``Checkpoint``
every epoch, an epoch-interval ``LRSchedule`` and ``Progress`` writing to a file
(off-terminal: a line per epoch); and the same with an evaluation each epoch (one eval
batch) read by ``EarlyStopping`` and a best-K ``Checkpoint``, epoch-end work a plain
loop does not do. (``GradClip`` is not idle: it clips every step.)

Two measures, both ratios to the plain loop taken in the same process:

* time: every variant reads its batches from one iterable that stamps each fetch, and
  each iteration also times a reference plain step on its own copy of the work (as in
  ``overhead.py``); the median over steps of (iteration - reference), minus the plain
  loop's, is the per-step overhead; repeats are interleaved, the median of 5 reported.
* ``--instructions``: under callgrind (``../shared/tools/instructions``), the
  instructions of 1 and of 3 epochs of each variant; their difference over 2,000 steps is
  the cost of one step, the epoch-end work of one epoch amortized in. Counts repeat
  exactly however busy the machine is.

``--replay`` (issue 39) times what ``NaNGuard(locate=True)`` adds to a failed step: an
MLP (Linear 32->64, ReLU, Linear 64->64, ReLU, Linear 64->32; batch 64, MSE, SGD, one
thread) trained for 200 steps, every 10th batch poisoned with values near float32's
largest, so the forward overflows (the replay names the first module that does). Per
step, the gap between two batch fetches; the median of the healthy steps and of the
poisoned ones, with ``locate=True``, with ``locate="exact"`` and without, runs
interleaved; the replay's cost is (poisoned step with locate) - (poisoned step without),
and a healthy step with ``locate="exact"`` against one with ``locate=True`` is the cost
of its copy of the generators' states.

    python benchmarks/packs_overhead.py [--quick]
    python benchmarks/packs_overhead.py --replay
    valgrind --tool=callgrind --collect-atstart=no --callgrind-out-file=/tmp/cg.%p \\
        python benchmarks/packs_overhead.py --instructions ../shared/tools/instructions
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

import runmodel
from runmodel.packs import (
    Checkpoint,
    EarlyStopping,
    Evaluate,
    LRSchedule,
    NaNGuard,
    Progress,
    Unfreeze,
)

# the work and the timed reference step of overhead.py (this folder is on sys.path)
from overhead import Reference, make_work

EPOCH = 1000  # steps an epoch


def make_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(1)
    return [(torch.randn(64, 32), torch.randn(64, 32)) for _ in range(EPOCH)]


class Stamped:
    """One epoch of batches per iteration; ``stamps`` holds the time of every fetch
    across epochs, so a gap that spans an epoch's end holds the epoch-end work."""

    def __init__(self, batches: list[Any]) -> None:
        self.batches = batches
        self.stamps: list[int] = []

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[Any]:
        stamps, clock = self.stamps, time.perf_counter_ns
        for batch in self.batches:
            stamps.append(clock())
            yield batch


def plain(data: Any, epochs: int, ref: Callable[[Any], None]) -> nn.Module:
    module, optimizer, loss_fn = make_work()
    for _ in range(epochs):
        for batch in data:
            ref(batch)
            x, y = batch
            loss = loss_fn(module(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return module


class Work(runmodel.TorchModel):
    def __init__(self, data: Any, ref: Callable[[Any], None]) -> None:
        super().__init__("cpu")
        self.train_data, self.ref = data, ref
        self.module, self.optimizer, self.loss_fn = make_work()
        self.eval_data = [make_batches()[0]]

    def run(
        self, runstep: runmodel.RunStep, steps: int | None = None, *args: Any, **kwargs: Any
    ) -> None:
        ref = self.ref
        for _ in runstep.epochs():
            for batch in self.train_data:
                ref(batch)
                runstep(batch)


def idle_packs(folder: str) -> list[runmodel.Pack]:
    """Packs with nothing to do between epochs: their per-step cost is the point."""
    return [
        Unfreeze({0: "all"}),
        Checkpoint(folder, every="1ep"),
        LRSchedule(
            lambda opt: torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.99), interval="epoch"
        ),
        Progress(file=io.StringIO()),
    ]


def evaluating_packs(folder: str) -> list[runmodel.Pack]:
    """The idle packs, with an evaluation each epoch (one batch) that early stopping and a
    best-K checkpoint read: work at each epoch's end that a plain loop does not do."""
    return [
        *idle_packs(folder)[:1],
        Evaluate(every="1ep"),
        EarlyStopping("eval_loss", patience=1000),
        Checkpoint(folder, every="1ep", best=("eval_loss", "min")),
        *idle_packs(folder)[2:],
    ]


def with_runmodel(
    packs: Callable[[str], list[runmodel.Pack]] | None,
) -> Callable[[Any, int, Callable[[Any], None]], nn.Module]:
    def run(data: Any, epochs: int, ref: Callable[[Any], None]) -> nn.Module:
        engine = runmodel.Engine()
        with tempfile.TemporaryDirectory() as folder:
            if packs is not None:
                engine.attach(*packs(folder))
            model = Work(data, ref)
            engine.run(model, epochs=epochs)
        return model.module

    return run


VARIANTS = {
    "plain PyTorch loop": plain,
    "runmodel, no packs": with_runmodel(None),
    "runmodel, idle packs": with_runmodel(idle_packs),
    "runmodel, idle packs + Evaluate, EarlyStopping, best-K": with_runmodel(evaluating_packs),
}


def timed(epochs: int, repeats: int) -> list[str]:
    batches = make_batches()
    over: dict[str, list[float]] = {name: [] for name in VARIANTS}
    step: dict[str, list[float]] = {name: [] for name in VARIANTS}
    epoch_end: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(repeats):
        for name, fn in VARIANTS.items():
            data, ref = Stamped(batches), Reference()
            fn(data, epochs, ref)
            gaps = [b - a for a, b in zip(data.stamps, data.stamps[1:], strict=False)]
            own = [g - r for g, r in zip(gaps, ref.times, strict=False)]
            diffs = [o - r for o, r in zip(own, ref.times, strict=False)]
            ends = [own[i] - statistics.median(own) for i in range(EPOCH - 1, len(own), EPOCH)]
            step[name].append(statistics.median(own) / 1e3)
            over[name].append(statistics.median(diffs) / 1e3)
            epoch_end[name].append(statistics.median(ends) / 1e3 if ends else 0.0)
    base = over["plain PyTorch loop"]
    base_step = statistics.median(step["plain PyTorch loop"])
    rows = [
        "| variant | median step (µs) | overhead vs plain (µs/step, median [min, max]) "
        "| ratio to plain | epoch end (µs) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in VARIANTS:
        paired = [o - b for o, b in zip(over[name], base, strict=True)]
        mid = statistics.median(paired)
        rows.append(
            f"| {name} | {statistics.median(step[name]):.2f} | {mid:+.2f} "
            f"[{min(paired):+.2f}, {max(paired):+.2f}] | "
            f"{(base_step + mid) / base_step:.4f} | "
            f"{statistics.median(epoch_end[name]):.0f} |"
        )
    return rows


def instructions(tools: str, dumps: str) -> list[str]:
    """Per variant, the instructions of 1 and of 3 epochs, counted as regions under
    callgrind (whose dumps are ``DUMPS.<pid>.<n>``); one step's share is their difference
    over 2,000 steps."""
    sys.path.insert(0, tools)
    from counted import counted  # type: ignore[import-not-found]

    batches, region, per_step = make_batches(), 0, {}
    for name, fn in VARIANTS.items():
        fn(batches, 1, lambda batch: None)  # warm: first-call costs out of the count
        totals = []
        for epochs in (1, 3):
            with counted():
                fn(batches, epochs, lambda batch: None)
            region += 1
            text = Path(f"{dumps}.{os.getpid()}.{region}").read_text()
            totals.append(
                int(
                    next(line for line in text.splitlines() if line.startswith("totals:")).split()[
                        1
                    ]
                )
            )
        per_step[name] = (totals[1] - totals[0]) / (2 * EPOCH)
    base = per_step["plain PyTorch loop"]
    rows = [
        "| variant | instructions per step | over plain | ratio to plain |",
        "|---|---:|---:|---:|",
    ]
    rows += [
        f"| {name} | {n:,.0f} | {n - base:+,.0f} | {n / base:.4f} |" for name, n in per_step.items()
    ]
    return rows


REPLAY_STEPS, POISON_EVERY = 200, 10


def replay_run(locate: bool | str) -> tuple[list[float], list[float], str]:
    """One run of ``--replay``: the healthy steps' and the poisoned steps' times (µs),
    and the first line NaNGuard wrote on stderr."""
    torch.manual_seed(0)
    module = nn.Sequential(
        nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32)
    )
    batches = [(torch.randn(64, 32), torch.randn(64, 32)) for _ in range(REPLAY_STEPS)]
    for x, _ in batches[POISON_EVERY - 1 :: POISON_EVERY]:
        x[0] = 3e38  # finite, but the first layer's sums overflow
    data = Stamped(batches)
    model = runmodel.TorchModel.from_parts(
        module,
        optimizer=torch.optim.SGD(module.parameters(), lr=0.01),
        loss_fn=nn.MSELoss(),
        train_data=data,
    )
    engine = runmodel.Engine()
    engine.attach(NaNGuard(locate=locate))
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine.run(model, steps=REPLAY_STEPS)
    # step i is the gap from fetch i to fetch i + 1 (the last step has no next fetch)
    gaps = [(b - a) / 1e3 for a, b in zip(data.stamps, data.stamps[1:], strict=False)]
    poisoned = [g for i, g in enumerate(gaps) if (i + 1) % POISON_EVERY == 0]
    healthy = [g for i, g in enumerate(gaps) if (i + 1) % POISON_EVERY and i > 0]
    return healthy, poisoned, (stderr.getvalue().splitlines() or [""])[0]


def replay(repeats: int) -> list[str]:
    """The rows of ``--replay``: medians over each run's steps, then median [min, max]
    over the interleaved runs."""
    healthy_of: dict[bool | str, list[float]] = {False: [], True: [], "exact": []}
    poisoned_of: dict[bool | str, list[float]] = {False: [], True: [], "exact": []}
    line = ""
    for _ in range(repeats):
        for locate in (False, True, "exact"):
            healthy_steps, poisoned, first = replay_run(locate)
            healthy_of[locate].append(statistics.median(healthy_steps))
            poisoned_of[locate].append(statistics.median(poisoned))
            if locate is True:
                line = first

    def less(located: bool | str) -> list[float]:
        return [a - b for a, b in zip(poisoned_of[located], poisoned_of[False], strict=True)]

    healthy = statistics.median(healthy_of[True])

    def row(name: str, values: list[float]) -> str:
        mid = statistics.median(values)
        return (
            f"| {name} | {mid:,.0f} [{min(values):,.0f}, {max(values):,.0f}] "
            f"| {mid / healthy:.1f} |"
        )

    return [
        f"NaNGuard's line: {line}\n",
        "| step | µs, median [min, max] over runs | ratio to a healthy step |",
        "|---|---:|---:|",
        row("healthy (NaNGuard(locate=True), nothing found)", healthy_of[True]),
        row('healthy (NaNGuard(locate="exact"), nothing found)', healthy_of["exact"]),
        row("poisoned, NaNGuard() (skipped)", poisoned_of[False]),
        row("poisoned, NaNGuard(locate=True) (replayed, skipped)", poisoned_of[True]),
        row('poisoned, NaNGuard(locate="exact") (replayed, skipped)', poisoned_of["exact"]),
        row("the replay: located - not located", less(True)),
        row('the replay, "exact": located - not located', less("exact")),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 epochs, 3 repeats")
    parser.add_argument(
        "--replay",
        action="store_true",
        help="time the replay of a failed step by NaNGuard(locate=True) and locate='exact'",
    )
    parser.add_argument(
        "--instructions",
        metavar="TOOLS",
        help="count instructions with the counted() helper in TOOLS",
    )
    parser.add_argument(
        "--dumps", default="/tmp/cg", help="callgrind's --callgrind-out-file, without its .%%p"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.instructions:
        print("\n".join(instructions(args.instructions, args.dumps)))
        return
    epochs, repeats = (2, 3) if args.quick else (10, 5)
    if args.replay:
        print(
            f"machine: {platform.processor() or platform.machine()}, {platform.system()}, "
            f"Python {platform.python_version()}, torch {torch.__version__}, 1 thread; "
            f"{REPLAY_STEPS} steps, every {POISON_EVERY}th poisoned, {2 * repeats} runs\n"
        )
        print("\n".join(replay(repeats)))
        return
    print(
        f"machine: {platform.processor() or platform.machine()}, {platform.system()}, "
        f"Python {platform.python_version()}, torch {torch.__version__}, 1 thread; "
        f"{epochs} epochs of {EPOCH} steps, median of {repeats} interleaved repeats\n"
    )
    with contextlib.redirect_stderr(io.StringIO()):
        rows = timed(epochs, repeats)
    print("\n".join(rows))


if __name__ == "__main__":
    main()

"""What a checkpoint costs: a model of ~100M parameters with Adam's state (~1.2 GB of
tensors), saved by a bare ``torch.save`` of its state dicts, by the ``Checkpoint`` pack
(``checkpoint.save(engine.snapshot(...))``: temporary file, fsync, rename), and by
``Checkpoint(async_save=True)``, whose cost on the training path is the copy of the state
into CPU buffers; the file is written by a background thread.

The model: 6 x ``nn.Linear(4096, 4096)`` with ReLUs (100.7M parameters), Adam, batches of
4 random rows, MSE; ``torch.set_num_threads`` left as torch sets it. Each repeat, in turn
(interleaved, so the machine's drift hits all alike; ``os.sync()`` before each, so none
pays for the writeback of another's file):

* bare: ``torch.save({"module": ..., "optimizer": ...}, path)`` (the file is left to the
  page cache), and the same followed by ``flush`` + ``os.fsync`` (durable, as the pack);
* a run with ``Checkpoint(every=N steps, keep=1)``: the time inside the pack's save hook
  (hooks just before and just after it on ``runstep``);
* the same run with ``async_save=True``: the time inside the save hook (the training
  loop's stall), the background write's own time, and the steps' time while a write is
  under way, against steps with none. N is chosen so that a background write should end
  before the next save (otherwise the next save waits for it: one write at a time; the
  saves that did are counted).

The table gives the median over the repeats (of each repeat's median save) and the
spread (min-max); the first async save, which allocates the buffers, is shown apart.
Then what the training pays in all: the time from one save to the next (N steps, the
slower ones while a write runs included, and a save's stall), and each short run's wall
time, whose end waits for its last write.

    python benchmarks/checkpoint_cost.py            # ~10 minutes; prints a markdown table
    python benchmarks/checkpoint_cost.py --quick    # a smoke run: 10M parameters
"""

from __future__ import annotations

import argparse
import gc
import itertools
import math
import os
import platform
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

import runmodel
from runmodel.packs import Checkpoint


def build(width: int, layers: int, batches: int) -> runmodel.TorchModel:
    """The model, with Adam's state made by one step (so a checkpoint holds it)."""
    torch.manual_seed(0)
    blocks: list[nn.Module] = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width), nn.ReLU()]
    module = nn.Sequential(*blocks[:-1])
    data = [(torch.randn(4, width), torch.randn(4, width)) for _ in range(batches)]
    model = runmodel.TorchModel.from_parts(
        module, optimizer=torch.optim.Adam, loss_fn=nn.MSELoss(), train_data=data
    )
    assert model.optimizer is not None
    nn.functional.mse_loss(module(data[0][0]), data[0][1]).backward()
    model.optimizer.step()
    return model


def state_of(model: runmodel.TorchModel) -> dict[str, Any]:
    assert model.module is not None and model.optimizer is not None
    return {"module": model.module.state_dict(), "optimizer": model.optimizer.state_dict()}


def bare(model: runmodel.TorchModel, path: Path, fsync: bool) -> float:
    started = time.perf_counter()
    if fsync:
        with open(path, "wb") as file:
            torch.save(state_of(model), file)
            file.flush()
            os.fsync(file.fileno())
    else:
        torch.save(state_of(model), path)
    took = time.perf_counter() - started
    path.unlink()
    return took


class Run:
    """An engine with a Checkpoint pack, run again each repeat (one pack, so the async
    buffers are kept from one run to the next, as in one long run): the time in the
    pack's save hook at each save, each background write's time, and each step's time,
    marked by whether a background write was under way all through it."""

    def __init__(self, folder: Path, every: int, async_save: bool) -> None:
        self.every = every
        self.pack = Checkpoint(folder, every=f"{every}st", keep=1, async_save=async_save)
        self.engine = runmodel.Engine()
        self.engine.attach(self.pack)
        self.engine.on("runstep", self._before, priority=-999)  # just before the save (-1000)
        self.engine.on("runstep", self._after, priority=-1001)  # just after it
        self.saves: list[float] = []
        self.waited = 0  # saves that came while the previous write was under way
        self.wall = 0.0  # the whole run
        self.writes: list[float] = []
        self.steps: list[tuple[float, str]] = []  # (seconds, "idle" | "busy" | "mixed")
        self._marks: dict[str, Any] = {}

    def go(self, model: runmodel.TorchModel, saves: int) -> Run:
        self.saves, self.writes, self.steps, self._marks = [], [], [], {}
        started = time.perf_counter()
        self.engine.run(model, steps=self.every * saves + 1)  # its end waits for the write
        self.wall = time.perf_counter() - started
        return self

    def interval(self) -> float:
        """From one save to the next in a long run: ``every`` steps (their mean, slower
        ones while a background write runs included) and a save's stall."""
        mean = statistics.fmean(seconds for seconds, _ in self.steps)
        return self.every * mean + statistics.median(self.saves)

    def _busy(self) -> bool:
        writer = self.pack._writer  # whether a background write is under way (benchmark)
        return writer is not None and writer.busy

    def _before(self, engine: runmodel.Engine) -> None:
        now, marks = time.perf_counter(), self._marks
        if "step" in marks:  # the step since the last mark, less the save in it
            busy = self._busy()
            kind = "busy" if busy and marks["busy"] else "idle" if not marks["busy"] else "mixed"
            self.steps.append((now - marks["step"] - marks.pop("stall", 0.0), kind))
        marks["step"] = now
        if (engine.state.step + 1) % self.every == 0 and self._busy():
            self.waited += 1

    def _after(self, engine: runmodel.Engine) -> None:
        now, marks = time.perf_counter(), self._marks
        if (engine.state.step + 1) % self.every == 0:  # the pack saved
            marks["stall"] = now - marks["step"]
            self.saves.append(marks["stall"])
            thread = getattr(self.pack._writer, "_thread", None)
            if thread is not None:  # the background write: until its thread ends

                def watch(thread: threading.Thread = thread, start: float = now) -> None:
                    thread.join()
                    self.writes.append(time.perf_counter() - start)

                threading.Thread(target=watch, daemon=True).start()
        marks["busy"] = self._busy()


def step_time(model: runmodel.TorchModel, steps: int = 4) -> float:
    """The median time of a training step, with no checkpoints."""
    stamps: list[float] = []
    engine = runmodel.Engine()
    engine.on("runstep", lambda e: stamps.append(time.perf_counter()))
    engine.run(model, steps=steps)
    return statistics.median(b - a for a, b in itertools.pairwise(stamps))


def median_spread(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def machine() -> str:
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{name} ({os.cpu_count()} cores), {platform.system()}, Python "
        f"{platform.python_version()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--saves", type=int, default=2, help="saves per run and repeat")
    parser.add_argument("--quick", action="store_true", help="10M parameters, 2 repeats")
    parser.add_argument("--dir", default=None, help="where files are written (a temp folder)")
    args = parser.parse_args()
    width, layers = (1024, 10) if args.quick else (4096, 6)
    repeats = 2 if args.quick else args.repeats
    model = build(width, layers, batches=8)
    assert model.module is not None
    parameters = sum(p.numel() for p in model.module.parameters())
    root = Path(tempfile.mkdtemp(prefix="ckpt-cost-", dir=args.dir))
    try:
        # space the saves so that a background write ends before the next save
        step, write = step_time(model), bare(model, root / "probe.pt", fsync=True)
        every = max(2, math.ceil(2 * write / step) + 1)
        sync = Run(root / "sync", every, async_save=False)
        asynchronous = Run(root / "async", every, async_save=True)
        columns: dict[str, list[float]] = {
            k: []
            for k in (
                "bare",
                "bare_fsync",
                "sync",
                "async",
                "write",
                "step_idle",
                "step_busy",
                "wall_sync",
                "wall_async",
                "interval_sync",
                "interval_async",
            )
        }
        first, waited = math.nan, 0
        for repeat in range(repeats):
            for variant in ("bare", "bare_fsync", "sync", "async"):
                gc.collect()
                os.sync()  # no variant pays for the writeback of another's file
                if variant.startswith("bare"):
                    columns[variant].append(
                        bare(model, root / "bare.pt", fsync=variant == "bare_fsync")
                    )
                elif variant == "sync":
                    run = sync.go(model, args.saves)
                    columns["sync"].append(statistics.median(run.saves))
                    columns["wall_sync"].append(run.wall)
                    columns["interval_sync"].append(run.interval())
                    columns["step_idle"].append(
                        statistics.median(s for s, kind in run.steps if kind == "idle")
                    )
                else:
                    run = asynchronous.go(model, args.saves + (repeat == 0))
                    if repeat == 0:  # the first save allocates the buffers
                        first = run.saves.pop(0)
                    columns["async"].append(statistics.median(run.saves))
                    columns["wall_async"].append(run.wall)
                    columns["interval_async"].append(run.interval())
                    waited += run.waited
                    columns["write"].append(statistics.median(run.writes))
                    busy = [s for s, kind in run.steps if kind == "busy"]
                    if busy:
                        columns["step_busy"].append(statistics.median(busy))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report(columns, parameters, repeats, args.saves, every, first, step, waited)


def report(
    columns: dict[str, list[float]],
    parameters: int,
    repeats: int,
    saves: int,
    every: int,
    first: float,
    step: float,
    waited: int,
) -> None:
    sync = statistics.median(columns["sync"])
    bare = statistics.median(columns["bare"])
    print(
        f"{time.strftime('%Y-%m-%d')}, {machine()}; {parameters / 1e6:.1f}M parameters "
        f"+ Adam state ({parameters * 12 / 1e9:.2f} GB of tensors); median of {repeats} "
        f"repeats ({saves} saves each, every {every} steps), spread min-max\n"
    )
    print("| save | median (s) | spread (s) | vs bare torch.save | vs Checkpoint pack |")
    print("|---|---:|---:|---:|---:|")
    rows = [
        ("bare `torch.save(state, path)`", "bare"),
        ("bare `torch.save` + `os.fsync`", "bare_fsync"),
        ("`Checkpoint` pack (snapshot, temp file, fsync, rename)", "sync"),
        ("`Checkpoint(async_save=True)`: training-loop stall", "async"),
        ("`Checkpoint(async_save=True)`: background write", "write"),
    ]
    for label, key in rows:
        median, low, high = median_spread(columns[key])
        print(
            f"| {label} | {median:.3f} | {low:.3f}-{high:.3f} | {median / bare:.2f}x | "
            f"{median / sync:.1%} |"
        )
    print(
        f"\nAsync stall / synchronous save: {statistics.median(columns['async']) / sync:.1%} "
        f"(target <= 10%); the first async save, which allocates the buffers: "
        f"{first:.3f} s ({first / sync:.0%}); async saves that came while the previous "
        f"write was under way (and waited for it): {waited}."
    )
    if columns["step_busy"]:
        idle, busy = (statistics.median(columns[k]) for k in ("step_idle", "step_busy"))
        print(
            f"A training step: {idle:.3f} s with no write under way (probe {step:.3f} s), "
            f"{busy:.3f} s while the background write runs ({busy / idle - 1:+.0%})."
        )
    sync_every, async_every = (
        statistics.median(columns[k]) for k in ("interval_sync", "interval_async")
    )
    print(
        f"From one save to the next ({every} steps and a save): {sync_every:.2f} s "
        f"synchronous, {async_every:.2f} s async ({async_every / sync_every - 1:+.0%})."
    )
    steps = every * saves + 1
    wall_sync, wall_async = (statistics.median(columns[k]) for k in ("wall_sync", "wall_async"))
    print(
        f"A whole run of {steps} steps with {saves} saves (its end waits for the last "
        f"write): {wall_sync:.2f} s synchronous, {wall_async:.2f} s async "
        f"({wall_async / wall_sync - 1:+.0%})."
    )


if __name__ == "__main__":
    main()

"""Benchmark and profile modes: a train or infer step (``measure``), timed after
``warmup`` steps. Benchmark reports steps/s and step-time percentiles; profile runs the
steps under ``torch.profiler``, writes the trace and reports the time spent in each hook.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from .._io import prepare_folder
from ..core.checks import whole_number
from ..core.timing import BenchmarkTimings, CallTimes
from .base import Mode
from .eval_infer import infer_plan
from .train import train_plan

if TYPE_CHECKING:
    from ..core import BareEngine, StepPlan

__all__ = ["DEFAULT_WARMUP", "MEASURED_STEPS", "Benchmark", "Profile", "batch_size"]

DEFAULT_WARMUP = 5
MEASURED_STEPS = 50  # steps measured after the warm-up when no budget is given


class _Timed(Mode):
    def __init__(self, measure: str = "train", warmup: int = DEFAULT_WARMUP) -> None:
        if measure not in ("train", "infer"):
            raise ValueError(
                f"measure={measure!r}: {self.name} mode measures a 'train' or 'infer' step"
            )
        whole_number(warmup, "warmup=")
        self.measure, self.warmup = measure, warmup

    @property
    def kind(self) -> str:
        return self.measure

    def budget(self, steps: int | None) -> int:
        """As given, or the warm-up and then ``MEASURED_STEPS``; more than the warm-up."""
        steps = self.warmup + MEASURED_STEPS if steps is None else steps
        if steps <= self.warmup:
            raise ValueError(
                f"{self.name} mode needs more steps ({steps}) than warm-up steps "
                f"({self.warmup}), or nothing is measured"
            )
        return steps

    def _inner(self, engine: BareEngine, model: Any) -> StepPlan:
        return train_plan(engine, model) if self.measure == "train" else infer_plan(model)


class Benchmark(_Timed):
    """Times each step (from ``step_start`` to the end of its ``runstep`` hooks): steps/s,
    samples/s and median, p90 and mean step time, warm-up steps dropped."""

    name: ClassVar[str] = "benchmark"

    def plan(self, engine: BareEngine, model: Any) -> StepPlan:
        plan = self._inner(engine, model)
        timer = StepTimer(_device(model), self.warmup, engine.state.max_steps or 0)
        plan.before.setdefault("step_start", []).insert(0, timer.start)
        plan.after.setdefault("runstep", []).append(timer.stop)
        plan.finish = timer.finish
        return plan


class Profile(_Timed):
    """Runs the steps under ``torch.profiler`` (CPU, and CUDA on a GPU), with phases and
    hooks labelled; writes a TensorBoard trace into ``directory`` (default
    ``runs/profile-MODEL-TIME``) and reports the time spent in each hook."""

    name: ClassVar[str] = "profile"

    def __init__(
        self,
        measure: str = "train",
        warmup: int = DEFAULT_WARMUP,
        directory: str | Path | None = None,
    ) -> None:
        super().__init__(measure, warmup)
        self.directory = None if directory is None else Path(directory)

    def plan(self, engine: BareEngine, model: Any) -> StepPlan:
        return _profile(
            self._inner(engine, model),
            model,
            self.warmup,
            engine.state.max_steps or 0,
            self.directory,
        )


def _device(model: Any) -> torch.device:
    device = getattr(model, "device", None)
    return device if isinstance(device, torch.device) else torch.device("cpu")


def batch_size(batch: Any) -> int | None:
    """The leading size of the first tensor in a batch, if it has one."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    values = (
        batch.values()
        if isinstance(batch, dict)
        else (batch if isinstance(batch, (list, tuple)) else ())
    )
    for value in values:
        if (size := batch_size(value)) is not None:
            return size
    return None


class StepTimer:
    """Times each step from step_start to the end of its runstep hooks.

    On CUDA each step records a pair of preallocated events and the device is
    synchronised only at the two ends of the measured window (after the warm-up and at
    the end); on the CPU the clock is read directly.
    """

    def __init__(self, device: torch.device, warmup: int, steps: int) -> None:
        self.warmup, self.n, self.samples = warmup, 0, 0
        self.cuda = device.type == "cuda"
        self.sync: Callable[[], None] = torch.cuda.synchronize if self.cuda else (lambda: None)
        if self.cuda:
            self.events = [
                (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                for _ in range(steps)
            ]
        self.times = [0] * steps
        self.began = self.window_start = self.window_end = 0

    def start(self, engine: BareEngine) -> None:
        if self.n == self.warmup:
            self.sync()
            self.window_start = time.perf_counter_ns()
        if self.cuda:
            self.events[self.n][0].record()
        else:
            self.began = time.perf_counter_ns()

    def stop(self, engine: BareEngine) -> None:
        n = self.n
        if self.cuda:
            self.events[n][1].record()
        else:
            self.times[n] = time.perf_counter_ns() - self.began
        if n >= self.warmup:
            self.samples += batch_size(engine.state.batch) or 0
            self.window_end = time.perf_counter_ns()  # the window ends with the last step
        self.n = n + 1

    def finish(self, engine: BareEngine) -> dict[str, Any]:
        self.sync()
        measured = self.n - self.warmup
        if measured <= 0:
            return {"timings": BenchmarkTimings(self.warmup, 0).to_dict()}
        wall = (self.window_end - self.window_start) / 1e9
        if self.cuda:
            ms = [a.elapsed_time(b) for a, b in self.events[self.warmup : self.n]]
            # on the device's clock: from the first measured step's start to the last's end
            wall = self.events[self.warmup][0].elapsed_time(self.events[self.n - 1][1]) / 1e3
        else:
            ms = [t / 1e6 for t in self.times[self.warmup : self.n]]
        ms.sort()
        timings = BenchmarkTimings(
            warmup=self.warmup,
            measured_steps=measured,
            seconds=wall,
            steps_per_s=measured / wall,
            samples_per_s=self.samples / wall if self.samples else None,
            step_ms_median=statistics.median(ms),
            step_ms_p90=ms[min(len(ms) - 1, int(0.9 * len(ms)))],
            step_ms_mean=sum(ms) / len(ms),
            device="cuda" if self.cuda else "cpu",
        )
        return {"timings": timings.to_dict()}


def _profile(
    plan: StepPlan, model: Any, warmup: int, steps: int, directory: Path | None
) -> StepPlan:
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    folder = directory or Path("runs") / (
        f"profile-{type(model).__name__}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    prepare_folder(folder, "Profile")
    activities = [ProfilerActivity.CPU]
    if _device(model).type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    profiler = profile(
        activities=activities,
        schedule=schedule(wait=0, warmup=warmup, active=steps - warmup, repeat=1),
        on_trace_ready=tensorboard_trace_handler(str(folder)),
    )
    for phase, action in list(plan.actions.items()):

        def labelled(
            engine: BareEngine, action: Any = action, label: str = f"runmodel/{phase}"
        ) -> Any:
            with record_function(label):
                return action(engine)

        labelled.__wrapped__ = action  # type: ignore[attr-defined]  # errors name the action
        plan.actions[phase] = labelled
    # the hooks timed and labelled (phases: their actions are labelled above)
    times = CallTimes(phases=False, label=record_function)

    def finish(engine: BareEngine) -> dict[str, Any]:
        for hooks_of in (engine.table.hooks, engine.table.overrides):
            for attached in (h for hs in hooks_of.values() for h in hs if h.pack is not None):
                # a pack's hook that never fired here (a train-only one): listed, 0 calls
                times.listed(attached.phase, attached.name)
        traces = sorted(folder.glob("*.pt.trace.json"), key=lambda p: p.stat().st_mtime)
        files = {"directory": str(folder)}
        if traces:
            files["trace"] = str(traces[-1])
        return {
            "timings": {"warmup": warmup, "hooks": times.rows(hooks=True, called_only=False)},
            "files": files,
        }

    plan.context = lambda: profiler
    plan.after.setdefault("runstep", []).append(lambda engine: profiler.step())
    plan.wrap = times.wrap
    plan.finish = finish
    return plan

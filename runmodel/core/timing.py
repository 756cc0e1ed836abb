"""What a run's ``result.timings`` holds, typed: ``CallTimes``, the time spent in each
phase and each hook (rows of ``CallTime``), measured by a ``Wrapper`` around what dispatch
calls (``engine.instrument``, a mode's ``StepPlan.wrap``), which the ``Timer`` pack and
profile mode both time with; and ``BenchmarkTimings``, what benchmark mode measured.
``result.timings`` keeps them as plain values (``to_dict``), as ``metrics.json`` and
``runmodel run --json`` write them; ``of`` reads them back."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .hooks import Hook

__all__ = ["BenchmarkTimings", "CallTime", "CallTimes"]


@dataclass(frozen=True)
class BenchmarkTimings:
    """What benchmark mode measured after ``warmup`` steps: ``measured_steps``, the
    measured window's wall-clock ``seconds``, ``steps_per_s``, ``samples_per_s`` (None
    when the batches have no size), the median, 90th percentile and mean step time in ms,
    and the ``device`` type. With no step measured, only the first two are known."""

    warmup: int
    measured_steps: int
    seconds: float | None = None
    steps_per_s: float | None = None
    samples_per_s: float | None = None
    step_ms_median: float | None = None
    step_ms_p90: float | None = None
    step_ms_mean: float | None = None
    device: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """As ``result.timings`` holds them (the first two alone when none was measured)."""
        if not self.measured_steps:
            return {"warmup": self.warmup, "measured_steps": 0}
        return dataclasses.asdict(self)

    @classmethod
    def of(cls, timings: Mapping[str, Any]) -> BenchmarkTimings | None:
        """The benchmark's timings in a result's ``timings``, or None (another mode's, or
        none measured)."""
        if "step_ms_median" not in timings:
            return None
        return cls(**{f.name: timings[f.name] for f in dataclasses.fields(cls)})


@dataclass(frozen=True)
class CallTime:
    """One row of ``result.timings["phases"]`` or ``["hooks"]``: a phase (``hook`` None)
    or one of its hooks, its ``calls``, the time spent in them all (``total_ms``) and in
    one on average (``mean_us``)."""

    phase: str
    hook: str | None
    calls: int
    total_ms: float
    mean_us: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> CallTime:
        return cls(**{f.name: row[f.name] for f in dataclasses.fields(cls)})


Label = Callable[[str], contextlib.AbstractContextManager[Any]]


class CallTimes:
    """Calls and host time per phase (``hook`` None) and per hook, keyed by phase and hook
    name. ``wrap`` is the ``Wrapper``; ``phases=False`` leaves the phases unwrapped (only
    hooks are timed); ``label(text)`` is a context each timed call runs in, named
    ``runmodel/PHASE/HOOK`` (profile mode gives ``torch.profiler``'s ``record_function``,
    so the trace shows them). Each timed call costs two clock reads."""

    def __init__(self, phases: bool = True, label: Label | None = None) -> None:
        self.phases, self.label = phases, label
        #: (phase, hook name or None) -> [calls, nanoseconds]
        self.stats: dict[tuple[str, str | None], list[int]] = {}

    def wrap(self, phase: str, hook: Hook | None, fn: Callable[..., Any]) -> Callable[..., Any]:
        if hook is None and not self.phases:
            return fn
        name = None if hook is None else hook.name
        stat = self.stats.setdefault((phase, name), [0, 0])
        clock = time.perf_counter_ns
        label = self.label

        if label is None:

            def timed(*args: Any) -> Any:
                start = clock()
                try:
                    return fn(*args)
                finally:
                    stat[0] += 1
                    stat[1] += clock() - start

            return timed

        text = f"runmodel/{phase}" if name is None else f"runmodel/{phase}/{name}"

        def labelled(*args: Any) -> Any:
            with label(text):
                start = clock()
                try:
                    return fn(*args)
                finally:
                    stat[0] += 1
                    stat[1] += clock() - start

        return labelled

    def listed(self, phase: str, name: str) -> None:
        """Count hook ``name`` of ``phase`` in the rows even if it is never called."""
        self.stats.setdefault((phase, name), [0, 0])

    def rows(self, hooks: bool, called_only: bool = True) -> list[dict[str, Any]]:
        """The hooks' rows (``hooks``) or the phases', slowest first: ``phase``,
        ``hook``, ``calls``, ``total_ms``, ``mean_us``; without the never-called ones
        when ``called_only``."""
        found = [
            _row(phase, name, calls, ns)
            for (phase, name), (calls, ns) in self.stats.items()
            if (name is not None) == hooks and (calls or not called_only)
        ]
        return sorted(found, key=lambda row: -row["total_ms"])


def _row(phase: str, name: str | None, calls: int, ns: int) -> dict[str, Any]:
    return CallTime(phase, name, calls, ns / 1e6, ns / calls / 1e3 if calls else 0.0).to_dict()

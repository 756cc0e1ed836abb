"""CallTimes: the calls and time of each phase and hook, the wrapper both the Timer pack and
profile mode time with."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import runmodel
from runmodel.core.timing import CallTimes

from helpers import Counting


def test_it_times_each_hook_and_phase_into_rows_slowest_first() -> None:
    engine = runmodel.Engine()
    times = CallTimes()
    engine.on("setup", lambda e: e.instrument(times.wrap), priority=100)
    engine.on("runstep", lambda e: None, name="quick")
    engine.run(Counting(batches=3), epochs=2)
    hooks = {(r["phase"], r["hook"]): r["calls"] for r in times.rows(hooks=True)}
    phases = {r["phase"]: r["calls"] for r in times.rows(hooks=False)}
    assert hooks[("runstep", "quick")] == 6 and phases["runstep"] == 6
    assert "epoch_start" not in phases  # a phase with nothing to do is not called
    rows = times.rows(hooks=False)
    assert [r["total_ms"] for r in rows] == sorted((r["total_ms"] for r in rows), reverse=True)


def test_with_a_label_each_hook_runs_inside_it_and_phases_are_left_alone() -> None:
    labels: list[str] = []

    @contextlib.contextmanager
    def label(text: str) -> Iterator[None]:
        labels.append(text)
        yield

    engine = runmodel.Engine()
    times = CallTimes(phases=False, label=label)
    engine.on("setup", lambda e: e.instrument(times.wrap), priority=100)
    engine.on("epoch_end", lambda e: None, name="once")
    engine.run(Counting(batches=2), epochs=1)
    times.listed("teardown", "never")
    assert labels == ["runmodel/epoch_end/once"]
    assert times.rows(hooks=False) == []
    assert [r["hook"] for r in times.rows(hooks=True, called_only=False)][-1] == "never"


def test_benchmark_timings_are_a_dataclass_kept_in_the_result_as_plain_values() -> None:
    from runmodel.core.timing import BenchmarkTimings, CallTime

    result = runmodel.Engine(runmodel.packs.Timer()).run(
        Counting(batches=8), runmodel.Benchmark(warmup=2), steps=8
    )
    bench = BenchmarkTimings.of(result.timings)
    assert bench is not None and bench.measured_steps == 6 and bench.warmup == 2
    assert bench.to_dict() == {k: result.timings[k] for k in bench.to_dict()}
    assert list(bench.to_dict()) == [
        "warmup",
        "measured_steps",
        "seconds",
        "steps_per_s",
        "samples_per_s",
        "step_ms_median",
        "step_ms_p90",
        "step_ms_mean",
        "device",
    ]
    rows = [CallTime.of(row) for row in result.timings["phases"]]
    assert [row.to_dict() for row in rows] == result.timings["phases"]
    assert BenchmarkTimings(5, 0).to_dict() == {"warmup": 5, "measured_steps": 0}
    assert BenchmarkTimings.of({"warmup": 5, "hooks": []}) is None  # profile mode's

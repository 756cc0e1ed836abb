"""Timer: the time spent in each phase and hook, in the run's result."""

from __future__ import annotations

import time

import runmodel
from runmodel.packs.timer import Timer

from helpers import Tiny


def test_timer_times_phases_and_hooks_into_the_result() -> None:
    engine = runmodel.Engine()
    engine.attach(Timer())
    engine.on("runstep", lambda e: time.sleep(0.002), name="slow")
    engine.on("epoch_end", lambda e: None, name="end")
    result = engine.run(Tiny(), epochs=2)  # 4 steps an epoch
    phases = {row["phase"]: row for row in result.timings["phases"]}
    hooks = {(row["phase"], row["hook"]): row for row in result.timings["hooks"]}
    assert phases["runstep"]["calls"] == 8 and phases["forward"]["calls"] == 8
    assert phases["epoch_end"]["calls"] == 2
    assert hooks[("runstep", "slow")]["calls"] == 8
    assert hooks[("runstep", "slow")]["total_ms"] >= 8 * 2.0
    # a phase's time holds its hooks' and its action's: runstep holds forward and the sleep
    assert phases["runstep"]["total_ms"] >= hooks[("runstep", "slow")]["total_ms"]
    assert phases["runstep"]["total_ms"] > phases["forward"]["total_ms"]
    assert result.timings["hooks"][0]["hook"] == "slow"  # slowest first
    assert set(result.timings["phases"][0]) == {"phase", "hook", "calls", "total_ms", "mean_us"}


def test_timer_comes_off_after_the_run_and_counts_afresh() -> None:
    engine = runmodel.Engine()
    timer = Timer()
    engine.attach(timer)
    first = engine.run(Tiny(), epochs=1)
    second = engine.run(Tiny(), epochs=2)
    count = {r["phase"]: r["calls"] for r in first.timings["phases"]}
    again = {r["phase"]: r["calls"] for r in second.timings["phases"]}
    assert (count["runstep"], again["runstep"]) == (4, 8)
    assert engine.table.wrappers == []


def test_without_timer_nothing_is_wrapped() -> None:
    engine = runmodel.Engine()
    engine.on("runstep", lambda e: None, name="plain")
    engine.run(Tiny(), epochs=1)
    assert engine.table.wrappers == []
    assert "phases" not in engine.run(Tiny(), epochs=1).timings

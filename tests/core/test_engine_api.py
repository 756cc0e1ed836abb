"""What packs build on: stop(reason), instrument(), state.timings, the restore order."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import runmodel
from runmodel.packs import Checkpoint


class Steps(runmodel.Model):
    """Two epochs of four steps, each step sleeping a little."""

    def step(self, batch: Any) -> Any:
        time.sleep(0.001)
        return batch

    def run(
        self, runstep: runmodel.RunStep, steps: int | None = None, *args: Any, **kwargs: Any
    ) -> None:
        for _ in runstep.epochs():
            for b in range(4):
                runstep(b)


def test_stop_reason_reaches_the_result() -> None:
    engine = runmodel.Engine()
    engine.on("runstep", lambda e: e.stop("loss is low enough"), once=5)
    engine.on("runstep", lambda e: e.stop("a later reason"), once=5, priority=-1)
    result = engine.run(Steps(), epochs=2)
    assert (result.ended, result.steps, result.reason) == ("stopped", 6, "loss is low enough")
    assert runmodel.Engine().run(Steps(), epochs=2).reason is None


def test_instrument_wraps_hooks_and_phases_and_comes_off() -> None:
    engine = runmodel.Engine()
    engine.on("runstep", lambda e: None, name="noop")
    engine.on("epoch_end", lambda e: None, name="end")
    seen: list[tuple[str, str | None]] = []

    def wrap(phase: str, hook: runmodel.Hook | None, fn: Any) -> Any:
        def wrapped(*args: Any) -> Any:
            seen.append((phase, None if hook is None else hook.name))
            return fn(*args)

        return wrapped

    remove = engine.instrument(wrap)
    engine.run(Steps(), epochs=2)
    assert seen.count(("runstep", "noop")) == 8 and seen.count(("runstep", None)) == 8
    assert seen.count(("epoch_end", "end")) == 2 and seen.count(("epoch_end", None)) == 2
    assert ("step_start", None) not in seen  # a phase with nothing to do is not called
    remove()
    seen.clear()
    engine.run(Steps(), epochs=1)
    assert seen == []


def test_instrument_mid_run_keeps_filters_counting() -> None:
    engine = runmodel.Engine()
    fired: list[int] = []
    engine.on("runstep", lambda e: fired.append(e.state.step), every=3)
    engine.on("runstep", lambda e: e.instrument(lambda p, h, fn: fn), once=1)
    engine.run(Steps(), epochs=2)
    assert fired == [2, 5]


def test_pack_timings_join_the_result() -> None:
    engine = runmodel.Engine()
    engine.on("teardown", lambda e: e.state.timings.update(mine={"calls": 3}))
    result = engine.run(Steps(), runmodel.Benchmark(warmup=1), steps=6)
    assert result.timings["mine"] == {"calls": 3}
    assert result.timings["measured_steps"] == 5  # the mode's own timings stay


class Net(runmodel.TorchModel):
    def __init__(self, device: str | None = "cpu", init_options: Any = None) -> None:
        super().__init__(device, init_options)
        torch.manual_seed(0)
        self.module = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.2), nn.Linear(8, 1))

    def setup(self, setup_options: Any = None) -> None:
        g = torch.Generator().manual_seed(1)
        x = torch.randn(32, 4, generator=g)
        self.train_data = [
            (x[i : i + 8], x[i : i + 8].sum(1, keepdim=True)) for i in range(0, 32, 8)
        ]
        self.optimizer = torch.optim.Adam(self.module.parameters(), lr=1e-2)
        self.loss_fn = nn.MSELoss()


def regroup(engine: runmodel.Engine) -> None:
    """A setup hook that splits the optimizer into a group per layer, as a pack might."""
    optimizer = engine.model.optimizer
    layers = [list(m.parameters()) for m in engine.model.module if list(m.parameters())]
    defaults = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
    optimizer.param_groups = [{**defaults, "params": params} for params in layers]


def test_a_setup_hook_may_regroup_the_optimizer_and_resume_still_loads(tmp_path: Path) -> None:
    straight = Net()
    engine = runmodel.Engine()
    engine.on("setup", regroup)
    engine.run(straight, epochs=4)

    first = runmodel.Engine()
    first.on("setup", regroup)
    first.attach(Checkpoint(tmp_path))
    first.run(Net(), epochs=2)
    resumed, seen = Net(), []
    second = runmodel.Engine()
    second.on("setup", regroup)
    # counters are restored before the setup hooks; weights, optimizer and RNG after
    second.on("setup", lambda e: seen.append((e.state.epoch, len(e.model.optimizer.state))))
    second.attach(Checkpoint(tmp_path / "again"))
    second.run(resumed, epochs=4, resume=tmp_path)
    assert seen == [(2, 0)]
    assert len(resumed.optimizer.param_groups) == 2 and len(resumed.optimizer.state) == 4
    for p, q in zip(resumed.module.parameters(), straight.module.parameters(), strict=True):
        assert torch.equal(p, q)


def test_a_stop_outside_a_run_does_nothing_and_skip_step_says_where_it_belongs() -> None:
    engine = runmodel.Engine()
    engine.stop("not running")
    assert engine.run(Steps(), epochs=1).steps == 4
    with pytest.raises(RuntimeError, match="step_start hook"):
        engine.skip_step()

"""Closure optimizers (``torch.optim.LBFGS``) are first-class: the built-in step calls
``optimizer.step(closure)``, the closure zeroing the gradients and firing the ``forward``
and ``backward`` phases, as the hand-written closure loop does, bit for bit; per-step
hooks and ``GradClip`` attach as with any optimizer, and what cannot work with one is
refused at setup, naming why."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import runmodel
from runmodel.core.state import refused_at_setup
from runmodel.packs import GradAccumulation, GradClip, LRSchedule, NaNGuard

from helpers import Tiny, make_data, params

SHAPE = {"features": 4, "batches": 3, "batch_size": 8}


def lbfgs(parameters: Any, lr: float) -> torch.optim.LBFGS:
    return torch.optim.LBFGS(parameters, lr=lr, max_iter=4)


def model() -> Tiny:
    return Tiny(optimizer=lbfgs, lr=0.5, **SHAPE)


def closure_loop(
    epochs: int, clip: float | None = None
) -> tuple[nn.Module, list[float], list[float]]:
    """The hand-written loop: per batch ``optimizer.step(closure)``; the losses each
    closure call computed, and those ``step`` returned."""
    module = Tiny(**SHAPE).module
    optimizer = lbfgs(module.parameters(), lr=0.5)
    calls, steps = [], []
    for _ in range(epochs):
        for x, y in make_data(**SHAPE):

            def closure(x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
                optimizer.zero_grad()
                loss = nn.functional.mse_loss(module(x), y)
                calls.append(loss.item())
                loss.backward()
                if clip is not None:
                    torch.nn.utils.clip_grad_norm_(module.parameters(), clip)
                return loss

            steps.append(optimizer.step(closure).item())
    return module, calls, steps


def test_lbfgs_trains_as_the_hand_written_closure_loop_bit_for_bit() -> None:
    engine = runmodel.Engine()
    calls: list[float] = []
    steps: list[float] = []
    phases: list[str] = []
    engine.on("forward", lambda e: calls.append(e.state.loss.item()))
    engine.on("step_start", lambda e: phases.append("step_start"))
    engine.on("backward", lambda e: phases.append("backward"))
    engine.on("optimizer_step", lambda e: phases.append("optimizer_step"))
    engine.on("runstep", lambda e: steps.append(e.state.loss.item()))
    trained = model()
    result = engine.run(trained, epochs=2)
    module, plain_calls, plain_steps = closure_loop(epochs=2)
    assert torch.equal(params(trained), params(module)) and result.steps == 6
    # forward and backward fire at each call of the closure, the step's phases once a step;
    # after the step, state.loss is what step() returned (the loss before it)
    assert calls == plain_calls and steps == plain_steps and len(calls) > result.steps
    assert phases.count("step_start") == phases.count("optimizer_step") == 6
    assert phases.count("backward") == len(calls)


def test_grad_clip_clips_in_each_call_of_the_closure() -> None:
    engine = runmodel.Engine(GradClip(max_norm=0.05))
    trained = model()
    engine.run(trained, epochs=1)
    module, *_ = closure_loop(epochs=1, clip=0.05)
    assert torch.equal(params(trained), params(module))
    unclipped, *_ = closure_loop(epochs=1)
    assert not torch.equal(params(trained), params(unclipped))  # the clipping mattered
    assert "grad_clip.in_closure" not in engine.describe()  # the run's hook went with it


def test_an_lr_schedule_steps_once_per_optimizer_step() -> None:
    pack = LRSchedule(lambda optimizer: torch.optim.lr_scheduler.StepLR(optimizer, 1, 0.5))
    engine = runmodel.Engine(pack)
    trained = model()
    engine.run(trained, epochs=1)
    assert pack.optimizer_steps == 3 and trained.optimizer.param_groups[0]["lr"] == 0.5 / 8


@pytest.mark.parametrize(
    ("pack", "why"),
    [
        (
            NaNGuard,
            "NaNGuard cannot work with LBFGS, a closure optimizer .*the step cannot be skipped",
        ),
        (
            lambda: GradAccumulation(2),
            "GradAccumulation cannot work with LBFGS, a closure optimizer .*nothing to accumulate",
        ),
    ],
)
def test_packs_that_cannot_work_with_a_closure_optimizer_are_refused_at_setup(
    pack: Any, why: str
) -> None:
    engine = runmodel.Engine(pack())
    with pytest.raises(ValueError, match=why) as info:
        engine.run(model(), epochs=1)
    assert refused_at_setup(info.value)

"""A train step whose update the user writes (an override of ``optimizer_step``) needs no
optimizer; what does need one (the built-in update, ``LRSchedule``,
``GradAccumulation``) is refused at setup, naming it."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import runmodel
from runmodel.core.state import refused_at_setup
from runmodel.packs import GradAccumulation, GradClip, LRSchedule, NaNGuard

from helpers import Tiny, make_data, params, plain_sgd

SHAPE = {"features": 4, "batches": 4, "batch_size": 8}


class NoOptimizer(Tiny):
    """Tiny without an optimizer: its update is the run's override."""

    def setup(self, setup_options: dict[str, Any] | None = None) -> None:
        super().setup(setup_options)
        self.optimizer = None


def sgd_by_hand(engine: runmodel.Engine, lr: float = 0.1) -> None:
    @engine.override("optimizer_step")
    def update(engine: runmodel.Engine, default: Any) -> None:
        module = engine.model.module
        with torch.no_grad():
            for p in module.parameters():
                p.add_(p.grad, alpha=-lr)  # as torch.optim.SGD steps
        module.zero_grad(set_to_none=True)


def test_an_update_written_as_an_override_trains_without_an_optimizer() -> None:
    engine = runmodel.Engine()
    sgd_by_hand(engine)
    model = NoOptimizer(**SHAPE)
    result = engine.run(model, epochs=2)
    reference = plain_sgd(Tiny(**SHAPE).module, make_data(**SHAPE), lr=0.1, epochs=2)
    assert result.steps == 8 and torch.equal(params(model), params(reference))


def test_a_model_whose_compute_loss_is_its_own_needs_no_loss_fn() -> None:
    class OwnLoss(NoOptimizer):
        def setup(self, setup_options: dict[str, Any] | None = None) -> None:
            super().setup(setup_options)
            self.loss_fn = None

        def compute_loss(self, output: torch.Tensor, batch: Any) -> torch.Tensor:
            return nn.functional.mse_loss(output, batch[1])

    engine = runmodel.Engine()
    sgd_by_hand(engine)
    model = OwnLoss(**SHAPE)
    engine.run(model, epochs=1)
    reference = plain_sgd(Tiny(**SHAPE).module, make_data(**SHAPE), lr=0.1, epochs=1)
    assert torch.equal(params(model), params(reference))


def test_without_an_override_the_missing_optimizer_is_named_with_the_way_out() -> None:
    with pytest.raises(
        ValueError,
        match=r"train mode needs NoOptimizer\.optimizer; .*"
        r"engine\.override\('optimizer_step', \.\.\.\), which "
        r"needs no optimizer",
    ):
        runmodel.Engine().run(NoOptimizer(**SHAPE))


def test_an_override_that_calls_the_built_in_update_without_an_optimizer_says_so() -> None:
    engine = runmodel.Engine()
    engine.override("optimizer_step", lambda e, default: default(e))
    with pytest.raises(
        RuntimeError,
        match=r"called default\(engine\), whose built-in action "
        r"steps NoOptimizer\.optimizer, and there is none",
    ):
        engine.run(NoOptimizer(**SHAPE), steps=1)


@pytest.mark.parametrize(
    ("pack", "named"),
    [
        (lambda: LRSchedule(warmup_steps=2), "LRSchedule schedules the learning rate"),
        (lambda: GradAccumulation(2), "GradAccumulation steps the optimizer once per window"),
    ],
)
def test_packs_that_need_the_optimizer_refuse_a_model_without_one_at_setup(
    pack: Any, named: str
) -> None:
    engine = runmodel.Engine(pack())
    sgd_by_hand(engine)
    steps: list[int] = []
    engine.on("runstep", lambda e: steps.append(e.state.step))
    with pytest.raises(ValueError, match=named + r".*NoOptimizer has no optimizer") as info:
        engine.run(NoOptimizer(**SHAPE), epochs=1)
    assert refused_at_setup(info.value) and steps == []


def test_gradient_clipping_and_nan_guard_work_on_the_modules_parameters() -> None:
    """Without an optimizer, GradClip clips (and NaNGuard checks and drops) the gradients
    of the module's parameters, before the hand-written update."""
    engine = runmodel.Engine(GradClip(max_norm=0.5), NaNGuard())
    sgd_by_hand(engine)
    model = NoOptimizer(**SHAPE)
    engine.run(model, epochs=1)

    reference = Tiny(**SHAPE).module
    for x, y in make_data(**SHAPE):
        nn.functional.mse_loss(reference(x), y).backward()
        torch.nn.utils.clip_grad_norm_(list(reference.parameters()), 0.5)
        with torch.no_grad():
            for p in reference.parameters():
                p.add_(p.grad, alpha=-0.1)
        reference.zero_grad(set_to_none=True)
    assert torch.equal(params(model), params(reference))

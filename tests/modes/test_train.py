"""Train mode on real torch: phases, overrides on real gradients, identical results."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import runmodel

from helpers import Tiny, make_data, params, plain_sgd

#: 8 batches of 16 rows of 8 features an epoch
SHAPE = {"features": 8, "batches": 8, "batch_size": 16}


def regression(device: str = "cpu", lr: float = 0.05) -> Tiny:
    """A linear regression trained by SGD(lr)."""
    return Tiny(device, lr=lr, **SHAPE)


def plain_loop(
    device: str = "cpu",
    epochs: int = 1,
    lr: float = 0.05,
    accumulate: int = 1,
    steps: int | None = None,
) -> nn.Module:
    """``regression(device)``'s module trained by a hand-written loop on the same data."""
    return plain_sgd(regression(device).module, make_data(**SHAPE), lr, epochs, steps, accumulate)


def test_training_matches_a_plain_loop_exactly(engine: runmodel.Engine, device: str) -> None:
    model = regression(device)
    losses: list[float] = []
    engine.on("epoch_end", lambda e: losses.append(e.state.loss.item()))
    result = engine.run(model, epochs=5)
    assert torch.equal(params(model), params(plain_loop(device, epochs=5)))
    assert result.steps == 40 and losses[-1] < losses[0] / 4


def test_phased_and_fused_steps_are_identical(device: str) -> None:
    fused = regression(device)
    runmodel.Engine().run(fused, epochs=3)
    phased = regression(device)
    engine = runmodel.Engine()
    engine.on("backward", lambda e: None)  # any hook on an inner phase: the phased step
    engine.run(phased, epochs=3)
    assert torch.equal(params(fused), params(phased))


def test_inner_phases_fire_in_order_after_their_actions(engine: runmodel.Engine) -> None:
    log: list[tuple[str, Any]] = []
    engine.on("forward", lambda e: log.append(("forward", e.state.loss.requires_grad)))
    engine.on(
        "backward", lambda e: log.append(("backward", e.model.module.weight.grad is not None))
    )
    engine.on(
        "optimizer_step",
        lambda e: log.append(("optimizer_step", e.model.module.weight.grad is None)),
    )
    engine.on("runstep", lambda e: log.append(("runstep", e.state.step)))
    engine.run(regression(), steps=2)
    assert log == [
        ("forward", True),
        ("backward", True),
        ("optimizer_step", True),
        ("runstep", 0),
        ("forward", True),
        ("backward", True),
        ("optimizer_step", True),
        ("runstep", 1),
    ]


def test_override_scales_the_loss_like_a_smaller_lr(engine: runmodel.Engine, device: str) -> None:
    @engine.override("backward")
    def half(engine: runmodel.Engine, default: Any) -> None:
        engine.state.loss = engine.state.loss * 0.5
        default(engine)

    model = regression(device, lr=0.1)
    engine.run(model, epochs=2)
    assert torch.allclose(params(model), params(plain_loop(device, epochs=2, lr=0.05)), atol=1e-6)


def test_override_accumulates_gradients(engine: runmodel.Engine, device: str) -> None:
    @engine.override("optimizer_step")
    def every_second(engine: runmodel.Engine, default: Any) -> None:
        if (engine.state.step + 1) % 2 == 0:
            default(engine)

    model = regression(device)
    engine.run(model, epochs=2)
    assert torch.equal(params(model), params(plain_loop(device, epochs=2, accumulate=2)))


def test_three_overrides_compose_on_a_real_step(engine: runmodel.Engine, device: str) -> None:
    log: list[str] = []
    for name, priority in (("outer", 3), ("middle", 2), ("inner", 1)):

        def wrap(engine: runmodel.Engine, default: Any, name: str = name) -> None:
            log.append(f"{name}>")
            default(engine)
            log.append(f"<{name}")

        engine.override("backward", wrap, priority=priority, name=name)
    engine.on("backward", lambda e: log.append("hook"))
    model = regression(device)
    engine.run(model, steps=1)
    assert log == ["outer>", "middle>", "inner>", "<inner", "<middle", "<outer", "hook"]
    assert torch.equal(params(model), params(plain_loop(device, steps=1)))


def test_hooks_added_mid_run_take_effect_at_the_next_event(
    engine: runmodel.Engine, device: str
) -> None:
    late: list[int] = []

    @engine.on("runstep", once=2)  # at step 2, the third
    def add_late(engine: runmodel.Engine) -> None:
        engine.on("backward", lambda e: late.append(e.state.step))

    model = regression(device)
    engine.run(model, steps=6)
    assert late == [3, 4, 5]
    assert torch.equal(params(model), params(plain_loop(device, steps=6)))


def test_custom_step_parts_by_subclassing(engine: runmodel.Engine, device: str) -> None:
    class Dicts(Tiny):
        def setup(self, setup_options: dict[str, Any] | None = None) -> None:
            super().setup(setup_options)
            self.train_data = [{"x": x, "y": y} for x, y in make_data(**SHAPE)]

        def compute_output(self, batch: Any) -> torch.Tensor:
            return self.module(batch["x"])

        def compute_loss(self, output: torch.Tensor, batch: Any) -> torch.Tensor:
            return self.loss_fn(output, batch["y"])

    model = Dicts(device, lr=0.05, **SHAPE)  # dicts are moved to the device like tuples
    engine.run(model, epochs=2)
    assert torch.equal(params(model), params(plain_loop(device, epochs=2)))


def test_missing_optimizer_is_a_clear_error_before_any_step(engine: runmodel.Engine) -> None:
    class NoOptimizer(Tiny):
        def setup(self, setup_options: dict[str, Any] | None = None) -> None:
            self.loss_fn = nn.MSELoss()
            self.train_data = make_data(**SHAPE)

    steps: list[int] = []
    engine.on("runstep", lambda e: steps.append(e.state.step))
    with pytest.raises(ValueError, match=r"train mode needs NoOptimizer\.optimizer"):
        engine.run(NoOptimizer(**SHAPE))
    assert steps == []


@pytest.mark.parametrize("phased", [False, True])
def test_shape_error_names_the_phase(engine: runmodel.Engine, phased: bool) -> None:
    model = regression()
    model.module = nn.Linear(7, 1)  # for inputs of 8 features
    if phased:
        engine.on("forward", lambda e: None)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied") as info:
        engine.run(model)
    assert "raised in phase 'forward' (built-in action)" in "\n".join(info.value.__notes__)


@pytest.mark.parametrize("phased", [False, True])
def test_an_optimizer_replaced_mid_run_is_the_one_that_steps(phased: bool, device: str) -> None:
    engine = runmodel.Engine()
    if phased:
        engine.on("backward", lambda e: None)

    @engine.on("epoch_end", once=0)  # at epoch 0
    def freeze(engine: runmodel.Engine) -> None:  # lr 0 from the second epoch on
        engine.model.optimizer = torch.optim.SGD(engine.model.module.parameters(), lr=0.0)

    snapshots: list[torch.Tensor] = []
    engine.on("epoch_end", lambda e: snapshots.append(params(e.model)))
    engine.run(regression(device), epochs=3)
    assert torch.equal(snapshots[0], snapshots[1]) and torch.equal(snapshots[1], snapshots[2])
    assert torch.equal(snapshots[0], params(plain_loop(device)))  # the first epoch trained


def test_parts_set_on_the_instance_are_used_by_the_fast_step() -> None:
    model = regression()
    model.compute_loss = lambda output, batch: (output * 0).sum()  # type: ignore[method-assign]
    before = params(model)
    runmodel.Engine().run(model, epochs=1)
    assert torch.equal(params(model), before)  # a zero loss moves nothing

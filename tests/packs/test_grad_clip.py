"""The GradClip pack: by total norm and by value, against the same clipping written out;
what the optimizer sees; the grad_norm metric; a replaced optimizer; a GradScaler
(unscaled before clipping); bad arguments."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import runmodel
from runmodel.backends.amp import Autocast, ScaledAutocast
from runmodel.packs.grad_clip import GradClip

from helpers import Counting, Tiny, build_module, make_data, params


def mlp(device: str = "cpu") -> Tiny:
    """An MLP regression, SGD(lr=0.05), 4 batches of 8 an epoch."""
    return Tiny(device, hidden=8, lr=0.05)


def by_hand(epochs: int, clip: Any = None) -> tuple[nn.Module, list[torch.Tensor]]:
    """``mlp()``'s training written out, ``clip(parameters)`` before each step; with the
    values ``clip`` returned."""
    torch.manual_seed(0)
    module = build_module(4, 1, hidden=8)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.05)
    returned = []
    for _ in range(epochs):
        for x, y in make_data():
            nn.functional.mse_loss(module(x), y).backward()
            if clip is not None:
                returned.append(clip(list(module.parameters())))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return module, returned


def train(
    *packs: runmodel.Pack, epochs: int | None = 2, device: str = "cpu", **run: Any
) -> tuple[Tiny, runmodel.RunResult]:
    model, engine = mlp(device), runmodel.Engine()
    engine.attach(*packs)
    return model, engine.run(model, epochs=epochs, **run)


def seen_by_optimizer(engine: runmodel.Engine, kind: str) -> list[float]:
    """Record, just before the optimizer steps (inside every other override), the total
    norm (``kind="norm"``) or the largest absolute element (``"max"``) of the gradients of
    its parameters."""
    seen: list[float] = []

    def record(engine: Any, default: Any) -> None:
        grads = [p.grad for group in engine.model.optimizer.param_groups for p in group["params"]]
        seen.append(
            float(torch.nn.utils.get_total_norm(grads))
            if kind == "norm"
            else max(float(g.abs().max()) for g in grads)
        )
        default(engine)

    engine.override("optimizer_step", record, priority=-50)
    return seen


# -- construction ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args", [{}, {"max_norm": 1.0, "value": 1.0}, {"max_norm": None, "value": None}]
)
def test_exactly_one_of_max_norm_and_value(args: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"GradClip takes exactly one of max_norm= .* and value="):
        GradClip(**args)


@pytest.mark.parametrize("option", ["max_norm", "value"])
@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), True, "1", [1.0]])
def test_max_norm_and_value_must_be_positive_finite_numbers(option: str, bad: Any) -> None:
    with pytest.raises(ValueError, match=f"GradClip {option}= must be a number > 0, got"):
        GradClip(**{option: bad})


@pytest.mark.parametrize("bad", [0, -2, float("nan"), "inf", None])
def test_norm_type_must_be_a_positive_number(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"GradClip norm_type= must be a number > 0 \(or inf\)"):
        GradClip(max_norm=1.0, norm_type=bad)


def test_a_model_whose_train_step_is_its_own_is_refused_at_setup() -> None:
    engine = runmodel.Engine()
    engine.attach(GradClip(max_norm=1.0))
    with pytest.raises(
        TypeError,
        match="GradClip works in the optimizer_step phase, which "
        "Counting's train step does not fire",
    ):
        engine.run(Counting(), epochs=1)


# -- clipping -----------------------------------------------------------------------------


def test_max_norm_clips_the_total_norm_as_clip_grad_norm_does() -> None:
    model, engine = mlp(), runmodel.Engine()
    clip = GradClip(max_norm=0.5)
    engine.attach(clip)
    seen = seen_by_optimizer(engine, "norm")
    engine.run(model, epochs=2)
    reference, norms = by_hand(2, lambda ps: nn.utils.clip_grad_norm_(ps, 0.5))
    assert torch.equal(params(model), params(reference))
    assert all(n > 0.5 for n in norms)  # every step was clipped...
    assert all(n <= 0.5 * (1 + 1e-5) for n in seen)  # ...to the norm the optimizer saw
    assert clip.last_norm is not None and torch.equal(clip.last_norm, norms[-1])
    assert (params(by_hand(2)[0]) - params(model)).abs().max() > 1e-2


def test_norm_type_inf() -> None:
    model, _ = train(GradClip(max_norm=0.5, norm_type=float("inf")))
    reference, _ = by_hand(2, lambda ps: nn.utils.clip_grad_norm_(ps, 0.5, float("inf")))
    assert torch.equal(params(model), params(reference))


def test_value_clamps_each_element_as_clip_grad_value_does() -> None:
    model, engine = mlp(), runmodel.Engine()
    engine.attach(GradClip(value=0.1))
    seen = seen_by_optimizer(engine, "max")
    result = engine.run(model, epochs=2)
    reference, _ = by_hand(2, lambda ps: nn.utils.clip_grad_value_(ps, 0.1))
    assert torch.equal(params(model), params(reference))
    assert max(seen) == pytest.approx(0.1) and len(seen) == 8
    assert "grad_norm" not in result.metrics  # value clipping computes no norm


def test_grad_norm_is_the_mean_norm_before_clipping_per_epoch() -> None:
    norms_per_epoch: list[float] = []
    engine = runmodel.Engine()
    engine.attach(GradClip(max_norm=0.5))
    engine.on(
        "epoch_end", lambda e: norms_per_epoch.append(e.state.metrics["grad_norm"]), priority=-10
    )
    engine.run(mlp(), epochs=2)
    _, norms = by_hand(2, lambda ps: nn.utils.clip_grad_norm_(ps, 0.5))
    assert norms_per_epoch == pytest.approx(
        [float(torch.stack(norms[:4]).mean()), float(torch.stack(norms[4:]).mean())], rel=1e-6
    )


def test_non_finite_norms_are_left_out_of_grad_norm() -> None:
    engine = runmodel.Engine()
    engine.attach(GradClip(max_norm=0.5))

    @engine.on("backward", once=3)  # the epoch's last step: one gradient element inf
    def poison(engine: Any) -> None:
        engine.model.module[0].weight.grad[0, 0] = float("inf")

    result = engine.run(mlp(), epochs=1)
    _, norms = by_hand(1, lambda ps: nn.utils.clip_grad_norm_(ps, 0.5))
    assert result.metrics["grad_norm"] == pytest.approx(
        float(torch.stack(norms[:3]).mean()), rel=1e-6
    )


def test_the_replacement_of_the_optimizer_is_clipped() -> None:
    """GradClip reads model.optimizer each step: a new one over the last layer only is
    clipped over that layer's gradients."""
    engine = runmodel.Engine()
    engine.attach(GradClip(max_norm=0.5))
    seen = seen_by_optimizer(engine, "norm")

    @engine.on("epoch_start", once=1)
    def last_layer_only(engine: Any) -> None:
        engine.model.optimizer = torch.optim.SGD(engine.model.module[2].parameters(), lr=0.05)

    model = mlp()
    engine.run(model, epochs=2)
    assert len(seen) == 8 and all(n <= 0.5 * (1 + 1e-5) for n in seen)
    first = model.module[0].weight.grad  # not the new optimizer's: not clipped, not zeroed
    assert first is not None and float(first.norm()) > 1
    last = [p.grad for p in model.module[2].parameters()]
    assert last == [None, None]  # zeroed by the new optimizer's step


def test_eval_runs_are_untouched() -> None:
    _, result = train(GradClip(max_norm=0.5), mode="eval", epochs=1)
    assert result.steps == 4 and "grad_norm" not in result.metrics


# -- with a GradScaler ------------------------------------------------------------------------


def test_with_a_grad_scaler_the_gradients_are_unscaled_before_clipping() -> None:
    """ScaledAutocast (the amp backend's float16 pack) on the CPU with bfloat16: the loss
    is scaled by 65536; clipping must see, and keep, the true gradients."""
    amp = ScaledAutocast("cpu", torch.bfloat16)
    clip = GradClip(max_norm=0.5)
    scaled, scaled_result = train(amp, clip)
    unscaled, unscaled_result = train(Autocast("cpu", torch.bfloat16), GradClip(max_norm=0.5))
    assert amp.scaler.get_scale() == 65536.0 and amp.scaler.state_dict()["_growth_tracker"] == 8
    assert torch.equal(params(scaled), params(unscaled))
    assert scaled_result.metrics["grad_norm"] == unscaled_result.metrics["grad_norm"] < 100
    # clipping by value too
    by_value, _ = train(ScaledAutocast("cpu", torch.bfloat16), GradClip(value=0.1))
    by_value_unscaled, _ = train(Autocast("cpu", torch.bfloat16), GradClip(value=0.1))
    assert torch.equal(params(by_value), params(by_value_unscaled))


def test_with_the_amp_backend_on_the_device(device: str) -> None:
    """On CUDA: float16 and the backend's GradScaler; the norm recorded is the true one
    (close to float32's), not the scaled one."""
    model, result = train(GradClip(max_norm=0.5), device=device, backend="amp")
    reference, reference_result = train(GradClip(max_norm=0.5), device=device)
    assert torch.isfinite(params(model)).all()
    assert result.metrics["grad_norm"] == pytest.approx(
        reference_result.metrics["grad_norm"], rel=0.05
    )
    torch.testing.assert_close(params(model), params(reference), rtol=0, atol=0.05)

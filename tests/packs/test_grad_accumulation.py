"""The GradAccumulation pack: k micro-batches step like one k-times-larger batch (SGD and
Adam), the shorter last window of an epoch, resume, the true loss for hooks, and its
composition with GradClip and a GradScaler in any attach order.

``make_data(8, 2)`` and ``make_data(2, 8)`` hold the same 16 rows in the same order, so
``Tiny(batches=8, batch_size=2)`` accumulating over 4 steps must train like
``Tiny(batches=2, batch_size=8)`` without accumulation.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import runmodel
from runmodel.backends.amp import Autocast, ScaledAutocast
from runmodel.packs import Checkpoint
from runmodel.packs.grad_accumulation import GradAccumulation
from runmodel.packs.grad_clip import GradClip

from helpers import Tiny, assert_equal_params, build_module, make_data, params

OPTIMIZERS = [torch.optim.SGD, torch.optim.Adam]


def micro(
    optimizer: type[torch.optim.Optimizer] = torch.optim.Adam, batches: int = 8, device: str = "cpu"
) -> Tiny:
    """An MLP regression on ``batches`` batches of 2 rows."""
    return Tiny(device, hidden=8, batches=batches, batch_size=2, optimizer=optimizer, lr=0.05)


def steps_taken(model: Tiny) -> int:
    """How many times Adam stepped: its step count (each parameter's is the same)."""
    return int(model.optimizer.state[next(model.module.parameters())]["step"])


def by_hand(
    k: int,
    batches: int,
    epochs: int,
    max_norm: float | None = None,
    optimizer: type[torch.optim.Optimizer] = torch.optim.Adam,
) -> nn.Module:
    """``micro()``'s training written out: each loss / k, a step (after clipping the total
    norm to ``max_norm``) after every k-th batch of an epoch and after its last."""
    torch.manual_seed(0)
    module = build_module(4, 1, hidden=8)
    opt = optimizer(module.parameters(), lr=0.05)
    data = make_data(batches, 2)
    for _ in range(epochs):
        for i, (x, y) in enumerate(data):
            (nn.functional.mse_loss(module(x), y) / k).backward()
            if (i + 1) % k == 0 or i + 1 == len(data):
                if max_norm is not None:
                    nn.utils.clip_grad_norm_(module.parameters(), max_norm)
                opt.step()
                opt.zero_grad(set_to_none=True)
    return module


# -- construction -------------------------------------------------------------------------


@pytest.mark.parametrize("k", [0, -1, 1.5, 2.0, "4", True, None])
def test_k_must_be_a_whole_number_of_at_least_one(k: Any) -> None:
    with pytest.raises(ValueError, match=r"GradAccumulation\(k\): .* whole number >= 1; got"):
        GradAccumulation(k)


def test_k_one_changes_nothing() -> None:
    plain, accumulated = micro(), micro()
    runmodel.Engine().run(plain, epochs=2)
    engine = runmodel.Engine()
    engine.attach(GradAccumulation(1))
    engine.run(accumulated, epochs=2)
    assert_equal_params(plain, accumulated)


# -- k micro-batches are one big batch ----------------------------------------------------


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=["sgd", "adam"])
def test_k_micro_batches_step_like_one_k_times_larger_batch(
    optimizer: type[torch.optim.Optimizer],
) -> None:
    big = Tiny(hidden=8, batches=2, batch_size=8, optimizer=optimizer, lr=0.05)
    runmodel.Engine().run(big, epochs=3)  # 6 steps on batches of 8
    small = micro(optimizer)
    engine = runmodel.Engine()
    engine.attach(GradAccumulation(4))
    result = engine.run(small, epochs=3)  # 24 steps on batches of 2
    assert result.steps == 24
    torch.testing.assert_close(params(small), params(big), rtol=0, atol=1e-6)
    # and not by chance: without accumulation the same batches end elsewhere
    unaccumulated = micro(optimizer)
    runmodel.Engine().run(unaccumulated, epochs=3)
    assert (params(unaccumulated) - params(big)).abs().max() > 1e-2


def test_the_optimizer_steps_every_kth_step_and_zeroes_the_gradients_then() -> None:
    model, seen = micro(), []
    engine = runmodel.Engine()
    engine.attach(GradAccumulation(3))
    engine.on(
        "optimizer_step",
        lambda e: seen.append(
            (
                e.state.step,
                steps_taken(model) if model.optimizer.state else 0,
                model.module[0].weight.grad is None,
            )
        ),
    )
    engine.run(model, epochs=1)
    # optimizer_step hooks fire at every step; the optimizer stepped after steps 2 and 5
    # (and the gradients were zeroed then), then once more at the epoch's end
    assert seen == [
        (0, 0, False),
        (1, 0, False),
        (2, 1, True),
        (3, 1, False),
        (4, 1, False),
        (5, 2, True),
        (6, 2, False),
        (7, 2, False),
    ]
    assert steps_taken(model) == 3 and model.module[0].weight.grad is None


# -- an epoch that is not a multiple of k --------------------------------------------------


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=["sgd", "adam"])
def test_the_last_shorter_window_of_each_epoch_is_stepped(
    optimizer: type[torch.optim.Optimizer],
) -> None:
    model = micro(optimizer, batches=6)
    engine = runmodel.Engine()
    engine.attach(GradAccumulation(4))
    engine.run(model, epochs=2)  # windows of 4 and 2 steps in each epoch
    reference = by_hand(4, batches=6, epochs=2, optimizer=optimizer)
    torch.testing.assert_close(params(model), params(reference), rtol=0, atol=1e-6)
    if optimizer is torch.optim.Adam:
        assert steps_taken(model) == 4
    assert all(p.grad is None for p in model.module.parameters())  # nothing left over


def test_a_budget_that_ends_mid_window_steps_what_was_accumulated() -> None:
    model = micro(batches=6)
    engine = runmodel.Engine()
    engine.attach(GradAccumulation(4))
    result = engine.run(model, steps=9)  # epoch 0, then 3 steps of epoch 1
    assert (result.ended, result.steps) == ("budget", 9)
    assert steps_taken(model) == 3  # 4 + 2 in epoch 0, 3 (of 4) in epoch 1
    assert all(p.grad is None for p in model.module.parameters())


def test_a_window_restarts_with_each_epoch() -> None:
    # 5 batches an epoch, k=2: steps after batches 1, 3 and 4 of each epoch (not after
    # step 5, which a count over the whole run would give)
    model, stepped = micro(batches=5), []
    engine = runmodel.Engine()
    engine.attach(GradAccumulation(2))
    engine.on(
        "runstep", lambda e: stepped.append(steps_taken(model) if model.optimizer.state else 0)
    )
    engine.run(model, epochs=2)
    assert stepped == [0, 1, 1, 2, 2, 3, 4, 4, 5, 5]  # read before the epoch-end step
    assert steps_taken(model) == 6


# -- hooks, resume, eval ------------------------------------------------------------------


def test_hooks_see_the_true_loss() -> None:
    model, losses = micro(), []
    engine = runmodel.Engine()
    engine.attach(GradAccumulation(4))
    engine.on("forward", lambda e: losses.append(e.state.loss))
    engine.on("backward", lambda e: losses.append(e.state.loss))
    engine.on("runstep", lambda e: losses.append(e.state.loss))
    engine.run(model, steps=2)
    assert losses[0] is losses[1] is losses[2] and losses[3] is losses[4] is losses[5]


def test_a_resumed_run_continues_exactly(tmp_path: Path) -> None:
    straight = micro(batches=6)
    engine = runmodel.Engine()
    engine.attach(GradAccumulation(4))
    engine.run(straight, epochs=3)
    first = runmodel.Engine()
    first.attach(GradAccumulation(4), Checkpoint(tmp_path))
    first.run(micro(batches=6), epochs=1)
    resumed = micro(batches=6)
    second = runmodel.Engine()
    second.attach(GradAccumulation(4), Checkpoint(tmp_path))
    result = second.run(resumed, epochs=3, resume=tmp_path)
    assert (result.steps, result.epochs) == (18, 3)
    assert_equal_params(resumed, straight)
    assert steps_taken(resumed) == steps_taken(straight) == 6


def test_eval_runs_are_untouched() -> None:
    model = micro()
    engine = runmodel.Engine()
    engine.attach(GradAccumulation(3))
    result = engine.run(model, mode="eval")
    assert result.steps == 8 and "loss" in result.metrics


def test_a_model_whose_train_step_is_its_own_is_refused_at_setup() -> None:
    from helpers import Counting

    engine = runmodel.Engine()
    engine.attach(GradAccumulation(2))
    with pytest.raises(
        TypeError,
        match="GradAccumulation works in the backward and "
        "optimizer_step phases, which Counting's train step "
        "does not fire",
    ):
        engine.run(Counting(), epochs=1)


# -- with GradClip and a GradScaler, in any order --------------------------------------------


def test_with_grad_clip_in_either_order_clips_once_per_real_step() -> None:
    results = []
    for first_clip in (True, False):
        model = micro(batches=6)
        packs = [GradClip(max_norm=0.5), GradAccumulation(4)]
        engine = runmodel.Engine()
        engine.attach(*(packs if first_clip else packs[::-1]))
        engine.run(model, epochs=2)
        results.append(model)
    assert_equal_params(results[0], results[1])
    clipped = by_hand(4, batches=6, epochs=2, max_norm=0.5)
    torch.testing.assert_close(params(results[0]), params(clipped), rtol=0, atol=1e-6)
    assert (params(by_hand(4, batches=6, epochs=2)) - params(clipped)).abs().max() > 1e-2


def scaled(device: str = "cpu") -> ScaledAutocast:
    """The amp backend's float16 pack, on the CPU here with bfloat16 (the GradScaler works
    there too): autocast around forward, the loss scaled by 65536, scaler.step."""
    return ScaledAutocast(device, torch.bfloat16 if device == "cpu" else torch.float16)


def test_with_a_grad_scaler_the_scaler_steps_once_per_window_in_any_attach_order() -> None:
    results, trackers = [], []
    for order in itertools.permutations(range(3)):
        model, amp = micro(batches=6), scaled()
        packs = [amp, GradClip(max_norm=0.5), GradAccumulation(4)]
        engine = runmodel.Engine()
        engine.attach(*(packs[i] for i in order))
        engine.run(model, epochs=2)
        results.append(params(model))
        trackers.append(amp.scaler.state_dict())
    assert all(torch.equal(results[0], r) for r in results)
    # scaler.update() ran once per optimizer step (4), and no step overflowed
    assert all(t["_growth_tracker"] == 4 and t["scale"] == 65536.0 for t in trackers)
    # clipping saw the true gradients: the same as the same autocast without a scaler
    model = micro(batches=6)
    engine = runmodel.Engine()
    engine.attach(Autocast("cpu", torch.bfloat16), GradClip(max_norm=0.5), GradAccumulation(4))
    engine.run(model, epochs=2)
    assert torch.equal(params(model), results[0])


def test_with_the_amp_backend_on_the_device(device: str) -> None:
    """bfloat16 autocast without a scaler on the CPU; on CUDA float16 with the backend's
    GradScaler: clipping unscales, the scaler steps once per window (or skips a window
    that overflowed and halves its scale), and the order of attaching does not matter."""
    results, scalers = [], []
    for clip_first in (True, False):
        model = micro(device=device, batches=6)
        packs = [GradClip(max_norm=0.5), GradAccumulation(4)]
        engine = runmodel.Engine()
        engine.attach(*(packs if clip_first else packs[::-1]))
        engine.on("setup", lambda e: scalers.append(e.state.grad_scaler), priority=-10)
        result = engine.run(model, epochs=2, backend="amp")
        assert torch.isfinite(params(model)).all()
        assert result.metrics["grad_norm"] > 0
        results.append(params(model))
        scaler = scalers[-1]
        if device == "cuda":
            assert scaler is not None
            skipped = round(torch.log2(torch.tensor(65536.0 / scaler.get_scale())).item())
            assert steps_taken(model) + skipped == 4
        else:
            assert scaler is None and steps_taken(model) == 4
    assert torch.equal(results[0], results[1])

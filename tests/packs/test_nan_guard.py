"""The NaNGuard pack: a non-finite loss or gradient skips the step or stops the run, so
the weights (and the checkpoints) stay finite; every=N; with a GradScaler; with
GradAccumulation and GradClip in any order; its count across a resume; bad arguments.

NaNs come from real hooks: ``nan_loss_at`` makes a step's inputs NaN (so its loss and
gradients are NaN), ``nan_grad_at`` adds ``0 * sqrt(w - w)`` to a step's loss, which
leaves the loss finite and makes the gradient of the first layer's weight NaN.
"""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import runmodel
from runmodel.backends.amp import ScaledAutocast
from runmodel.checkpoint import checkpoints_in
from runmodel.packs import Checkpoint
from runmodel.packs.grad_accumulation import GradAccumulation
from runmodel.packs.grad_clip import GradClip
from runmodel.packs.nan_guard import NaNGuard

from helpers import Counting, Tiny, assert_equal_params, build_module, files, make_data, params

OPTIMIZERS = [torch.optim.SGD, torch.optim.Adam]
NAN = float("nan")


def mlp(
    optimizer: type[torch.optim.Optimizer] = torch.optim.SGD, batches: int = 4, device: str = "cpu"
) -> Tiny:
    """An MLP regression on ``batches`` batches of 8 an epoch."""
    return Tiny(device, hidden=8, batches=batches, optimizer=optimizer, lr=0.05)


def nan_loss_at(engine: runmodel.Engine, step: int) -> None:
    """Step ``step``'s inputs NaN: its loss and gradients are NaN."""

    @engine.on("step_start", once=step)
    def poison_inputs(engine: Any) -> None:
        x, y = engine.state.batch
        engine.state.batch = (torch.full_like(x, NAN), y)


def nan_grad_at(engine: runmodel.Engine, step: int) -> None:
    """Step ``step``'s loss plus ``0 * sqrt(w - w)``: the same (finite) loss, and the
    gradient of the first layer's weight NaN (0 times the infinite slope of sqrt at 0)."""

    @engine.on("forward", once=step)
    def poison_gradient(engine: Any) -> None:
        w = engine.model.module[0].weight
        engine.state.loss = engine.state.loss + 0 * torch.sqrt(w - w.detach()).sum()


def by_hand(
    epochs: int,
    batches: int = 4,
    optimizer: type[torch.optim.Optimizer] = torch.optim.SGD,
    drop: tuple[int, ...] = (),
    k: int = 1,
) -> nn.Module:
    """``mlp()``'s training written out, without the steps in ``drop`` (run-wide step
    indices); with ``k``, each loss / k and a step every k-th batch of an epoch."""
    torch.manual_seed(0)
    module = build_module(4, 1, hidden=8)
    opt = optimizer(module.parameters(), lr=0.05)
    data, step = make_data(batches, 8), 0
    for _ in range(epochs):
        for i, (x, y) in enumerate(data):
            if step not in drop:
                (nn.functional.mse_loss(module(x), y) / k).backward()
            step += 1
            if (i + 1) % k == 0 or i + 1 == len(data):
                opt.step()  # skips parameters without a gradient: all, in a dropped window
                opt.zero_grad(set_to_none=True)
    return module


def steps_taken(model: Tiny) -> int:
    """How many times Adam stepped: its step count."""
    return int(model.optimizer.state[next(model.module.parameters())]["step"])


def finite(model: Tiny | dict[str, torch.Tensor]) -> bool:
    values = model.values() if isinstance(model, dict) else model.module.parameters()
    return all(bool(torch.isfinite(v).all()) for v in values)


# -- construction ---------------------------------------------------------------------------


@pytest.mark.parametrize("action", ["ignore", "Skip", None, 1, ""])
def test_action_must_be_skip_or_stop(action: Any) -> None:
    with pytest.raises(ValueError, match=r"NaNGuard action= must be 'skip' .* or 'stop'"):
        NaNGuard(action)


@pytest.mark.parametrize("every", [0, -1, 1.5, "2", True, None])
def test_every_must_be_a_whole_number_of_at_least_one(every: Any) -> None:
    with pytest.raises(ValueError, match="NaNGuard every= must be a whole number >= 1"):
        NaNGuard(every=every)


def test_a_model_whose_train_step_is_its_own_is_refused_at_setup() -> None:
    engine = runmodel.Engine()
    engine.attach(NaNGuard())
    with pytest.raises(
        TypeError,
        match="NaNGuard works in the backward and optimizer_step "
        "phases, which Counting's train step does not fire",
    ):
        engine.run(Counting(), epochs=1)


# -- skip ------------------------------------------------------------------------------------


def test_without_a_guard_the_injected_nan_reaches_the_weights() -> None:
    model, engine = mlp(), runmodel.Engine()
    nan_loss_at(engine, 5)
    engine.run(model, epochs=3)
    assert not finite(model)


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=["sgd", "adam"])
def test_skip_leaves_the_bad_step_out_and_goes_on(optimizer: type[torch.optim.Optimizer]) -> None:
    model, engine, guard = mlp(optimizer), runmodel.Engine(), NaNGuard("skip")
    engine.attach(guard)
    nan_loss_at(engine, 5)
    with pytest.warns(
        RuntimeWarning,
        match=r"^NaNGuard: non-finite loss at step 5 \(epoch 1, "
        r"batch 1\): the step is skipped; later skips",
    ):
        result = engine.run(model, epochs=3)
    assert (result.ended, result.steps, result.metrics["nan_skipped"]) == ("completed", 12, 1)
    assert guard.skipped == 1
    assert guard.last == "NaNGuard: non-finite loss at step 5 (epoch 1, batch 1)"
    # exactly as if batch 1 of epoch 1 had not been there (Adam: not counted as a step)
    torch.testing.assert_close(
        params(model), params(by_hand(3, optimizer=optimizer, drop=(5,))), rtol=0, atol=1e-7
    )
    if optimizer is torch.optim.Adam:
        assert steps_taken(model) == 11


def test_skip_warns_once_per_run_and_counts_every_skip() -> None:
    model, engine, guard = mlp(), runmodel.Engine(), NaNGuard()
    engine.attach(guard)
    nan_loss_at(engine, 1)
    nan_grad_at(engine, 6)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = engine.run(model, epochs=2)
    assert [str(w.message) for w in caught] == [
        "NaNGuard: non-finite loss at step 1 (epoch 0, batch 1): the step is skipped; later "
        "skips are counted in metrics['nan_skipped'] without a warning"
    ]
    assert guard.skipped == result.metrics["nan_skipped"] == 2
    assert guard.last == "NaNGuard: non-finite gradient of '0.weight' at step 6 (epoch 1, batch 2)"
    torch.testing.assert_close(params(model), params(by_hand(2, drop=(1, 6))), rtol=0, atol=1e-7)


# -- stop ------------------------------------------------------------------------------------


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=["sgd", "adam"])
def test_stop_ends_the_run_naming_the_step_and_the_batch(
    optimizer: type[torch.optim.Optimizer],
) -> None:
    model, engine = mlp(optimizer, batches=12), runmodel.Engine()
    engine.attach(NaNGuard("stop"))
    nan_loss_at(engine, 17)
    result = engine.run(model, epochs=3)
    assert (result.ended, result.steps) == ("stopped", 18)
    assert result.reason == "NaNGuard: non-finite loss at step 17 (epoch 1, batch 5)"
    before = mlp(optimizer, batches=12)  # the weights and optimizer after 17 good steps
    runmodel.Engine().run(before, steps=17)
    assert_equal_params(model, before)
    if optimizer is torch.optim.Adam:
        assert steps_taken(model) == 17


def test_stop_on_a_gradient_names_the_parameter() -> None:
    model, engine = mlp(), runmodel.Engine()
    engine.attach(NaNGuard("stop"))
    nan_grad_at(engine, 2)
    result = engine.run(model, epochs=2)
    assert (
        result.reason == "NaNGuard: non-finite gradient of '0.weight' at step 2 (epoch 0, batch 2)"
    )
    assert finite(model) and result.steps == 3


def test_stop_keeps_the_last_checkpoint_good_and_resuming_from_it_works(tmp_path: Path) -> None:
    engine = runmodel.Engine()
    engine.attach(NaNGuard("stop"), Checkpoint(tmp_path, every="1ep", keep=None))
    nan_loss_at(engine, 6)  # epoch 1, batch 2
    result = engine.run(mlp(torch.optim.Adam), epochs=3)
    assert result.ended == "stopped"
    # the epoch the guard cut short was saved where it stopped: after the bad step
    assert files(tmp_path) == ["ckpt-00001-0000000004.pt", "ckpt-00001-0000000007.pt"]
    newest = torch.load(checkpoints_in(tmp_path)[0], weights_only=True)
    assert finite(newest["model"]["module"])
    before = mlp(torch.optim.Adam)
    runmodel.Engine().run(before, steps=6)
    assert_equal_params(before, _load(newest))
    resumed, engine = mlp(torch.optim.Adam), runmodel.Engine()
    engine.attach(NaNGuard("stop"), Checkpoint(tmp_path, every="1ep", keep=None))
    result = engine.run(resumed, epochs=3, resume=tmp_path)
    assert (result.ended, result.epochs) == ("completed", 3) and finite(resumed)


def _load(checkpoint: dict[str, Any]) -> Tiny:
    model = mlp(torch.optim.Adam)
    model.module.load_state_dict(checkpoint["model"]["module"])
    return model


def test_skip_keeps_every_checkpoint_good(tmp_path: Path) -> None:
    engine = runmodel.Engine()
    engine.attach(NaNGuard(), Checkpoint(tmp_path, every="1st", keep=None))
    nan_loss_at(engine, 2)
    nan_grad_at(engine, 5)
    with pytest.warns(RuntimeWarning):
        engine.run(mlp(torch.optim.Adam), epochs=2)
    saved = checkpoints_in(tmp_path)
    assert len(saved) == 8
    assert all(finite(torch.load(p, weights_only=True)["model"]["module"]) for p in saved)


# -- every= ----------------------------------------------------------------------------------


def test_every_checks_only_every_nth_step() -> None:
    # every=2 checks steps 1, 3, 5, 7: a NaN at step 3 is caught...
    caught, engine = mlp(), runmodel.Engine()
    engine.attach(NaNGuard("stop", every=2))
    nan_loss_at(engine, 3)
    assert engine.run(caught, epochs=2).reason == (
        "NaNGuard: non-finite loss at step 3 (epoch 0, batch 3)"
    )
    assert finite(caught)
    # ...at step 2 it goes through, and the next check finds the weights NaN already
    missed, engine = mlp(), runmodel.Engine()
    engine.attach(NaNGuard("stop", every=2))
    nan_loss_at(engine, 2)
    assert engine.run(missed, epochs=2).reason == (
        "NaNGuard: non-finite loss at step 3 (epoch 0, batch 3)"
    )
    assert not finite(missed)


# -- with a GradScaler, GradAccumulation and GradClip -----------------------------------------


def test_with_a_grad_scaler_only_the_loss_is_checked() -> None:
    """ScaledAutocast (the amp backend's float16 pack) on the CPU with bfloat16: a NaN
    gradient is the GradScaler's to skip (it halves its scale); a NaN loss is the guard's
    (the scaler never sees that step)."""
    model, engine, guard = mlp(torch.optim.Adam), runmodel.Engine(), NaNGuard()
    amp = ScaledAutocast("cpu", torch.bfloat16)
    engine.attach(guard, amp)
    nan_grad_at(engine, 2)
    engine.run(model, epochs=2)
    assert guard.skipped == 0 and amp.scaler.get_scale() == 32768.0
    assert steps_taken(model) == 7 and finite(model)

    model, engine, guard = mlp(torch.optim.Adam), runmodel.Engine(), NaNGuard()
    amp = ScaledAutocast("cpu", torch.bfloat16)
    engine.attach(guard, amp)
    nan_loss_at(engine, 2)
    with pytest.warns(RuntimeWarning, match="non-finite loss at step 2"):
        engine.run(model, epochs=2)
    assert guard.skipped == 1 and amp.scaler.get_scale() == 65536.0
    assert amp.scaler.state_dict()["_growth_tracker"] == 7  # update() skipped with the step
    assert steps_taken(model) == 7 and finite(model)


def test_with_grad_accumulation_a_bad_step_drops_its_window() -> None:
    model, engine, guard = mlp(torch.optim.Adam, batches=8), runmodel.Engine(), NaNGuard()
    engine.attach(guard, GradAccumulation(4))
    nan_loss_at(engine, 5)  # the second window of epoch 0: steps 4 to 7
    with pytest.warns(RuntimeWarning):
        engine.run(model, epochs=2)
    assert guard.skipped == 1 and steps_taken(model) == 3
    reference = by_hand(2, batches=8, optimizer=torch.optim.Adam, drop=(4, 5, 6, 7), k=4)
    torch.testing.assert_close(params(model), params(reference), rtol=0, atol=1e-6)


def test_with_grad_accumulation_stop_mid_window_takes_no_step_at_the_epoch_end() -> None:
    model, engine = mlp(torch.optim.Adam, batches=8), runmodel.Engine()
    engine.attach(NaNGuard("stop"), GradAccumulation(4))
    nan_grad_at(engine, 5)
    result = engine.run(model, epochs=2)
    assert (
        result.reason == "NaNGuard: non-finite gradient of '0.weight' at step 5 (epoch 0, batch 5)"
    )
    assert steps_taken(model) == 1 and finite(model)
    assert all(p.grad is None for p in model.module.parameters())
    reference = by_hand(1, batches=8, optimizer=torch.optim.Adam, drop=(4, 5, 6, 7), k=4)
    torch.testing.assert_close(params(model), params(reference), rtol=0, atol=1e-6)


def test_with_grad_accumulation_a_later_check_finds_an_unchecked_steps_gradient() -> None:
    # every=2 checks steps 1, 3, 5, 7; step 4's NaN gradient is in the window's
    # accumulated gradient when step 5 is checked
    model, engine = mlp(torch.optim.Adam, batches=8), runmodel.Engine()
    engine.attach(NaNGuard("stop", every=2), GradAccumulation(4))
    nan_grad_at(engine, 4)
    result = engine.run(model, epochs=2)
    assert (
        result.reason == "NaNGuard: non-finite gradient of '0.weight' at step 5 (epoch 0, batch 5)"
    )
    assert steps_taken(model) == 1 and finite(model)


def test_with_accumulation_clipping_and_a_scaler_in_any_attach_order() -> None:
    results = []
    for order in itertools.permutations(range(4)):
        model, engine, guard = mlp(torch.optim.Adam, batches=8), runmodel.Engine(), NaNGuard()
        packs = [
            guard,
            GradAccumulation(4),
            GradClip(max_norm=0.5),
            ScaledAutocast("cpu", torch.bfloat16),
        ]
        engine.attach(*(packs[i] for i in order))
        nan_loss_at(engine, 9)
        with pytest.warns(RuntimeWarning):
            engine.run(model, epochs=2)
        assert guard.skipped == 1 and steps_taken(model) == 3
        results.append(params(model))
    assert all(torch.equal(results[0], r) for r in results)


def test_on_the_device_with_the_amp_backend(device: str) -> None:
    model, engine, guard = mlp(torch.optim.Adam, device=device), runmodel.Engine(), NaNGuard()
    engine.attach(guard)
    nan_loss_at(engine, 2)
    with pytest.warns(RuntimeWarning, match="non-finite loss at step 2"):
        engine.run(model, epochs=2, backend="amp")
    assert guard.skipped == 1 and finite(model)


# -- resume, eval ------------------------------------------------------------------------------


def test_the_count_continues_after_a_resume(tmp_path: Path) -> None:
    engine, guard = runmodel.Engine(), NaNGuard()
    engine.attach(guard, Checkpoint(tmp_path))
    nan_loss_at(engine, 1)
    with pytest.warns(RuntimeWarning):
        engine.run(mlp(), epochs=1)
    state = torch.load(checkpoints_in(tmp_path)[0], weights_only=True)
    assert state["engine"]["packs"]["nan_guard"] == {"skipped": 1, "last": guard.last}
    engine, guard = runmodel.Engine(), NaNGuard()
    engine.attach(guard, Checkpoint(tmp_path))
    nan_loss_at(engine, 6)
    with pytest.warns(RuntimeWarning, match="at step 6"):
        result = engine.run(mlp(), epochs=2, resume=tmp_path)
    assert guard.skipped == result.metrics["nan_skipped"] == 2


def test_eval_runs_are_unchecked() -> None:
    engine = runmodel.Engine()
    engine.attach(NaNGuard("stop"))
    nan_loss_at(engine, 1)
    result = engine.run(mlp(), mode="eval")
    assert (result.ended, result.steps) == ("completed", 4)
    assert "nan_skipped" not in result.metrics

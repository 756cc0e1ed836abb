"""The LRSchedule pack: torch schedulers stepped by the run, warm-up, the lr in
state.metrics and TensorBoard, resume, and how it composes with Unfreeze and Evaluate.

The model (``helpers.Tiny``) is a linear regression on 4 fixed batches an epoch, trained
with SGD(lr=0.1) unless a test says otherwise. ``lrs_used`` records the learning rate of
group 0 at the start of every step: the one its optimizer step uses.
"""

from __future__ import annotations

import functools
import math
import tomllib
from pathlib import Path
from typing import Any

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn
from torch.optim import lr_scheduler

import runmodel
from runmodel.packs import Checkpoint, TensorBoard
from runmodel.packs.evaluate import Evaluate
from runmodel.packs.grad_accumulation import GradAccumulation
from runmodel.packs.lr_schedule import LRSchedule
from runmodel.packs.unfreeze import Unfreeze

from helpers import Tiny, assert_equal_params, make_data, params


def lrs_used(engine: runmodel.Engine, group: int = 0) -> list[float]:
    used: list[float] = []
    engine.on("step_start", lambda e: used.append(e.model.optimizer.param_groups[group]["lr"]))
    return used


def train(
    *packs: runmodel.Pack,
    epochs: int = 2,
    model: Any = None,
    resume: Any = None,
    stop_after_epoch: int | None = None,
) -> tuple[list[float], runmodel.RunResult, Any]:
    model = model if model is not None else Tiny()
    engine = runmodel.Engine()
    engine.attach(*packs)
    used = lrs_used(engine)
    if stop_after_epoch is not None:  # an interrupted run
        engine.on(
            "epoch_end", lambda e: e.stop() if e.state.epoch + 1 == stop_after_epoch else None
        )
    result = engine.run(model, epochs=epochs, resume=resume)
    return used, result, model


# -- stepping ----------------------------------------------------------------------------------


def test_a_factory_is_stepped_after_every_step() -> None:
    pack = LRSchedule(lambda opt: lr_scheduler.StepLR(opt, step_size=3, gamma=0.5))
    used, result, model = train(pack)
    assert used == [0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025]
    # the lr the next step would use: 8 steps done, 8 // 3 = 2 halvings
    assert result.metrics["lr"] == 0.025 == model.optimizer.param_groups[0]["lr"]
    assert type(result.metrics["lr"]) is float
    assert pack.state_dict()["scheduler"]["last_epoch"] == 8


def test_interval_epoch_steps_at_each_epoch_end() -> None:
    used, result, _ = train(
        LRSchedule(lambda opt: lr_scheduler.ExponentialLR(opt, gamma=0.5), interval="epoch"),
        epochs=3,
    )
    assert used == [0.1] * 4 + [0.05] * 4 + [0.025] * 4
    assert result.metrics["lr"] == 0.025  # the rate the last epoch trained with


def test_interval_epoch_shows_each_epoch_the_rate_it_trained_with() -> None:
    engine = runmodel.Engine()
    engine.attach(
        LRSchedule(lambda opt: lr_scheduler.ExponentialLR(opt, gamma=0.5), interval="epoch")
    )
    shown: list[float] = []
    engine.on("epoch_end", lambda e: shown.append(e.state.metrics["lr"]), priority=-1000)
    model = Tiny()
    engine.run(model, epochs=3)
    assert shown == [0.1, 0.05, 0.025]  # after the scheduler's step (-150) too
    assert model.optimizer.param_groups[0]["lr"] == 0.0125  # what a next epoch would use


def test_an_epoch_cut_short_does_not_step_an_epoch_scheduler() -> None:
    engine = runmodel.Engine()
    engine.attach(
        LRSchedule(lambda opt: lr_scheduler.ExponentialLR(opt, gamma=0.5), interval="epoch")
    )
    model = Tiny()
    result = engine.run(model, steps=6)  # epoch 0, and half of epoch 1
    assert result.ended == "budget"
    assert model.optimizer.param_groups[0]["lr"] == 0.05  # one step, for the full epoch


def test_a_scheduler_named_as_in_a_config() -> None:
    by_factory, _, _ = train(LRSchedule(lambda opt: lr_scheduler.StepLR(opt, step_size=2)))
    by_spec, _, _ = train(LRSchedule({"type": "StepLR", "args": {"step_size": 2}}))
    by_snake_case, _, _ = train(LRSchedule({"type": "step_lr", "args": {"step_size": 2}}))
    from_toml = tomllib.loads(
        'scheduler = { type = "StepLR", args = { step_size = 2 } }\ninterval = "step"'
    )
    by_toml, _, _ = train(LRSchedule(**from_toml))
    assert by_factory == by_spec == by_snake_case == by_toml
    assert by_factory == pytest.approx([0.1, 0.1, 0.01, 0.01, 1e-3, 1e-3, 1e-4, 1e-4])
    by_name, _, _ = train(LRSchedule("constant_lr"))  # a name alone: the defaults
    assert by_name == pytest.approx([0.1 / 3] * 5 + [0.1] * 3)


def test_an_instance_for_the_models_own_optimizer() -> None:
    torch.manual_seed(0)
    module = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    model = runmodel.TorchModel.from_parts(
        module, optimizer=optimizer, loss_fn=nn.MSELoss(), train_data=make_data(), device="cpu"
    )
    pack = LRSchedule(lr_scheduler.LinearLR(optimizer, start_factor=0.5, total_iters=2))
    used, _, _ = train(pack, epochs=1, model=model)
    assert used == pytest.approx([0.05, 0.075, 0.1, 0.1])
    assert pack.scheduler is not None and pack.scheduler.optimizer is optimizer


class OwnStep(runmodel.Supervised):
    def train_step(self, model: Any, batch: Any) -> dict[str, Any]:
        return super().train_step(model, batch)  # its own: no optimizer_step phase


def test_a_train_step_of_the_models_own_steps_the_scheduler_after_each_step() -> None:
    model = Tiny()
    model.interface = OwnStep()
    pack = LRSchedule(lambda opt: lr_scheduler.StepLR(opt, step_size=3, gamma=0.5))
    used, _, _ = train(pack, model=model)
    assert used == [0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025]
    assert pack.optimizer_steps == 8


def test_with_grad_accumulation_it_counts_optimizer_steps() -> None:
    pack = LRSchedule(lambda opt: lr_scheduler.StepLR(opt, step_size=1, gamma=0.5), warmup_steps=3)
    used, _, _ = train(GradAccumulation(2), pack)
    # 4 optimizer steps, each for 2 steps (micro-batches); the warm-up is 3 of them
    per_optimizer_step = [0.1 * 0.5**k * min(1.0, (k + 1) / 3) for k in range(4)]
    assert used == pytest.approx([lr for lr in per_optimizer_step for _ in range(2)], rel=1e-12)
    assert pack.optimizer_steps == 4
    assert pack.state_dict()["scheduler"]["last_epoch"] == 4


# -- warm-up -------------------------------------------------------------------------------------


def test_warmup_alone_rises_linearly_to_the_lr() -> None:
    used, result, _ = train(LRSchedule(warmup_steps=4), epochs=2)
    assert used == [0.1 * ((k + 1) / 4) for k in range(4)] + [0.1] * 4
    assert used[0] == pytest.approx(0.025) and used[3] == 0.1
    assert result.metrics["lr"] == 0.1


def test_warmup_scales_the_scheduled_lr_without_compounding() -> None:
    # StepLR reads the group's lr at each step: the warm-up must not leak into it
    pack = LRSchedule(lambda opt: lr_scheduler.StepLR(opt, step_size=2, gamma=0.5), warmup_steps=3)
    used, _, _ = train(pack)
    expected = [0.1 * 0.5 ** (k // 2) * min(1.0, (k + 1) / 3) for k in range(8)]
    assert used == pytest.approx(expected, rel=1e-12)
    assert used[3:] == [0.05, 0.025, 0.025, 0.0125, 0.0125]


def test_warmup_with_an_epoch_scheduler() -> None:
    pack = LRSchedule(
        lambda opt: lr_scheduler.ExponentialLR(opt, gamma=0.5), interval="epoch", warmup_steps=6
    )
    used, _, _ = train(pack, epochs=3)
    scheduled = [0.1] * 4 + [0.05] * 4 + [0.025] * 4
    assert used == pytest.approx(
        [lr * min(1.0, (k + 1) / 6) for k, lr in enumerate(scheduled)], rel=1e-12
    )


# -- with other packs ----------------------------------------------------------------------------


def test_plateau_reads_the_eval_metric_evaluate_puts_there() -> None:
    # mode="max" on a falling loss: every epoch after the first is "worse", so with
    # patience=0 the lr halves at the end of epochs 1 and 2
    pack = LRSchedule(
        lambda opt: lr_scheduler.ReduceLROnPlateau(opt, mode="max", factor=0.5, patience=0),
        interval="epoch",
        metric="eval_loss",
    )
    losses: list[float] = []
    engine = runmodel.Engine()
    engine.attach(pack, Evaluate())  # attached after it: the order comes from the options
    engine.on("epoch_end", lambda e: losses.append(e.state.metrics["eval_loss"]), priority=-10)
    used = lrs_used(engine)
    engine.run(Tiny(), epochs=4)
    assert losses == sorted(losses, reverse=True) and len(set(losses)) == 4
    assert used == [0.1] * 8 + [0.05] * 4 + [0.025] * 4


def test_a_missing_metric_fails_at_the_first_epoch_end_naming_the_metrics() -> None:
    pack = LRSchedule(
        lambda opt: lr_scheduler.ReduceLROnPlateau(opt), interval="epoch", metric="val_score"
    )  # undeclared, and close to no declared name
    engine = runmodel.Engine()
    engine.attach(pack, Evaluate())
    steps = lrs_used(engine)
    with pytest.raises(ValueError) as caught:
        engine.run(Tiny(), epochs=3)
    assert str(caught.value) == (
        "LRSchedule(metric='val_score'): no metric 'val_score' in state.metrics at the end of "
        "epoch 0. There are: eval_loss, lr (attach Evaluate() for eval_loss and the other "
        "eval_ metrics; a hook that puts a metric there can declare it with writes=)"
    )
    assert len(steps) == 4


def test_a_misspelt_metric_stops_the_run_at_setup() -> None:
    pack = LRSchedule(
        lambda opt: lr_scheduler.ReduceLROnPlateau(opt), interval="epoch", metric="eval_los"
    )
    engine = runmodel.Engine()
    engine.attach(pack, Evaluate())
    steps = lrs_used(engine)
    with pytest.raises(
        ValueError,
        match=r"^LRSchedule reads the metric 'eval_los', .* Did you "
        r"mean 'eval_loss' \(written by Evaluate\)\?",
    ):
        engine.run(Tiny(), epochs=3)
    assert steps == []


def test_with_unfreeze_each_stage_keeps_its_scale() -> None:
    model = Tiny(hidden=8)  # Sequential: "0" (Linear), "1" (ReLU), "2" (Linear)
    engine = runmodel.Engine()
    # attached first, still built after Unfreeze regrouped the optimizer
    engine.attach(
        LRSchedule(lambda opt: lr_scheduler.ExponentialLR(opt, gamma=0.5), interval="epoch"),
        Unfreeze({0: ["2"], 1: "all"}, lr_scale={1: 0.1}),
    )
    seen: list[float] = []
    engine.on("epoch_start", lambda e: seen.extend(g["lr"] for g in e.model.optimizer.param_groups))
    engine.run(model, epochs=3)
    assert seen == pytest.approx([0.1, 0.01, 0.05, 0.005, 0.025, 0.0025], rel=1e-12)


def test_tensorboard_logs_the_lr_as_train_lr(tmp_path: Path) -> None:
    engine = runmodel.Engine()
    engine.attach(
        LRSchedule(lambda opt: lr_scheduler.ExponentialLR(opt, gamma=0.5), interval="epoch"),
        TensorBoard(tmp_path),
    )
    engine.run(Tiny(), epochs=3)
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    logged = {
        tag: [(s.step, s.value) for s in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }
    as_f32 = [torch.tensor(v, dtype=torch.float32).item() for v in (0.1, 0.05, 0.025)]
    # each epoch's lr, as the optimizer's group shows it at the same moment
    assert logged["train/lr"] == list(zip((4, 8, 12), as_f32, strict=True))
    assert logged["lr/group0"] == logged["train/lr"]


# -- resume ---------------------------------------------------------------------------------------


def cosine_with_warmup() -> list[runmodel.Pack]:
    return [LRSchedule(lambda opt: lr_scheduler.CosineAnnealingLR(opt, T_max=12), warmup_steps=6)]


def one_cycle() -> list[runmodel.Pack]:
    return [LRSchedule(lambda opt: lr_scheduler.OneCycleLR(opt, max_lr=0.2, total_steps=16))]


def halving_per_epoch() -> list[runmodel.Pack]:
    return [
        LRSchedule(
            lambda opt: lr_scheduler.StepLR(opt, step_size=1, gamma=0.5),
            interval="epoch",
            warmup_steps=3,
        )
    ]


def plateau() -> list[runmodel.Pack]:
    return [
        LRSchedule(
            lambda opt: lr_scheduler.ReduceLROnPlateau(opt, mode="max", factor=0.5, patience=1),
            interval="epoch",
            metric="eval_loss",
        ),
        Evaluate(),
    ]


def accumulated() -> list[runmodel.Pack]:
    # optimizer steps after the 3rd and the 4th step of each epoch (a short last window)
    return [
        GradAccumulation(3),
        LRSchedule(lambda opt: lr_scheduler.StepLR(opt, step_size=1, gamma=0.8), warmup_steps=3),
    ]


@pytest.mark.parametrize(
    "packs", [cosine_with_warmup, one_cycle, halving_per_epoch, plateau, accumulated]
)
def test_a_resumed_run_continues_the_lr_curve_exactly(tmp_path: Path, packs: Any) -> None:
    def model() -> Tiny:
        return Tiny(hidden=8, optimizer=torch.optim.Adam, lr=0.01)

    straight_lrs, straight_result, straight = train(*packs(), epochs=4, model=model())
    first_lrs, _, _ = train(
        *packs(), Checkpoint(tmp_path), epochs=4, model=model(), stop_after_epoch=2
    )
    second_lrs, result, resumed = train(
        *packs(), Checkpoint(tmp_path / "again"), epochs=4, model=model(), resume=tmp_path
    )
    assert len(straight_lrs) == 16 and len(set(straight_lrs)) > 1
    assert first_lrs + second_lrs == straight_lrs  # exactly
    assert result.metrics["lr"] == straight_result.metrics["lr"]
    assert_equal_params(resumed, straight)


def test_extending_a_run_whose_schedule_spans_its_length_is_refused(tmp_path: Path) -> None:
    train(*cosine_with_warmup(), Checkpoint(tmp_path), epochs=2)
    steps: list[int] = []
    engine = runmodel.Engine()
    engine.attach(*cosine_with_warmup(), Checkpoint(tmp_path))
    engine.on("runstep", lambda e: steps.append(e.state.step))
    with pytest.raises(
        ValueError,
        match=r"extends the run it continues \(epochs 2 -> 4\), and "
        r"its learning rate schedule CosineAnnealingLR is laid "
        r"out over the run's total length",
    ):
        engine.run(Tiny(), epochs=4, resume="auto")
    assert steps == []
    train(*halving_per_epoch(), Checkpoint(tmp_path / "b"), epochs=2)
    more, result, _ = train(
        *halving_per_epoch(), Checkpoint(tmp_path / "b"), epochs=3, resume=tmp_path / "b"
    )  # a step schedule extends
    assert len(more) == 4 and result.epochs == 3


# -- mistakes --------------------------------------------------------------------------------------


def step_lr(opt: torch.optim.Optimizer) -> lr_scheduler.StepLR:
    return lr_scheduler.StepLR(opt, step_size=2)


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (
            {"scheduler": step_lr, "interval": "steps"},
            ValueError,
            r"interval=\) must be 'step' .* or 'epoch' .*; got 'steps'. Did you mean 'step'\?",
        ),
        (
            {"scheduler": step_lr, "warmup_steps": -1},
            ValueError,
            r"warmup_steps=\) must be a whole",
        ),
        (
            {"scheduler": step_lr, "warmup_steps": 1.5},
            ValueError,
            r"warmup_steps=\) must be a whole",
        ),
        ({}, ValueError, r"needs a scheduler, warmup_steps= or both"),
        ({"scheduler": 42}, TypeError, r"takes a torch.optim.lr_scheduler scheduler, a factory"),
        (
            {"scheduler": "StepLRR"},
            ValueError,
            r"no torch.optim.lr_scheduler scheduler named "
            r"'StepLRR'.*Did you mean 'StepLR'\?",
        ),
        ({"scheduler": "LambdaLR"}, ValueError, r"take Python functions: pass a factory"),
        ({"scheduler": "StepLR"}, TypeError, r"StepLR\(optimizer, \*\*\{\}\) fails: .*step_size"),
        (
            {"scheduler": {"type": "StepLR", "args": {"step_size": 2, "gama": 0.5}}},
            TypeError,
            r"StepLR\(optimizer, .*\) fails: .*'gama'",
        ),
        ({"scheduler": {"kind": "StepLR"}}, TypeError, r"a scheduler spec is \{'type'"),
        ({"scheduler": step_lr, "metric": ""}, TypeError, r"metric=\) names a metric"),
    ],
)
def test_bad_options_fail_at_construction(args: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match) as caught:
        LRSchedule(**args)
    assert "\n" not in str(caught.value)


def test_plateau_and_metric_are_checked_together() -> None:
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(
        ValueError,
        match=r"ReduceLROnPlateau steps on a metric at epoch ends; "
        r"give interval='epoch' and metric=",
    ):
        LRSchedule(lr_scheduler.ReduceLROnPlateau(optimizer), metric="eval_loss")
    with pytest.raises(ValueError, match=r"metric='eval_loss'\) is for ReduceLROnPlateau; StepLR"):
        LRSchedule(lr_scheduler.StepLR(optimizer, 2), interval="epoch", metric="eval_loss")
    # a factory's scheduler is checked when it is made, before the first step
    engine = runmodel.Engine()
    engine.attach(LRSchedule(lambda opt: lr_scheduler.ReduceLROnPlateau(opt)))
    steps = lrs_used(engine)
    with pytest.raises(ValueError, match=r"ReduceLROnPlateau steps on a metric"):
        engine.run(Tiny(), epochs=1)
    assert steps == []


@pytest.mark.parametrize(
    ("factory", "error", "match"),
    [
        (
            lr_scheduler.StepLR,
            TypeError,
            r"the scheduler factory failed when called with the "
            r"optimizer: .*step_size.*; a factory takes the optimizer",
        ),
        (
            lambda opt: torch.optim.SGD,
            TypeError,
            r"the factory returned type, not a "
            r"torch.optim.lr_scheduler scheduler",
        ),
    ],
)
def test_a_bad_factory_fails_before_the_first_step(factory: Any, error: type, match: str) -> None:
    engine = runmodel.Engine()
    engine.attach(LRSchedule(factory))
    steps = lrs_used(engine)
    with pytest.raises(error, match=match) as caught:
        engine.run(Tiny(), epochs=1)
    assert steps == [] and "\n" not in str(caught.value)


def test_an_instance_for_another_optimizer_is_refused_at_setup() -> None:
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    engine = runmodel.Engine()
    engine.attach(LRSchedule(lr_scheduler.StepLR(optimizer, 2)))
    with pytest.raises(
        ValueError,
        match=r"made for another optimizer than the model's .* pass "
        r"a factory instead",
    ):
        engine.run(Tiny(), epochs=1)


def test_an_instance_made_before_unfreeze_regrouped_is_refused() -> None:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    model = runmodel.TorchModel.from_parts(
        module, optimizer=optimizer, loss_fn=nn.MSELoss(), train_data=make_data(), device="cpu"
    )
    engine = runmodel.Engine()
    engine.attach(
        Unfreeze({0: ["2"], 1: "all"}, lr_scale={1: 0.1}),
        LRSchedule(lr_scheduler.StepLR(optimizer, 2)),
    )
    with pytest.raises(ValueError, match=r"made for 1 param group\(s\) but the optimizer has 2"):
        engine.run(model, epochs=1)


def test_an_optimizer_replaced_mid_run_is_an_error_not_a_silent_no_op() -> None:
    engine = runmodel.Engine()
    engine.attach(LRSchedule(step_lr))

    @engine.on("epoch_end")
    def replace(engine: runmodel.Engine) -> None:
        engine.model.optimizer = torch.optim.SGD(engine.model.module.parameters(), lr=1.0)

    with pytest.raises(RuntimeError, match=r"optimizer was replaced during the run"):
        engine.run(Tiny(), epochs=2)


def test_eval_runs_are_left_alone() -> None:
    engine, model = runmodel.Engine(), Tiny()
    engine.attach(LRSchedule(functools.partial(lr_scheduler.StepLR, step_size=1), warmup_steps=2))
    result = engine.run(model, mode="eval")
    assert "lr" not in result.metrics and model.optimizer.param_groups[0]["lr"] == 0.1
    assert math.isfinite(result.metrics["loss"])


# -- a closed form: lr_at= ------------------------------------------------------------------------

# nanoGPT's train.py, shrunk: its learning rate decay scheduler (cosine with warmup)
LEARNING_RATE, MIN_LR, WARMUP_ITERS, LR_DECAY_ITERS = 6e-3, 6e-4, 3, 10


def get_lr(it: int) -> float:
    """nanoGPT's ``get_lr``, as written there."""
    # 1) linear warmup for warmup_iters steps
    if it < WARMUP_ITERS:
        return LEARNING_RATE * (it + 1) / (WARMUP_ITERS + 1)
    # 2) if it > lr_decay_iters, return min learning rate
    if it > LR_DECAY_ITERS:
        return MIN_LR
    # 3) in between, use cosine decay down to min learning rate
    decay_ratio = (it - WARMUP_ITERS) / (LR_DECAY_ITERS - WARMUP_ITERS)
    assert 0 <= decay_ratio <= 1
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))  # coeff ranges 0..1
    return MIN_LR + coeff * (LEARNING_RATE - MIN_LR)


def grouped_adamw(module: nn.Module) -> torch.optim.Optimizer:
    """nanoGPT's ``configure_optimizers``: matrices decay, the rest does not."""
    decay = [p for p in module.parameters() if p.dim() >= 2]
    no_decay = [p for p in module.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=LEARNING_RATE,
        betas=(0.9, 0.95),
    )


def nanogpt_data(iterations: int, gas: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return make_data(iterations * gas, batch_size=4, features=4, seed=3)


def nanogpt_loop(iterations: int, gas: int, epochs: int = 1) -> tuple[nn.Module, list[float]]:
    """nanoGPT's training loop: the lr set at the top of each iteration, ``gas``
    micro-steps each scaled by ``1/gas``, then the step; with the lr of every micro-step.
    ``iterations`` per pass over the data, ``epochs`` passes."""
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    optimizer = grouped_adamw(module)
    data = iter(nanogpt_data(iterations, gas) * epochs)
    iterations *= epochs
    lrs = []
    for it in range(iterations):
        lr = get_lr(it)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr
        for _ in range(gas):
            x, y = next(data)
            lrs.append(optimizer.param_groups[1]["lr"])
            loss = nn.functional.mse_loss(module(x), y) / gas
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return module, lrs


class NanoGPTLike(runmodel.TorchModel):
    """``nanogpt_loop``'s model, optimizer and data: an epoch of ``iterations``."""

    def __init__(self, iterations: int, gas: int) -> None:
        super().__init__("cpu")
        torch.manual_seed(0)
        self.module = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        self.data = nanogpt_data(iterations, gas)

    def setup(self, setup_options: Any = None) -> None:
        self.optimizer, self.loss_fn = grouped_adamw(self.module), nn.MSELoss()
        self.train_data = self.data


def test_lr_at_writes_nanogpts_get_lr_at_every_iteration() -> None:
    """14 iterations (warm-up, cosine, then min_lr): the lr of every step and the final
    weights equal the script's, bit for bit."""
    expected, script_lrs = nanogpt_loop(14, 1)
    engine, model = runmodel.Engine(), NanoGPTLike(14, 1)
    pack = LRSchedule(lr_at=get_lr)
    engine.attach(pack)
    used = lrs_used(engine, group=1)
    result = engine.run(model, epochs=1)
    assert used == script_lrs == [get_lr(it) for it in range(14)]
    assert len(set(used)) > 5
    assert torch.equal(params(model), params(expected))
    assert result.metrics["lr"] == get_lr(14) and pack.optimizer_steps == 14


def test_lr_at_with_grad_accumulation_counts_iterations() -> None:
    """GradAccumulation(3): the lr changes once per window, iteration = step // 3."""
    expected, script_lrs = nanogpt_loop(14, 3)
    engine, model = runmodel.Engine(), NanoGPTLike(14, 3)
    engine.attach(GradAccumulation(3), LRSchedule(lr_at=get_lr))
    used = lrs_used(engine, group=1)
    engine.run(model, epochs=1)
    assert used == script_lrs == [get_lr(step // 3) for step in range(42)]
    assert torch.equal(params(model), params(expected))


@pytest.mark.parametrize("gas", [1, 2])
def test_lr_at_continues_exactly_after_a_resume(tmp_path: Path, gas: int) -> None:
    """A run stopped after epoch 1 of 3 (5 iterations each) and resumed from its
    checkpoint: the lrs and the final weights of the script's 15 iterations."""
    expected, script_lrs = nanogpt_loop(5, gas, epochs=3)

    def run(resume: Any = None) -> tuple[list[float], NanoGPTLike]:
        engine, model = runmodel.Engine(), NanoGPTLike(5, gas)
        engine.attach(GradAccumulation(gas), LRSchedule(lr_at=get_lr))
        used = lrs_used(engine, group=1)
        engine.attach(Checkpoint(tmp_path if resume is None else tmp_path / "again"))
        if resume is None:  # stopped after its first epoch
            engine.on("epoch_end", lambda e: e.stop(), priority=-10)
        engine.run(model, epochs=3, resume=resume)
        return used, model

    first, _ = run()
    second, resumed = run(resume=tmp_path)
    assert len(first) == 5 * gas
    assert first + second == script_lrs
    assert torch.equal(params(resumed), params(expected))


def test_a_multiplying_schedule_would_not_be_the_scripts() -> None:
    """Why lr_at= writes: ``LambdaLR`` multiplies the base lr by a factor, and
    ``base * (get_lr(it) / base)`` is not ``get_lr(it)`` at many iterations (nanoGPT's
    own constants: 6e-4, warm-up 100, decay to 6e-5 over 5000)."""
    base = 6e-4

    def nanogpt(it: int) -> float:
        if it < 100:
            return base * (it + 1) / 101
        coeff = 0.5 * (1.0 + math.cos(math.pi * min(1.0, (it - 100) / 4900)))
        return 6e-5 + coeff * (base - 6e-5)

    assert sum(base * (nanogpt(it) / base) != nanogpt(it) for it in range(6000)) > 100


def test_lr_at_one_function_per_group() -> None:
    engine, model = runmodel.Engine(), NanoGPTLike(4, 1)
    engine.attach(LRSchedule(lr_at=[lambda it: 0.1 / (it + 1), lambda it: 0.01 * it]))
    decay, no_decay = lrs_used(engine, group=0), lrs_used(engine, group=1)
    engine.run(model, epochs=1)
    assert decay == [0.1, 0.05, 0.1 / 3, 0.025] and no_decay == [0.0, 0.01, 0.02, 0.03]


def test_lr_at_with_as_many_functions_as_groups_only() -> None:
    engine = runmodel.Engine()
    engine.attach(LRSchedule(lr_at=[get_lr]))
    with pytest.raises(ValueError, match="has 1 functions, one per param group, but the "):
        engine.run(NanoGPTLike(4, 1), epochs=1)


def test_a_positional_function_is_still_a_scheduler_factory() -> None:
    pack = LRSchedule(lambda opt: lr_scheduler.StepLR(opt, step_size=3, gamma=0.5))
    assert pack.lr_at is None
    used, _, _ = train(pack)
    assert used == [0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025]


@pytest.mark.parametrize(
    "args",
    [
        {"scheduler": "StepLR"},
        {"warmup_steps": 3},
        {"interval": "epoch"},
        {"metric": "eval_loss"},
    ],
)
def test_lr_at_is_the_whole_schedule(args: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"LRSchedule\(lr_at=\) is the whole schedule"):
        LRSchedule(lr_at=get_lr, **args)


@pytest.mark.parametrize("bad", [0.1, "cosine", [], [get_lr, 0.1]])
def test_lr_at_takes_functions(bad: Any) -> None:
    with pytest.raises(TypeError, match=r"LRSchedule\(lr_at=\) takes a function of the iter"):
        LRSchedule(lr_at=bad)

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


# -- what a script clips --------------------------------------------------------------------


def grouped(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A module with weights, biases and LayerNorms, and an AdamW over it in two groups
    as nanoGPT builds them (matrices decay, the rest does not): the groups interleave the
    module's order of parameters."""
    torch.manual_seed(seed)
    module = nn.Sequential(
        nn.Linear(4, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 16), nn.LayerNorm(16),
        nn.Linear(16, 1),
    )  # fmt: skip
    decay = [p for p in module.parameters() if p.dim() >= 2]
    no_decay = [p for p in module.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-3,
    )
    return module, optimizer


def random_batches(steps: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Batches of widely varying scale, so that every step's total norm sums numbers of
    many sizes (where the order of the sum shows in the last bits)."""
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(8, 4, generator=g) * 10 ** float(torch.rand(1, generator=g) * 3),
         torch.randn(8, 1, generator=g))
        for _ in range(steps)
    ]  # fmt: skip


Grads = list[torch.Tensor | None]


def same_grads(a: Grads, b: Grads) -> bool:
    """Bit for bit the same gradients (None where there is none)."""
    return len(a) == len(b) and all(
        x is y is None or (x is not None and y is not None and torch.equal(x, y))
        for x, y in zip(a, b, strict=True)
    )


def clipped_as_a_script_does(
    engine: runmodel.Engine, module: nn.Module, max_norm: float
) -> list[tuple[Grads, Grads, torch.Tensor]]:
    """Per optimizer step: the gradients GradClip left (in the module's order), those
    ``clip_grad_norm_(module.parameters(), max_norm)`` leaves on copies of the same
    gradients, and the norm it returned."""
    steps: list[tuple[Grads, Grads, torch.Tensor]] = []

    def before(engine: Any, default: Any) -> None:  # outside GradClip (100)
        copies = [torch.zeros_like(p).requires_grad_() for p in module.parameters()]
        for copy, p in zip(copies, module.parameters(), strict=True):
            copy.grad = None if p.grad is None else p.grad.clone()
        norm = nn.utils.clip_grad_norm_(copies, max_norm)
        steps.append(([], [c.grad for c in copies], norm))
        default(engine)

    def after(engine: Any, default: Any) -> None:  # inside GradClip
        steps[-1][0].extend(None if p.grad is None else p.grad.clone() for p in module.parameters())
        default(engine)

    engine.override("optimizer_step", before, priority=150)
    engine.override("optimizer_step", after, priority=50)
    return steps


def test_the_total_norm_is_clip_grad_norm_over_the_module_in_its_order() -> None:
    """nanoGPT's decay/no-decay AdamW: GradClip clips exactly as
    ``clip_grad_norm_(model.parameters(), max_norm)``, bit for bit, at each of 200 steps
    (summing in the groups' order instead gives another norm in the last bits)."""
    module, optimizer = grouped()
    model = runmodel.TorchModel.from_parts(
        module, optimizer=optimizer, loss_fn=nn.MSELoss(), train_data=random_batches(200)
    )
    engine, clip = runmodel.Engine(), GradClip(max_norm=0.5)
    engine.attach(clip)
    steps = clipped_as_a_script_does(engine, module, 0.5)
    engine.run(model, epochs=1)
    assert len(steps) == 200
    for clipped, expected, _ in steps:
        assert same_grads(clipped, expected)
    assert clip.last_norm is not None and torch.equal(clip.last_norm, steps[-1][2])
    in_group_order = [id(p) for group in optimizer.param_groups for p in group["params"]]
    assert in_group_order != [id(p) for p in module.parameters()]  # the groups interleave


def test_the_norm_in_the_groups_order_would_differ() -> None:
    """The reason for the order: over the same gradients, the groups' order gives another
    total norm at some of 200 random gradient sets."""
    module, optimizer = grouped()
    in_module_order = list(module.parameters())
    in_group_order = [p for group in optimizer.param_groups for p in group["params"]]
    g = torch.Generator().manual_seed(2)
    differ = 0
    for _ in range(200):
        grads = [torch.randn(p.shape, generator=g) * 10 ** float(torch.rand(1, generator=g) * 3)
                 for p in in_module_order]  # fmt: skip
        by_id = {id(p): grad for p, grad in zip(in_module_order, grads, strict=True)}
        a = torch.nn.utils.get_total_norm(grads)
        b = torch.nn.utils.get_total_norm([by_id[id(p)] for p in in_group_order])
        differ += not torch.equal(a, b)
    assert differ > 0


def test_parameters_outside_the_module_come_after_its_own() -> None:
    """A parameter the optimizer has that the module does not (a learned temperature,
    say) is clipped with the rest, after the module's parameters."""
    module, optimizer = grouped()
    extra = nn.Parameter(torch.ones(3))
    optimizer.add_param_group({"params": [extra], "weight_decay": 0.0})
    engine = runmodel.Engine()
    clip = GradClip(max_norm=0.5)
    engine.attach(clip)
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def grad_for_extra(engine: Any, default: Any) -> None:
        extra.grad = torch.full((3,), 7.0)
        copies = [torch.zeros_like(p).requires_grad_() for p in [*module.parameters(), extra]]
        for copy, p in zip(copies, [*module.parameters(), extra], strict=True):
            copy.grad = p.grad.clone()
        seen.append((nn.utils.clip_grad_norm_(copies, 0.5), copies[-1].grad))
        default(engine)

    engine.override("optimizer_step", grad_for_extra, priority=150)
    model = runmodel.TorchModel.from_parts(
        module, optimizer=optimizer, loss_fn=nn.MSELoss(), train_data=random_batches(5)
    )
    engine.run(model, epochs=1)
    assert clip.last_norm is not None and torch.equal(clip.last_norm, seen[-1][0])


def test_a_param_group_added_during_the_run_is_clipped() -> None:
    """A group added at epoch 1 (a frozen head unfrozen, as a fine-tuning callback adds
    one) is in the norm and clipped from the next optimizer step on."""
    module, optimizer = grouped()
    head = nn.Linear(1, 1).requires_grad_(False)
    engine = runmodel.Engine()
    engine.attach(GradClip(max_norm=0.5))
    steps = clipped_as_a_script_does(engine, nn.Sequential(module, head), 0.5)

    @engine.on("epoch_start", once=1)
    def add_head(engine: Any) -> None:
        head.requires_grad_(True)
        engine.model.optimizer.add_param_group({"params": list(head.parameters())})

    def forward(x: torch.Tensor) -> torch.Tensor:
        return head(module(x))

    class WithHead(runmodel.TorchModel):
        def setup(self, setup_options: Any = None) -> None:
            self.module = nn.Sequential(module, head)
            self.optimizer, self.loss_fn = optimizer, nn.MSELoss()
            self.train_data = random_batches(4)

    engine.run(WithHead(), epochs=2)
    assert len(steps) == 8 and steps[-1][1][-1] is not None  # the head's gradient, clipped
    for clipped, expected, _ in steps:
        assert same_grads(clipped, expected)


def test_a_param_group_added_mid_run_is_clipped_with_the_others() -> None:
    """The optimizer starts over the first layer; at epoch 1 a hook adds the last layer as
    a group of its own (its gradients, never zeroed until then, are large): from then on
    the total norm the optimizer sees, over both groups, is clipped."""
    engine = runmodel.Engine()
    engine.attach(GradClip(max_norm=0.5))
    seen = seen_by_optimizer(engine, "norm")

    @engine.on("setup")
    def first_layer_only(engine: Any) -> None:
        engine.model.optimizer = torch.optim.SGD(engine.model.module[0].parameters(), lr=0.05)

    @engine.on("epoch_start", once=1)
    def add_the_last_layer(engine: Any) -> None:
        engine.model.optimizer.add_param_group(
            {"params": list(engine.model.module[2].parameters())}
        )

    model = mlp()
    engine.run(model, epochs=2)
    assert len(model.optimizer.param_groups) == 2
    assert len(seen) == 8 and all(n <= 0.5 * (1 + 1e-5) for n in seen), seen

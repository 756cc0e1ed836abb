"""``NaNGuard(locate=True)``: a failed check replays its step with hooks on every module
and names where the non-finite value starts (a module's forward, a module's gradient,
a user's override of the update), on stderr, in ``divergence.json`` and in
``engine.state.divergence``; healthy steps carry no hook; the run ends with the weights
of the same run without ``locate``."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import runmodel
from runmodel.packs import NaNGuard

BAD_STEP = 3


class Log(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)


class Overflow(torch.autograd.Function):
    """The identity forward; its backward multiplies by 1e38 at ``armed`` (float32
    overflows to inf), else passes the gradient through."""

    armed = False

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * 1e38 * 1e38 if Overflow.armed else grad


class Blowup(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return Overflow.apply(x)


class Net(nn.Module):
    """``body.0`` takes the log of the (positive) inputs: a 0 in a batch makes it -inf."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(Log(), nn.Linear(3, 3), nn.Dropout(0.2))
        self.head = nn.Sequential(nn.Linear(3, 4), Blowup(), nn.Tanh(), nn.Linear(4, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    return [(torch.rand(4, 3) + 0.5, torch.randn(4, 1)) for _ in range(6)]


def model(batches: list[Any]) -> runmodel.TorchModel:
    torch.manual_seed(1)
    module = Net()
    return runmodel.TorchModel.from_parts(
        module,
        optimizer=torch.optim.Adam(module.parameters(), lr=1e-3),
        loss_fn=nn.MSELoss(),
        train_data=batches,
    )


def zero_at(engine: runmodel.Engine, step: int) -> None:
    """At ``step``, one input of the batch is 0 (its log is -inf)."""

    @engine.on("step_start", once=step)
    def poison(engine: Any) -> None:
        x, y = engine.state.batch
        x = x.clone()
        x[1, 2] = 0.0
        engine.state.batch = (x, y)


def run(guard: NaNGuard, tmp: Path, poison: Any = None) -> tuple[runmodel.Engine, Any]:
    engine = runmodel.Engine(guard, progress=False)
    m = model(data())
    if poison is not None:
        poison(engine)
    seen: list[int] = []

    @engine.on("step_start")
    def no_hooks(engine: Any) -> None:
        hooks = sum(
            len(mod._forward_hooks) + len(mod._backward_hooks) + len(mod._forward_pre_hooks)
            for mod in m.module.modules()
        ) + sum(len(p._post_accumulate_grad_hooks or {}) for p in m.module.parameters())
        seen.append(hooks)

    with pytest.warns(RuntimeWarning, match="skipped") if guard.action == "skip" else _nothing():
        engine.run(m, "train", epochs=1, run_dir=tmp)
    assert seen and not any(seen), "a module carried a hook on a step"
    return engine, m


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_a_module_returning_inf_is_named_with_the_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    engine, located = run(NaNGuard(locate=True), tmp_path / "on", lambda e: zero_at(e, 3))
    err = capsys.readouterr().err
    line = next(line for line in err.splitlines() if "starts in" in line)
    assert "at step 3 (epoch 0, batch 3)" in line and "starts in body.0 (forward" in line
    records = json.loads((tmp_path / "on" / "divergence.json").read_text())
    assert len(records) == 1
    assert records[0] | {"shape": None} == {
        "step": 3,
        "epoch": 0,
        "epoch_step": 3,
        "guard": "NaNGuard",
        "module": "body.0",
        "phase": "forward",
        "shape": None,
        "dtype": "float32",
        "rank": 0,
    }
    assert records[0]["shape"] == [4, 3]
    assert engine.state.divergence == records[0]
    # locating changed nothing: the weights of the same run without it, bit for bit
    _, plain = run(NaNGuard(), tmp_path / "off", lambda e: zero_at(e, 3))
    for a, b in zip(located.module.parameters(), plain.module.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_gradient_that_overflows_names_its_module(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def arm(engine: runmodel.Engine) -> None:
        @engine.on("step_start")
        def at_step(engine: Any) -> None:
            Overflow.armed = engine.state.step == 2

    try:
        engine, _ = run(NaNGuard("stop", locate=True), tmp_path, arm)
    finally:
        Overflow.armed = False
    line = next(line for line in capsys.readouterr().err.splitlines() if "starts in" in line)
    assert "at step 2 " in line and "starts in head.1 (backward" in line
    assert engine.state.divergence is not None
    assert engine.state.divergence["module"] == "head.1"
    assert engine.state.step == 3  # stopped after step 2


def test_an_override_that_makes_the_update_non_finite_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def divide(engine: runmodel.Engine) -> None:
        @engine.override("optimizer_step")
        def divide_by_count(engine: Any, default: Any) -> None:
            default(engine)
            if engine.state.step == 2:
                with torch.no_grad():
                    engine.model.module.head[0].weight.div_(0.0)

    engine, _ = run(NaNGuard("stop", locate=True), tmp_path, divide)
    line = next(line for line in capsys.readouterr().err.splitlines() if "starts in" in line)
    assert "at step 3 " in line and "optimizer_step override 'divide_by_count'" in line
    assert engine.state.divergence is not None
    assert engine.state.divergence["module"] == "head.0"
    assert engine.state.divergence["phase"] == "optimizer_step override 'divide_by_count'"


def test_a_module_changing_its_input_in_place_is_still_located(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """ReLU(inplace=True) refuses full backward hooks: the replay runs again without
    them, and the forward's culprit is named all the same."""
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(3, 4), nn.ReLU(inplace=True), Log(), nn.Linear(4, 1))
    m = runmodel.TorchModel.from_parts(
        module,
        optimizer=torch.optim.SGD(module.parameters(), lr=0.1),
        loss_fn=nn.MSELoss(),
        train_data=data()[:3],
    )
    engine = runmodel.Engine(NaNGuard("stop", locate=True), progress=False)
    engine.run(m, epochs=1)  # relu gives 0 somewhere: log(0) at the first step
    assert "starts in 2 (forward" in capsys.readouterr().err
    assert engine.state.divergence is not None and engine.state.divergence["step"] == 0


# -- a NaN that only one dropout mask makes: locate=True against locate="exact" ---------


class KeptMean(nn.Module):
    """Dropout that rescales each row by the count of its kept units: a row whose units
    are all dropped divides 0 by 0, a NaN that only such a mask makes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kept = (torch.rand(x.shape) > 0.4).to(x.dtype)
        return x * kept * x.shape[-1] / kept.sum(-1, keepdim=True)


MASKED_STEP = 5  # with this seed, the one step whose mask drops a whole row


def masked_run(
    locate: bool | str, tmp: Path, seed: int = 18, jitter: bool = False
) -> tuple[list[str], list[torch.Tensor]]:
    """One epoch of 8 batches through ``KeptMean``, ``NaNGuard(locate=locate)`` skipping
    (``jitter``: a ``step_start`` hook adds noise to each batch, drawing); its lines on
    stderr from NaNGuard, and the final weights."""
    torch.manual_seed(0)
    batches = [(torch.rand(4, 3), torch.randn(4, 1)) for _ in range(8)]
    torch.manual_seed(seed)
    module = nn.Sequential(nn.Linear(3, 4), KeptMean(), nn.Tanh(), nn.Linear(4, 1))
    m = runmodel.TorchModel.from_parts(
        module,
        optimizer=torch.optim.SGD(module.parameters(), lr=0.1),
        loss_fn=nn.MSELoss(),
        train_data=batches,
    )
    engine = runmodel.Engine(NaNGuard(locate=locate), progress=False)
    if jitter:

        @engine.on("step_start")
        def noise(engine: Any) -> None:
            x, y = engine.state.batch
            engine.state.batch = (x + 0.01 * torch.rand(x.shape), y)

    errors = io.StringIO()
    with contextlib.redirect_stderr(errors), pytest.warns(RuntimeWarning, match="skipped"):
        engine.run(m, epochs=1, run_dir=tmp)
    lines = [line for line in errors.getvalue().splitlines() if line.startswith("NaNGuard")]
    return lines, [p.detach().clone() for p in module.parameters()]


def test_exact_replays_the_steps_own_dropout_mask(tmp_path: Path) -> None:
    """locate=True replays the step with a new mask and finds nothing; locate="exact"
    replays it with the step's own and names the module; neither changes the run."""
    exact, located = masked_run("exact", tmp_path / "exact")
    assert len(exact) == 1 and f"at step {MASKED_STEP} " in exact[0]
    assert "starts in 1 (forward" in exact[0] and "(KeptMean)" in exact[0]
    (record,) = json.loads((tmp_path / "exact" / "divergence.json").read_text())
    assert (record["step"], record["module"], record["phase"]) == (MASKED_STEP, "1", "forward")

    anew, _ = masked_run(True, tmp_path / "anew")
    assert len(anew) == 1 and f"at step {MASKED_STEP} " in anew[0]
    assert "not found again in a replay of the step" in anew[0]
    assert "from random draws: locate='exact' replays the step's own" in anew[0]
    assert not (tmp_path / "anew" / "divergence.json").exists()

    _, plain = masked_run(False, tmp_path / "plain")
    for a, b in zip(located, plain, strict=True):
        assert torch.equal(a, b)


def test_exact_copies_the_generators_after_the_step_start_hooks_that_draw(
    tmp_path: Path,
) -> None:
    """A step_start hook that changes the batch with random noise draws before the
    step's mask: the copy is taken after it, so the replay draws the mask again."""
    exact, _ = masked_run("exact", tmp_path, seed=7, jitter=True)
    assert len(exact) == 1 and "starts in 1 (forward" in exact[0]


def test_only_exact_copies_the_generators_on_each_step() -> None:
    def step_start_hooks(guard: NaNGuard) -> list[str]:
        return [h.name for h in guard.hooks() if h.phase == "step_start"]

    assert step_start_hooks(NaNGuard(locate=True)) == []
    assert step_start_hooks(NaNGuard()) == []
    assert len(step_start_hooks(NaNGuard(locate="exact"))) == 1


@pytest.mark.parametrize("locate", ["yes", 1, None, "Exact"])
def test_locate_takes_false_true_or_exact(locate: Any) -> None:
    with pytest.raises(ValueError, match=r"locate= must be False, True .* or 'exact'"):
        NaNGuard(locate=locate)

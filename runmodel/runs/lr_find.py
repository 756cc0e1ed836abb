"""The learning-rate range test (Smith, 2015; fastai's ``lr_find``): train for up to
``steps`` steps with the learning rate raised exponentially from ``start_lr`` to
``end_lr``, record the loss, stop once it diverges, then put everything back: the
module's weights, the optimizer's state and its groups' learning rates, the random
number generators (and the training loader's own generator), so the model is as it was
before. A learning rate is suggested by fastai's "valley" rule, and the loss is drawn
against the learning rate (a PNG, drawn as ``runmodel plot`` draws).

    runmodel lr-find examples/digits.py
    runmodel lr-find examples/configs/digits.toml --steps 200 -o lr.png

    result = runmodel.lr_find(model)          # from Python
    result.suggestion                         # a learning rate, or None
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from ..core.snapshot import rng_state, set_rng_state
from ..engine import Engine, RunArguments
from ..extras import require
from ..models.torchutil import unwrap
from .plot import DPI, PANEL

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["LRFind", "LRFindResult", "figure", "lr_find", "save_plot", "suggest", "valley"]

#: fastai's defaults: the range, the number of steps, the divergence factor, the weight of
#: the loss's running average
START_LR, END_LR, STEPS, DIVERGES, BETA = 1e-7, 10.0, 100, 4.0, 0.98


@dataclass
class LRFindResult:
    """What the range test saw: the learning rate of each step taken, the loss (its
    running average, debiased, as fastai records it) and the raw loss after it; the
    suggested learning rate (None where the curve is too short for one) and its index in
    ``lrs``; why it ended; the PNG drawn (None: none asked for)."""

    lrs: list[float]
    losses: list[float]
    raw_losses: list[float]
    suggestion: float | None
    index: int | None
    ended: str
    plot: Path | None = None
    #: the steps asked for, and the range
    steps: int = STEPS
    start_lr: float = START_LR
    end_lr: float = END_LR

    def summary(self) -> str:
        lines = [
            f"lr-find: {len(self.lrs)} of {self.steps} steps, learning rate "
            f"{self.start_lr:.3g} to {self.lrs[-1] if self.lrs else self.start_lr:.3g} "
            f"({self.ended})"
        ]
        if self.suggestion is None:
            lines.append(
                "  no suggestion: too few steps before the loss diverged (fastai's "
                "rule drops the first tenth of the steps and the last five)"
            )
        else:
            lines.append(
                f"  suggestion (valley): {self.suggestion:.3g} (step {self.index}, "
                f"smoothed loss {self.losses[self.index or 0]:.4g})"
            )
        if self.plot is not None:
            lines.append(f"  plot: {self.plot}")
        return "\n".join(lines)


def valley(lrs: Sequence[float], losses: Sequence[float]) -> int:
    """fastai's "valley" rule, giving the index fastai's ``valley`` suggestion function
    gives: the longest valley is the longest run of steps (not necessarily contiguous)
    whose losses each fall below all of the run's earlier ones, the first such run where
    several are as long; the suggestion is about half way down it, a third plus a sixth
    of its length past the step before its first (fastai counts from there). Returns the
    index into ``lrs``; as in fastai, a valley of fewer than 3 steps that begins at the
    first step gives index -1, the last learning rate."""
    count = len(losses)
    if count != len(lrs) or count == 0:
        raise ValueError(
            f"valley: {len(lrs)} learning rates and {count} losses; give as many "
            f"of each, at least one"
        )
    longest = [1] * count  # the longest falling run ending at each step
    end = 0
    for i in range(1, count):
        longest[i] = 1 + max((longest[j] for j in range(i) if losses[j] > losses[i]), default=0)
        if longest[i] > longest[end]:
            end = i
    # the step before the valley's first (0 where no step falls below an earlier one)
    before = end - longest[end] if end else 0
    third = (end - before) / 3
    return (before + int(third) + int(third / 2)) % count


def suggest(lrs: Sequence[float], losses: Sequence[float], steps: int) -> int | None:
    """The index of the suggested learning rate in ``lrs``, as fastai's ``lr_find`` picks
    it from a test of ``steps`` steps: the first tenth of the steps asked for and the
    last five taken are left out (the start is noise, the end divergence), and so is
    everything from the first NaN on; then the valley rule. None where nothing is
    left."""
    skip = steps // 10
    kept = list(losses[skip : len(losses) - 5])
    if any(math.isnan(v) for v in kept):
        kept = kept[: next(i for i, v in enumerate(kept) if math.isnan(v))]
    if not kept:
        return None
    return skip + valley(lrs[skip : skip + len(kept)], kept)


class _RangeTest:
    """The hooks of one range test: each step's learning rate set before it, its loss
    read after it, the run stopped once the loss diverges."""

    def __init__(self, start_lr: float, end_lr: float, steps: int, diverges: float) -> None:
        self.start_lr, self.ratio, self.steps, self.diverges = (
            start_lr,
            end_lr / start_lr,
            steps,
            diverges,
        )
        self.lrs: list[float] = []
        self.losses: list[float] = []
        self.raw: list[float] = []
        self.average, self.best = 0.0, math.inf
        self.ended = "completed"
        self.optimizer: torch.optim.Optimizer | None = None
        self.optimizer_state: dict[str, Any] | None = None

    def setup(self, engine: Any) -> None:
        """The optimizer as the run starts (after setup hooks that regroup it): put back
        as it is now once the test is over."""
        optimizer = getattr(engine.model, "optimizer", None)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"lr_find raises the learning rate of the model's optimizer; "
                f"{type(engine.model).__name__}.optimizer is {optimizer!r} after "
                f"setup()"
            )
        self.optimizer, self.optimizer_state = optimizer, copy.deepcopy(optimizer.state_dict())

    def step_start(self, engine: Any) -> None:
        lr = self.start_lr * self.ratio ** (len(self.lrs) / self.steps)  # as fastai's
        assert self.optimizer is not None
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.lrs.append(lr)

    def runstep(self, engine: Any) -> None:
        loss = float(engine.state.loss.detach())  # the test reads every loss: a sync a step
        self.raw.append(loss)
        self.average = BETA * self.average + (1 - BETA) * loss
        smoothed = self.average / (1 - BETA ** len(self.raw))
        self.losses.append(smoothed)
        self.best = min(self.best, smoothed)
        if not math.isfinite(smoothed) or smoothed > self.diverges * self.best:
            self.ended = f"stopped at step {len(self.raw)}: the loss diverged"
            engine.stop("the loss diverged")

    def put_back(self) -> None:
        if self.optimizer is not None and self.optimizer_state is not None:
            self.optimizer.load_state_dict(self.optimizer_state)


def lr_find(
    model: Any,
    *,
    engine: Engine | None = None,
    start_lr: float = START_LR,
    end_lr: float = END_LR,
    steps: int = STEPS,
    diverges: float = DIVERGES,
    setup_options: dict[str, Any] | None = None,
    backend: Any = None,
    plot: str | os.PathLike[str] | None = None,
) -> LRFindResult:
    """Run the range test on ``model`` (a ``TorchModel``): up to ``steps`` train steps
    (through ``engine``, default a new ``runmodel.Engine``, with its hooks and packs; the
    model is set up by the run, with ``setup_options`` and ``backend``), the learning rate
    of every param group set before step k (from 0) to ``start_lr * (end_lr / start_lr) **
    (k / steps)`` (fastai's schedule); stopped once the running average of the loss
    exceeds ``diverges`` times its lowest (or is not finite). Then the module's weights,
    the optimizer's state (the one the model had before, or the one its ``setup`` made,
    as it was made) with its learning rates, and the random number generators (Python's,
    NumPy's, torch's; the training DataLoader's own ``generator``) are put back.
    ``plot``: draw the loss against the learning rate into that PNG (matplotlib, the
    ``plot`` extra)."""
    _check_range(start_lr, end_lr, steps, diverges)
    if plot is not None:
        require("matplotlib", needed_by="lr_find(plot=)")
    module = unwrap(getattr(model, "module", None))
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"lr_find trains a TorchModel's module; {type(model).__name__} has none")
    engine = engine if engine is not None else Engine(progress=False)
    test = _RangeTest(start_lr, end_lr, steps, diverges)
    weights = {k: v.detach().clone() for k, v in module.state_dict().items()}
    before = getattr(model, "optimizer", None)
    before_state = (
        copy.deepcopy(before.state_dict()) if isinstance(before, torch.optim.Optimizer) else None
    )
    generators, loader = rng_state(), _loader_generator(model)
    loader_state = loader.get_state() if loader is not None else None
    handles = [
        engine.on("setup", test.setup, priority=-10_000, modes="train", name="lr_find.setup"),
        engine.on("step_start", test.step_start, priority=10_000, name="lr_find.lr"),
        engine.on("runstep", test.runstep, priority=10_000, name="lr_find.loss"),
    ]
    try:
        engine.run(model, "train", steps=steps, setup_options=setup_options, backend=backend)
    finally:
        for handle in handles:
            handle.detach()
        test.put_back()
        (unwrap(model.module) or module).load_state_dict(weights)
        if before_state is not None and model.optimizer is before:
            before.load_state_dict(before_state)
        set_rng_state(generators)
        loader = _loader_generator(model) if loader is None else loader
        if loader is not None and loader_state is not None:
            loader.set_state(loader_state)
    index = suggest(test.lrs, test.losses, steps)
    result = LRFindResult(
        test.lrs,
        test.losses,
        test.raw,
        None if index is None else test.lrs[index],
        index,
        test.ended,
        steps=steps,
        start_lr=start_lr,
        end_lr=end_lr,
    )
    if plot is not None:
        result.plot = save_plot(result, plot)
    return result


def _loader_generator(model: Any) -> torch.Generator | None:
    generator = getattr(getattr(model, "train_data", None), "generator", None)
    return generator if isinstance(generator, torch.Generator) else None


def _check_range(start_lr: float, end_lr: float, steps: int, diverges: float) -> None:
    for name, value in (("start_lr", start_lr), ("end_lr", end_lr), ("diverges", diverges)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"lr_find: {name} must be a number > 0, got {value!r}")
    if not end_lr > start_lr:
        raise ValueError(
            f"lr_find: end_lr ({end_lr:g}) must be above start_lr "
            f"({start_lr:g}): the test raises the learning rate"
        )
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 2:
        raise ValueError(f"lr_find: steps must be a whole number >= 2, got {steps!r}")


def figure(result: LRFindResult) -> Figure:
    """The loss (its running average, and the raw loss faintly) against the learning
    rate on a log axis, the suggestion marked; one panel, as ``runmodel plot`` draws
    (``runs/plot.py``: its panel size and resolution, Agg, no pyplot)."""
    require("matplotlib", needed_by="runmodel lr-find")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=PANEL, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.add_subplot(1, 1, 1)
    axes.plot(result.lrs, result.raw_losses, color="C0", alpha=0.3, linewidth=1, label="loss")
    axes.plot(result.lrs, result.losses, color="C0", label="loss (running average)")
    if result.index is not None:
        axes.plot(
            [result.lrs[result.index]],
            [result.losses[result.index]],
            "o",
            color="C3",
            label=f"valley: {result.lrs[result.index]:.3g}",
        )
    axes.set_xscale("log")
    axes.set(title="learning-rate range test", xlabel="learning rate", ylabel="loss")
    finite = [v for v in result.losses if math.isfinite(v)]
    if finite:  # up to half again the first loss: the diverging end would flatten the rest
        low, high = min(finite), finite[0] + 0.5 * (finite[0] - min(finite))
        if high > low:
            axes.set_ylim(low - 0.05 * (high - low), high)
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    return fig


def save_plot(result: LRFindResult, output: str | os.PathLike[str]) -> Path:
    """Draw ``figure(result)`` into ``output`` (no suffix: ``.png``); its path."""
    path = Path(output)
    if not path.suffix:
        path = path.with_suffix(".png")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure(result).savefig(path, dpi=DPI)
    return path


@dataclass(frozen=True)
class LRFind:
    """The action (``target.run_with``) of ``runmodel lr-find``: the range test on the
    source's model and engine, its plot into ``plot``."""

    start_lr: float = START_LR
    end_lr: float = END_LR
    steps: int = STEPS
    plot: Path | None = None
    trains: ClassVar[bool] = True

    def __call__(self, engine: Engine, model: Any, arguments: RunArguments) -> LRFindResult:
        return lr_find(
            model,
            engine=engine,
            start_lr=self.start_lr,
            end_lr=self.end_lr,
            steps=self.steps,
            setup_options=arguments.setup_options,
            backend=arguments.backend,
            plot=self.plot,
        )

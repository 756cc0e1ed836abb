"""Step a ``torch.optim.lr_scheduler`` scheduler with the run, with an optional linear
warm-up, or write a closed-form learning rate ``lr_at(iteration)`` before every
iteration; the learning rate goes into ``state.metrics["lr"]``."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.optim import lr_scheduler

from ..core import Hook, HookOptions, Pack
from ..core.checks import did_you_mean, whole_number
from ..models import TorchModel
from ._common import require_optimizer
from .metric_watcher import MetricWatcher

if TYPE_CHECKING:
    from ..core import Engine

__all__ = ["LRSchedule", "run_iterations"]

Scheduler = lr_scheduler.LRScheduler | lr_scheduler.ReduceLROnPlateau
Factory = Callable[[torch.optim.Optimizer], Any]
#: A closed-form schedule: the learning rate of an iteration (0-based optimizer step).
LRAt = Callable[[int], float]
INTERVALS = ("step", "epoch")
_FACTORY_EXAMPLE = "lambda optimizer: torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)"
#: Schedulers that take Python callables or other schedulers: not nameable in a config.
#: Schedulers whose curve is laid out over a length given when they are made, in practice
#: the run's planned total: extending the run would not give the longer run's curve.
LENGTH_DEPENDENT = ("CosineAnnealingLR", "OneCycleLR", "PolynomialLR")
_NOT_BY_NAME = (
    "LRScheduler",
    "_LRScheduler",
    "LambdaLR",
    "MultiplicativeLR",
    "SequentialLR",
    "ChainedScheduler",
)


class LRSchedule(Pack):
    """Step ``scheduler`` after every optimizer step (``interval="step"``; the steps the
    optimizer really takes, so with ``GradAccumulation`` once per window) or at the end of
    every full epoch (``interval="epoch"``), in train runs.

    ``scheduler`` is a ``torch.optim.lr_scheduler`` scheduler, a factory called with the
    model's optimizer when the run starts (after setup hooks that regroup it, such as
    ``Unfreeze(lr_scale=)``), the name of one of torch's schedulers (``"StepLR"``,
    ``"cosine_annealing_lr"``) or ``{"type": name, "args": {...}}`` (for configs), or None
    for a warm-up alone. ``ReduceLROnPlateau`` is stepped at epoch ends with
    ``state.metrics[metric]`` (``metric="eval_loss"``, as ``Evaluate`` puts it there).

    ``warmup_steps=N`` scales the scheduled learning rates by ``k/N`` for the k-th of the
    first N optimizer steps (k = 1..N), then leaves them as scheduled. Group 0's lr goes
    into ``state.metrics["lr"]`` whenever it changes (a float; no device sync); with
    ``interval="epoch"`` when the next epoch starts, so that what an epoch's end shows
    (progress, run log, TensorBoard) is the rate that epoch trained with. The
    scheduler's state and the count of optimizer steps are in ``state_dict()``, so a
    resumed run continues the curve exactly.

    ``scheduler="linear"``, ``"cosine"`` or ``"constant"`` with ``warmup=`` (a ratio of
    the run's iterations, rounded up, or a count of them; default 0) is the Hugging Face
    schedule of that name, laid out over the run's own length: the optimizer steps its
    budget makes (``steps=``, or ``epochs=`` times the batches per epoch, counted in
    windows under ``GradAccumulation``: ``ceil(batches / k)`` per epoch, as the Hugging
    Face ``Trainer`` counts), computed when the run starts, so a sweep or ``--set
    epochs=`` that changes the length changes the schedule with it. The lr of every
    optimizer step equals, bit for bit, what ``transformers``'
    ``get_linear_schedule_with_warmup``, ``get_cosine_schedule_with_warmup`` or
    ``get_constant_schedule_with_warmup`` give for that length and warm-up: each group's
    initial lr times the warm-up's ``it / W``, then the decay to 0 at the run's end
    (linear, or a half cosine), or 1 (constant).

    ``lr_at=fn`` (by keyword; instead of a scheduler and a warm-up) is a closed form, as
    scripts write one (nanoGPT's ``get_lr(it)``): before each iteration (after the
    previous optimizer step, and when the run starts) every group's lr is set to
    ``fn(iteration)``, written and never multiplied, so the rates are the function's to
    the bit. ``iteration`` is the 0-based index of the optimizer step about to be taken
    (``state.step`` without gradient accumulation, one per window with
    ``GradAccumulation``). A list of functions gives one per param group.
    """

    name = "lr_schedule"
    repeatable = False  # a second one would compound the first
    writes = ("lr",)

    def __init__(
        self,
        scheduler: Scheduler | Factory | str | Mapping[str, Any] | None = None,
        interval: str = "step",
        warmup_steps: int = 0,
        metric: str | None = None,
        *,
        lr_at: LRAt | Sequence[LRAt] | None = None,
        warmup: float | None = None,
    ) -> None:
        if interval not in INTERVALS:
            raise ValueError(
                f"LRSchedule(interval=) must be 'step' (after every optimizer step) "
                f"or 'epoch' (at every epoch end); got {interval!r}."
                f"{did_you_mean(interval, INTERVALS, cutoff=0.4)}"
            )
        whole_number(warmup_steps, "LRSchedule(warmup_steps=)", meaning="0: no warm-up")
        #: the metric ReduceLROnPlateau steps with (its own mode and patience decide)
        self.watcher = (
            None
            if metric is None
            else MetricWatcher(metric, owner="LRSchedule", reader=f"LRSchedule(metric={metric!r})")
        )
        #: the Hugging Face schedule named ("linear", "cosine", "constant"), or None
        self.named = scheduler if isinstance(scheduler, str) and scheduler in NAMED else None
        #: its warm-up: a ratio of the run's iterations (a float) or a count (an int)
        self.warmup = _checked_warmup(warmup, self.named)
        if self.named is not None and (
            lr_at is not None or warmup_steps or metric is not None or interval != "step"
        ):
            raise ValueError(
                f"LRSchedule({self.named!r}) is the whole schedule over the run's "
                f"iterations, its warm-up given by warmup=: give it without lr_at=, "
                f"warmup_steps=, metric= or interval="
            )
        #: the closed form (one function, or one per param group), or None
        self.lr_at = _checked_lr_at(lr_at)
        if self.named is not None:
            scheduler = None  # made at setup, over the run's length
        if lr_at is not None and (
            scheduler is not None or warmup_steps or metric is not None or interval != "step"
        ):
            raise ValueError(
                "LRSchedule(lr_at=) is the whole schedule, warm-up included, written "
                "before every iteration: give it alone, without a scheduler, "
                "warmup_steps=, metric= or interval="
            )
        if scheduler is None and warmup_steps == 0 and lr_at is None and self.named is None:
            raise ValueError(
                "LRSchedule needs a scheduler, warmup_steps= or both, or lr_at=; as in "
                f"LRSchedule({_FACTORY_EXAMPLE}) or LRSchedule(lr_at=lambda it: 1e-3)"
            )
        self.interval, self.warmup_steps, self.metric = interval, warmup_steps, metric
        self.reads = () if metric is None else (metric,)  # checked at setup
        self.scheduler: Scheduler | None = None  # the one stepping, from the run's start
        self._given: Scheduler | None = None
        self._factory: Factory | None = None
        if isinstance(scheduler, (lr_scheduler.LRScheduler, lr_scheduler.ReduceLROnPlateau)):
            self._given = self.scheduler = scheduler
            self._check_kind(scheduler)
        elif isinstance(scheduler, (str, Mapping)):
            self._factory = _named(scheduler)
        elif callable(scheduler):
            self._factory = scheduler
        elif scheduler is not None:
            raise TypeError(
                f"LRSchedule takes a torch.optim.lr_scheduler scheduler, a factory "
                f"called with the optimizer ({_FACTORY_EXAMPLE}), a scheduler's "
                f"name such as 'StepLR', or None; got {scheduler!r}"
            )
        self._optimizer: torch.optim.Optimizer | None = None
        self._base: list[Any] = []  # the lrs without a scheduler: each group's initial_lr
        self._pending: dict[str, Any] | None = None  # a checkpoint's, until the run starts
        self._saved_kind: str | None = None  # the checkpoint's scheduler's class name
        self._restored = False
        self._phased = True  # whether the model's train step fires optimizer_step
        #: optimizer steps taken (in the whole training: it resumes); the warm-up's clock
        self.optimizer_steps = 0
        #: a named schedule's (warm-up, total) iterations, once a run laid it out
        self.length: tuple[int, int] | None = None

    def hooks(self) -> Iterator[Hook]:
        # after setup hooks that regroup the optimizer (Unfreeze's runs at priority 50)
        yield Hook(
            self.setup,
            "setup",
            HookOptions.of(
                priority=-50, after="unfreeze.setup", modes="train", name="lr_schedule.setup"
            ),
        )
        has_scheduler = self._given is not None or self._factory is not None
        if (
            self.warmup_steps
            or self.lr_at is not None
            or self.named is not None
            or (has_scheduler and self.interval == "step")
        ):
            # around the optimizer step itself, inside the overrides that may skip it
            # (GradAccumulation, NaNGuard, GradClip: priorities 300..100) and outside the
            # amp backend's scaler step (-100): it counts the optimizer's real steps
            yield Hook(
                self.stepped,
                "optimizer_step",
                HookOptions.of(priority=-50, modes="train", name="lr_schedule.stepped"),
                override=True,
            )
            # a train step of the model's own has no optimizer_step phase: each step is one
            yield Hook(
                self.step,
                "runstep",
                HookOptions.of(priority=-500, modes="train", name="lr_schedule.step"),
            )
        if has_scheduler and self.interval == "epoch":
            # after Evaluate put its metrics and TensorBoard logged this epoch's lr; before
            # a checkpoint saves the epoch
            yield Hook(
                self.epoch_end,
                "epoch_end",
                HookOptions.of(
                    priority=-150, after="evaluate", modes="train", name="lr_schedule.epoch"
                ),
            )
            yield Hook(
                self.epoch_start,
                "epoch_start",
                HookOptions.of(modes="train", name="lr_schedule.epoch_start"),
            )

    # -- the run ------------------------------------------------------------------------------

    def setup(self, engine: Engine) -> None:
        optimizer = getattr(engine.model, "optimizer", None)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"LRSchedule needs the model's optimizer when the run starts; "
                f"{type(engine.model).__name__}.optimizer is {optimizer!r}"
            )
        self._optimizer, groups = optimizer, optimizer.param_groups
        if self._factory is not None:
            self.scheduler = self._build(optimizer)
        elif self._given is not None:
            self._check_given(self._given, optimizer)
        if self._pending is not None:
            if self.scheduler is not None:
                self.scheduler.load_state_dict(self._pending)
            self._pending = None
        restored = self._restored
        if not restored:  # a run from the start
            self.optimizer_steps = 0
        self._restored = False
        model = engine.model
        self._phased = isinstance(model, TorchModel) and model.interface.phased
        if self.named is not None:  # over this run's length, from each group's initial lr
            self.lr_at = self._laid_out(engine, groups)
        if self.lr_at is not None:
            self.optimizer_steps = engine.state.iteration  # the engine's count: one place
            self._write(groups, self.optimizer_steps)
            engine.state.metrics["lr"] = float(groups[0]["lr"])
            return
        # the lr before warm-up: the scheduler's, or the group's own (kept in initial_lr as
        # torch's schedulers do, so that a second run of the same optimizer finds it)
        self._base = [g.setdefault("initial_lr", g["lr"]) for g in groups]
        if self.optimizer_steps < self.warmup_steps:
            self._warm(groups, self.optimizer_steps)
        if not restored or "lr" not in engine.state.metrics:
            # a resumed run's optimizer gets its checkpoint's lr after the setup hooks: the
            # lr until the next step is the checkpoint's, which state.metrics holds already
            engine.state.metrics["lr"] = float(groups[0]["lr"])

    def stepped(self, engine: Engine, default: Callable[[Engine], Any]) -> None:
        """The optimizer step, then this pack's step after it."""
        default(engine)
        self._after_optimizer_step(engine)

    def step(self, engine: Engine) -> None:
        """After a train step of the model's own (no optimizer_step phase)."""
        if not self._phased:
            self._after_optimizer_step(engine)

    def _after_optimizer_step(self, engine: Engine) -> None:
        """Step the scheduler (interval="step"), then set the warm-up's lr for the next
        optimizer step."""
        groups = self._groups(engine)
        done = self.optimizer_steps
        if self.lr_at is not None:
            # the next iteration's: the engine counts them (the step's is state.iteration)
            self.optimizer_steps = engine.state.iteration + 1
            self._write(groups, self.optimizer_steps)
            engine.state.metrics["lr"] = float(groups[0]["lr"])
            return
        warming = done < self.warmup_steps
        if self.interval == "step" and (scheduler := self.scheduler) is not None:
            if warming:
                self._unwarm(groups)
            scheduler.step()
        self.optimizer_steps = done + 1
        if warming:
            self._warm(groups, done + 1)
        engine.state.metrics["lr"] = float(groups[0]["lr"])

    def epoch_end(self, engine: Engine) -> None:
        """At the end of each full epoch: step the scheduler (interval="epoch")."""
        s = engine.state
        scheduler = self.scheduler
        if not s.epoch_complete or scheduler is None:
            return  # an epoch cut short is run again by a resume: no step for it
        groups = self._groups(engine)
        warming = self.optimizer_steps < self.warmup_steps
        if warming:
            self._unwarm(groups)
        if isinstance(scheduler, lr_scheduler.ReduceLROnPlateau):
            assert self.watcher is not None  # a plateau scheduler has a metric: checked
            scheduler.step(self.watcher.read(s))
        else:
            scheduler.step()
        if warming:
            self._warm(groups, self.optimizer_steps)

    def epoch_start(self, engine: Engine) -> None:
        """The rate this epoch trains with (interval="epoch": set by the last epoch_end)."""
        engine.state.metrics["lr"] = float(self._groups(engine)[0]["lr"])

    # -- a closed form ------------------------------------------------------------------------

    def _write(self, groups: list[dict[str, Any]], iteration: int) -> None:
        """Every group's lr for ``iteration``: ``lr_at(iteration)`` as it returns it."""
        lr_at = self.lr_at
        if callable(lr_at):
            lr = float(lr_at(iteration))  # once per iteration, as a script calls it
            for group in groups:
                group["lr"] = lr
            return
        assert lr_at is not None
        if len(lr_at) != len(groups):
            raise ValueError(
                f"LRSchedule(lr_at=) has {len(lr_at)} functions, one per param group, "
                f"but the optimizer has {len(groups)} groups now; give one function "
                f"for all groups, or one per group"
            )
        for group, fn in zip(groups, lr_at, strict=True):
            group["lr"] = float(fn(iteration))

    def _laid_out(self, engine: Engine, groups: list[dict[str, Any]]) -> list[LRAt]:
        """The named schedule over the run's iterations, one function per param group: its
        initial lr times the factor of the Hugging Face schedule of that name."""
        total = run_iterations(engine)
        warmup = self.warmup
        steps = warmup if isinstance(warmup, int) else math.ceil(total * warmup)
        factor = functools.partial(FACTORS[self.named], warmup=steps, total=total)  # type: ignore[index]
        self.length = (steps, total)
        return [
            functools.partial(_scaled, factor, g.setdefault("initial_lr", g["lr"])) for g in groups
        ]

    # -- warm-up -------------------------------------------------------------------------------

    def _scheduled(self) -> list[Any]:
        return self.scheduler.get_last_lr() if self.scheduler is not None else self._base

    def _warm(self, groups: list[dict[str, Any]], step: int) -> None:
        """The lr of optimizer step ``step`` (0-based): ``(step + 1) / warmup_steps`` of
        the scheduled lr during the warm-up, the scheduled lr after it."""
        factor = (step + 1) / self.warmup_steps
        for group, lr in zip(groups, self._scheduled(), strict=True):
            group["lr"] = lr * factor if factor < 1 else lr

    def _unwarm(self, groups: list[dict[str, Any]]) -> None:
        """The scheduled lrs back in the groups, for a scheduler that reads them."""
        for group, lr in zip(groups, self._scheduled(), strict=True):
            group["lr"] = lr

    # -- checks --------------------------------------------------------------------------------

    def _groups(self, engine: Engine) -> list[dict[str, Any]]:
        optimizer = self._optimizer
        if engine.model.optimizer is not optimizer or optimizer is None:
            raise RuntimeError(
                "LRSchedule: the model's optimizer was replaced during the run, "
                "and the scheduler drives the old one; replace it in a setup "
                "hook of higher priority, before LRSchedule builds its scheduler"
            )
        return optimizer.param_groups

    def _build(self, optimizer: torch.optim.Optimizer) -> Scheduler:
        assert self._factory is not None
        try:
            scheduler = self._factory(optimizer)
        except (TypeError, ValueError) as error:
            raise type(error)(
                f"LRSchedule: the scheduler factory failed when called with the "
                f"optimizer: {error}; a factory takes the optimizer, as in "
                f"{_FACTORY_EXAMPLE}"
            ) from None
        if not isinstance(scheduler, (lr_scheduler.LRScheduler, lr_scheduler.ReduceLROnPlateau)):
            raise TypeError(
                f"LRSchedule: the factory returned {type(scheduler).__name__}, not a "
                f"torch.optim.lr_scheduler scheduler; as in {_FACTORY_EXAMPLE}"
            )
        self._check_kind(scheduler)
        return scheduler

    def _check_kind(self, scheduler: Scheduler) -> None:
        plateau = isinstance(scheduler, lr_scheduler.ReduceLROnPlateau)
        if plateau and (self.metric is None or self.interval != "epoch"):
            raise ValueError(
                "LRSchedule: ReduceLROnPlateau steps on a metric at epoch ends; give "
                "interval='epoch' and metric= (as in metric='eval_loss', which "
                "the Evaluate pack puts into state.metrics)"
            )
        if not plateau and self.metric is not None:
            raise ValueError(
                f"LRSchedule(metric={self.metric!r}) is for ReduceLROnPlateau; "
                f"{type(scheduler).__name__} steps without a metric: leave it out"
            )

    def _check_given(self, scheduler: Scheduler, optimizer: torch.optim.Optimizer) -> None:
        if scheduler.optimizer is not optimizer:
            raise ValueError(
                "LRSchedule: the scheduler was made for another optimizer than the "
                "model's (its setup() makes a new one); pass a factory instead, as "
                f"in LRSchedule({_FACTORY_EXAMPLE})"
            )
        made_for = len(getattr(scheduler, "min_lrs", None) or getattr(scheduler, "base_lrs", []))
        if made_for != len(optimizer.param_groups):
            raise ValueError(
                f"LRSchedule: the scheduler was made for {made_for} param group(s) "
                f"but the optimizer has {len(optimizer.param_groups)} now (a setup "
                f"hook such as Unfreeze(lr_scale=) regrouped it); pass a factory, "
                f"which is called after that: LRSchedule({_FACTORY_EXAMPLE})"
            )

    # -- state ---------------------------------------------------------------------------------

    def kind(self) -> str | None:
        """The scheduler's class name, where it is known before the run builds it (a
        named schedule's name, as ``"linear"``)."""
        if self.named is not None:
            return self.named
        if self.scheduler is not None:
            return type(self.scheduler).__name__
        factory = self._factory
        if isinstance(factory, functools.partial):
            return getattr(factory.func, "__name__", None)
        return self._saved_kind

    def check_setup(self, engine: Engine) -> None:
        """The model has an optimizer (it schedules its learning rate). An extended run
        (more epochs or steps than it was started with) must end as a run started with the
        larger number would: a schedule laid out over the run's length cannot, so it is
        refused."""
        require_optimizer(
            engine,
            "LRSchedule",
            "schedules the learning rate of the optimizer's param groups",
            modes=("train",),
        )
        kind = self.kind()
        if engine.extension is None or engine.state.kind != "train":
            return
        if kind in LENGTH_DEPENDENT or self.named is not None:
            raise ValueError(
                f"this run extends the run it continues ({engine.extension}), and "
                f"its learning rate schedule {kind} is laid out over the run's "
                f"total length: the extended run would not equal a run started "
                f"with the larger length. Start a new run with that length, or "
                f"use a schedule that does not depend on it (StepLR, "
                f"ExponentialLR...)"
            )
        last = (self._pending or {}).get("_last_lr")
        if isinstance(last, list) and last and all(float(lr) == 0.0 for lr in last):
            raise ValueError(
                f"this run extends the run it continues ({engine.extension}), and its "
                f"learning rate schedule {kind} ended that run at lr 0, where it stays: "
                f"the extra steps would train at lr 0 and change nothing. Start a new "
                f"run with the longer length, or give the schedule a last lr above 0 "
                f"(LinearLR(end_factor=...) > 0)"
            )

    def state_dict(self) -> dict[str, Any]:
        scheduler = self.scheduler.state_dict() if self.scheduler is not None else self._pending
        return {
            "scheduler": scheduler,
            "optimizer_steps": self.optimizer_steps,
            "kind": self.kind(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # given to the scheduler when the run starts: a factory's is made only then
        self._pending = state.get("scheduler")
        self._saved_kind = state.get("kind")
        self.optimizer_steps, self._restored = int(state.get("optimizer_steps", 0)), True


# -- the Hugging Face schedules ------------------------------------------------------------------


def _linear(it: int, *, warmup: int, total: int) -> float:
    # transformers' _get_linear_schedule_with_warmup_lr_lambda, to the bit
    if it < warmup:
        return float(it) / float(max(1, warmup))
    return max(0.0, float(total - it) / float(max(1, total - warmup)))


def _cosine(it: int, *, warmup: int, total: int) -> float:
    # transformers' _get_cosine_schedule_with_warmup_lr_lambda (half a cycle), to the bit
    if it < warmup:
        return float(it) / float(max(1, warmup))
    progress = float(it - warmup) / float(max(1, total - warmup))
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress)))


def _constant(it: int, *, warmup: int, total: int) -> float:
    # transformers' _get_constant_schedule_with_warmup_lr_lambda, to the bit
    if it < warmup:
        return float(it) / float(max(1.0, warmup))
    return 1.0


def _scaled(factor: Callable[[int], float], base: float, it: int) -> float:
    return base * factor(it)  # as LambdaLR: the base lr times the factor


#: The named schedules: the factor of a group's initial lr at an iteration.
FACTORS: dict[str, Callable[..., float]] = {
    "linear": _linear,
    "cosine": _cosine,
    "constant": _constant,
}
NAMED = tuple(FACTORS)


def run_iterations(engine: Engine) -> int:
    """The optimizer steps the run's budget makes: the fewest of what its ``steps=`` and
    its ``epochs=`` (one epoch when neither is given) come to, an epoch being
    ``ceil(batches / k)`` optimizer steps under ``GradAccumulation(k)`` (its last,
    shorter window steps too)."""
    from .grad_accumulation import GradAccumulation

    state = engine.state
    k = next((p.k for p in engine.table.packs.values() if isinstance(p, GradAccumulation)), 1)
    try:
        batches: int | None = len(engine.model.train_data)
    except TypeError:  # no train_data, or no length
        batches = None
    counts = []
    iterations = state.max_iterations
    if iterations is not None:
        counts.append(iterations)
    if state.max_steps is not None:
        steps = state.max_steps
        if batches:
            counts.append((steps // batches) * -(-batches // k) + -(-(steps % batches) // k))
        else:
            counts.append(-(-steps // k))
    epochs = state.max_epochs
    if epochs is None and not counts:
        epochs = 1  # the model's loop: one epoch
    if epochs is not None:
        if not batches:
            raise ValueError(
                "LRSchedule lays its schedule out over the run's iterations, and this "
                "run's length is in epochs of train data without a length: give the run "
                "steps= (its budget), or train data with a len()"
            )
        counts.append(epochs * -(-batches // k))
    return min(counts)


def _checked_warmup(warmup: object, named: str | None) -> float | int:
    """``warmup=``: a ratio in [0, 1] (a float) or a count of iterations (an int >= 0),
    for a named schedule only."""
    if warmup is None:
        return 0
    if named is None:
        raise ValueError(
            f"LRSchedule(warmup={warmup!r}) is the warm-up of a named schedule "
            f"({', '.join(map(repr, NAMED))}), as in LRSchedule('linear', warmup=0.06); "
            f"with a torch scheduler, give warmup_steps="
        )
    if isinstance(warmup, bool) or not isinstance(warmup, (int, float)):
        raise TypeError(
            f"LRSchedule(warmup=) is a ratio of the run's iterations (a float such as "
            f"0.06) or a count of them (an int); got {warmup!r}"
        )
    if isinstance(warmup, int):
        whole_number(warmup, "LRSchedule(warmup=)", meaning="0: no warm-up")
        return warmup
    if not 0.0 <= warmup <= 1.0:
        raise ValueError(
            f"LRSchedule(warmup={warmup!r}): a float is the ratio of the run's iterations "
            f"that warm up, from 0 to 1; a count of iterations is an int"
        )
    return warmup


def _checked_lr_at(lr_at: object) -> LRAt | list[LRAt] | None:
    """``lr_at=``: None, a function of the iteration, or a non-empty list of them."""
    if lr_at is None or callable(lr_at):
        return lr_at
    if (
        isinstance(lr_at, Sequence)
        and not isinstance(lr_at, str)
        and lr_at
        and all(callable(fn) for fn in lr_at)
    ):
        return list(lr_at)
    raise TypeError(
        f"LRSchedule(lr_at=) takes a function of the iteration that returns its learning "
        f"rate (lr_at=get_lr, as in nanoGPT), or a list of them, one per param group; "
        f"got {lr_at!r}"
    )


def _named(spec: str | Mapping[str, Any]) -> Factory:
    """A factory of the torch scheduler a config names: ``"StepLR"`` (any case, ``_`` and
    all: ``"step_lr"``) or ``{"type": "StepLR", "args": {"step_size": 2}}``; checked now on
    a stand-in optimizer, so a bad name or bad arguments fail when the pack is made."""
    args: dict[str, Any] = {}
    if isinstance(spec, str):
        name = spec
    else:
        kind, given = spec.get("type"), spec.get("args") or {}
        if (
            set(spec) - {"type", "args"}
            or not isinstance(kind, str)
            or not isinstance(given, Mapping)
        ):
            raise TypeError(
                f"LRSchedule: a scheduler spec is {{'type': 'StepLR', 'args': "
                f"{{'step_size': 2}}}}; got {dict(spec)!r}"
            )
        name, args = kind, dict(given)
    known = {
        n.lower(): n
        for n in dir(lr_scheduler)
        if n not in _NOT_BY_NAME
        and isinstance(getattr(lr_scheduler, n), type)
        and issubclass(
            getattr(lr_scheduler, n), (lr_scheduler.LRScheduler, lr_scheduler.ReduceLROnPlateau)
        )
    }
    key = name.replace("_", "").lower()
    if key not in known:
        choices = sorted(known.values())
        hint = did_you_mean(name, choices + list(_NOT_BY_NAME))
        raise ValueError(
            f"LRSchedule: no torch.optim.lr_scheduler scheduler named {name!r} that "
            f"a name can make.{hint} Named: {', '.join(choices)}; the others "
            f"({', '.join(_NOT_BY_NAME[2:])}) take Python functions: pass a factory. "
            f"The schedules over the run's length: {', '.join(map(repr, NAMED))}"
        )
    cls = getattr(lr_scheduler, known[key])
    stand_in = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1, momentum=0.9)
    try:
        cls(stand_in, **args)
    except (TypeError, ValueError) as error:
        raise type(error)(
            f"LRSchedule: {cls.__name__}(optimizer, **{args!r}) fails: {error}"
        ) from None
    return functools.partial(cls, **args)

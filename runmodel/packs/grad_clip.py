"""Clip gradients before the optimizer steps: their total norm, or each element."""

from __future__ import annotations

import math
from typing import Any

import torch

from ..core import HookHandle, Pack, hook, override
from ..core.checks import is_number
from ..models.torchutil import needs_closure, unwrap
from ._common import require_phased_step, trained_parameters

__all__ = ["GradClip"]

#: The modes whose steps may be train steps (benchmark and profile can measure them).
TRAIN_MODES = ("train", "benchmark", "profile")


class GradClip(Pack):
    """Clip the gradients once per optimizer step, just before it: ``max_norm=`` scales
    them so that their total ``norm_type``-norm is at most ``max_norm``
    (``torch.nn.utils.clip_grad_norm_``), ``value=`` clamps each element to
    ``[-value, value]`` (``clip_grad_value_``); give exactly one.

    The gradients are those of the parameters of ``engine.model.optimizer`` (read at
    each step), taken in the module's order (``module.parameters()``) and then the
    optimizer's others in its groups' order: so the total norm is, to the bit, that of
    ``clip_grad_norm_(model.parameters(), max_norm)`` in a script, whatever groups the
    optimizer has. A model that has no optimizer (its update is an override of
    ``optimizer_step``, which runs after the clipping) clips its module's parameters. With a
    closure optimizer (``torch.optim.LBFGS``) the clipping is a ``backward`` hook of the
    run instead: each call of the closure clips the gradients it computed, before the
    optimizer reads them. With a GradScaler in ``engine.state.grad_scaler`` (the ``amp`` backend,
    float16 on CUDA) they are unscaled first (``scaler.unscale_(optimizer)``), so that
    clipping sees the true gradients. An override of ``optimizer_step`` at priority 100:
    inside ``GradAccumulation`` (300) and ``NaNGuard`` (200), outside the amp backend's
    scaler step (-100), so it clips the accumulated gradient of each real step.

    With ``max_norm=``, ``last_norm`` is the latest total norm before clipping (a tensor
    on the gradients' device: reading it is a sync, so nothing here reads it per step),
    and at each epoch end ``state.metrics["grad_norm"]`` is the mean of the epoch's
    finite norms (one sync per epoch; ``nan`` when none was finite).
    """

    name = "grad_clip"
    repeatable = False  # a second one would compound the first
    writes = ("grad_norm",)

    def __init__(
        self, max_norm: float | None = None, value: float | None = None, norm_type: float = 2.0
    ) -> None:
        if (max_norm is None) == (value is None):
            raise ValueError(
                f"GradClip takes exactly one of max_norm= (clip the total norm) "
                f"and value= (clip each element); got max_norm={max_norm!r}, "
                f"value={value!r}"
            )
        self.max_norm = None if max_norm is None else _positive("max_norm", max_norm)
        self.value = None if value is None else _positive("value", value)
        self.norm_type = _positive("norm_type", norm_type, inf=True)
        self.last_norm: torch.Tensor | None = None
        # what _parameters was listed from: the module, the optimizer, and its number of
        # groups and of parameters (a group added or a parameter appended changes them)
        self._listed_from: tuple[Any, ...] = ()
        self._parameters: list[torch.Tensor] = []
        self._epoch: _NormMean | None = None
        self._in_closure: HookHandle | None = None  # the backward hook of a closure's run

    @hook(modes=TRAIN_MODES)
    def setup(self, engine: Any) -> None:
        """A new run; in train mode, check that its step fires optimizer_step (else this
        pack would never run). With a closure optimizer, hook ``backward`` for the run."""
        self.last_norm, self._epoch = None, None
        require_phased_step(engine, type(self).__name__, "the optimizer_step phase")
        optimizer = getattr(engine.model, "optimizer", None)
        if engine.state.kind == "train" and optimizer is not None and needs_closure(optimizer):
            # each call of the closure clips the gradients it computed
            self._in_closure = engine.on(
                "backward",
                self.clip_now,
                priority=-100,
                modes=TRAIN_MODES,
                name="grad_clip.in_closure",
            )

    @override("optimizer_step", priority=100, modes=TRAIN_MODES)
    def clip(self, engine: Any, default: Any) -> None:
        """Unscale (with a GradScaler), clip, then step (with a closure optimizer: step;
        the closure clips)."""
        if self._in_closure is None:
            self.clip_now(engine)
        default(engine)

    @hook(modes=TRAIN_MODES)
    def teardown(self, engine: Any) -> None:
        if self._in_closure is not None:
            self._in_closure.detach()
            self._in_closure = None

    def clip_now(self, engine: Any) -> None:
        """Unscale (with a GradScaler) and clip the gradients there are now."""
        model = engine.model
        optimizer = model.optimizer
        scaler = engine.state.grad_scaler
        if scaler is not None:
            scaler.unscale_(optimizer)
        parameters = (
            self.parameters_of(optimizer, getattr(model, "module", None))
            if optimizer is not None
            else trained_parameters(model)
        )
        if self.max_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(parameters, self.max_norm, self.norm_type)
            self.last_norm = norm
            if self._epoch is None or not self._epoch.fits(norm):
                self._epoch = _NormMean(norm)
            self._epoch.add(norm)
        else:
            assert self.value is not None
            torch.nn.utils.clip_grad_value_(parameters, self.value)

    @hook(modes=TRAIN_MODES)
    def epoch_end(self, engine: Any) -> None:
        """``metrics["grad_norm"]``: the epoch's mean finite norm (one sync)."""
        if self._epoch is not None and self._epoch.steps:
            engine.state.metrics["grad_norm"] = self._epoch.mean_and_reset()

    def parameters_of(
        self, optimizer: torch.optim.Optimizer, module: torch.nn.Module | None = None
    ) -> list[torch.Tensor]:
        """The optimizer's parameters in ``module``'s order, then those outside the module
        in the groups' order; listed again only when the module, the optimizer or its
        numbers of groups and parameters change."""
        groups = optimizer.param_groups
        listed_from = (module, optimizer, len(groups), sum(len(g["params"]) for g in groups))
        if listed_from != self._listed_from:
            optimized = {id(p): p for group in groups for p in group["params"]}
            inner = unwrap(module)
            in_module = [] if inner is None else list(inner.parameters())
            ordered = [p for p in in_module if id(p) in optimized]
            for p in ordered:
                del optimized[id(p)]
            self._parameters = ordered + list(optimized.values())
            self._listed_from = listed_from
        return self._parameters


def _positive(option: str, number: object, inf: bool = False) -> float:
    """``number`` as a float, if it is a number > 0 (finite unless ``inf``)."""
    if not is_number(number, above=0) or (number == math.inf and not inf):  # nan is not > 0
        raise ValueError(
            f"GradClip {option}= must be a number > 0{' (or inf)' if inf else ''}, got {number!r}"
        )
    return float(number)


class _NormMean:
    """The sum and count of finite norms, on the norms' device: adding one allocates
    nothing and reads nothing back; ``mean_and_reset`` reads both once."""

    def __init__(self, like: torch.Tensor) -> None:
        self.device, self.dtype = like.device, like.dtype
        self.totals = torch.zeros(2, device=like.device, dtype=torch.float32)
        self.sum, self.count = self.totals[0], self.totals[1]
        self.finite = torch.zeros((), device=like.device, dtype=like.dtype)
        self.is_finite = torch.zeros((), device=like.device, dtype=torch.bool)
        self.steps = 0

    def fits(self, norm: torch.Tensor) -> bool:
        return norm.device == self.device and norm.dtype == self.dtype

    def add(self, norm: torch.Tensor) -> None:
        torch.nan_to_num(norm, nan=0.0, posinf=0.0, neginf=0.0, out=self.finite)
        torch.eq(norm, self.finite, out=self.is_finite)  # False for inf and nan
        self.sum.add_(self.finite)
        self.count.add_(self.is_finite)
        self.steps += 1

    def mean_and_reset(self) -> float:
        total, count = self.totals.tolist()
        self.totals.zero_()
        self.steps = 0
        return total / count if count else math.nan

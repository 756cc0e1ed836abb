"""An exponential moving average of the module's weights, updated after every optimizer
step (``torch.optim.swa_utils``: ``AveragedModel`` with ``get_ema_multi_avg_fn``). What
EMA and SWA share, swapping the average in for evaluation and out after, and into the
trained weights at the end (``use_averaged``), is ``weight_averaging.py``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.optim.swa_utils import get_ema_multi_avg_fn

from ..core import override
from ..core.checks import is_number
from ._common import require_phased_step
from .weight_averaging import WeightAveraging

__all__ = ["EMA"]


class EMA(WeightAveraging):
    """Keep ``averaged``, an exponential moving average of the module's weights: after
    each optimizer step, ``averaged = decay * averaged + (1 - decay) * weights`` (the
    first step copies them), through ``torch.optim.swa_utils.AveragedModel`` and
    ``get_ema_multi_avg_fn(decay)``, exactly as a hand-written loop calling
    ``ema.update_parameters(module)`` after ``optimizer.step()`` does. With
    ``use_buffers=True`` (the default) the buffers (batch-norm statistics) are averaged
    too; with False they are the module's own.

    ``use_averaged=True``: the run's ``Evaluate`` packs evaluate the averaged weights, so
    ``eval_*`` metrics, ``EarlyStopping`` and ``Checkpoint(best=)`` see them. Either way
    the average is in every checkpoint (the pack's state), a resumed run continues it
    exactly, and ``runmodel eval RUN_DIR --averaged`` / ``runmodel export PATH OUT
    --averaged`` use it. ``averaged_weights()`` puts it in the module for a block of
    your own.

    Updated where the optimizer really steps (an override of ``optimizer_step`` at
    priority -60: inside ``GradAccumulation``, ``NaNGuard`` and ``GradClip``, so a
    window's micro-steps or a skipped step do not count; outside the amp backend's scaler
    step). Refused under ``fsdp`` (the module's weights are sharded).
    """

    name = "ema"

    def __init__(
        self, decay: float = 0.999, use_averaged: bool = False, use_buffers: bool = True
    ) -> None:
        if not is_number(decay) or not 0 <= decay <= 1:
            raise ValueError(
                f"EMA(decay=) is the weight of the average so far, a number in "
                f"[0, 1] such as 0.999; got {decay!r}"
            )
        if not isinstance(use_buffers, bool):
            raise TypeError(f"EMA(use_buffers=) takes True or False, got {use_buffers!r}")
        super().__init__(use_averaged=use_averaged, use_buffers=use_buffers)
        self.decay = float(decay)
        self.multi_avg_fn = get_ema_multi_avg_fn(self.decay)

    def check_setup(self, engine: Any) -> None:
        super().check_setup(engine)
        if engine.state.mode == "train":
            require_phased_step(engine, "EMA", "the optimizer_step phase")

    @override("optimizer_step", priority=-60, modes="train")
    def averaged_step(self, engine: Any, default: Callable[[Any], Any]) -> None:
        default(engine)
        self.update(engine)

"""Accumulate gradients over k micro-batches before each optimizer step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core import Pack, hook, override
from ._common import require_phased_step

__all__ = ["GradAccumulation"]

#: The modes whose steps may be train steps (benchmark and profile can measure them).
TRAIN_MODES = ("train", "benchmark", "profile")


class GradAccumulation(Pack):
    """Step the optimizer once every ``k`` steps (micro-batches), on the sum of their
    gradients, each loss scaled by ``1/k``: for a mean-reduced loss, ``k`` batches of
    ``B`` rows make the step one batch of ``k*B`` rows would.

    Windows are counted within the epoch, from ``state.epoch_step``: the optimizer
    steps after the k-th, 2k-th, ... step of each epoch, and at the end of the epoch
    when its step count is not a multiple of ``k`` (a shorter last window, still scaled
    by ``1/k``, as PyTorch Lightning and the usual hand-written loop do). So the
    position in a window is a function of the run's counters, and a resumed run (which
    starts an epoch's data from its beginning) starts a new window with it.

    Overrides ``backward`` (the loss divided by ``k``; hooks still see the true loss) and
    ``optimizer_step`` at priority 300, outside every other built-in override: clipping
    (``GradClip``), ``NaNGuard`` and the amp backend's GradScaler step run once per real
    step, on the accumulated gradient. ``optimizer_step`` *hooks* still fire at every
    step, since the phase does.
    """

    name = "grad_accumulation"

    def __init__(self, k: int) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"GradAccumulation(k): k is the number of steps (micro-batches) "
                             f"per optimizer step, a whole number >= 1; got {k!r}")
        self.k = k
        # the optimizer_step chain inside this override, kept from the latest step for
        # the step at an epoch's end
        self._step: Callable[[Any], Any] | None = None

    @hook(modes=TRAIN_MODES)
    def setup(self, engine: Any) -> None:
        """A new run; in train mode, check that its step fires backward and
        optimizer_step (else this pack would never run)."""
        self._step = None
        require_phased_step(engine, type(self).__name__)

    @override("backward", priority=300, modes=TRAIN_MODES)
    def scaled_backward(self, engine: Any, default: Callable[[Any], Any]) -> None:
        """Backward on ``loss / k``; ``state.loss`` is the true loss again afterwards."""
        state = engine.state
        loss = state.loss
        state.loss = loss / self.k
        try:
            default(engine)
        finally:
            state.loss = loss

    @override("optimizer_step", priority=300, modes=TRAIN_MODES)
    def accumulate(self, engine: Any, default: Callable[[Any], Any]) -> None:
        """Step (and zero the gradients) only at the end of a window."""
        self._step = default
        if (engine.state.epoch_step + 1) % self.k == 0:
            default(engine)

    @hook(priority=1000, modes=TRAIN_MODES)  # first: checkpoints and metrics see the step
    def epoch_end(self, engine: Any) -> None:
        """Step on the epoch's last, shorter window, if it has one."""
        if self._step is not None and engine.state.epoch_step % self.k:
            self._step(engine)

    def teardown(self, engine: Any) -> None:
        self._step = None  # the chain holds the model; let it go with the run

"""Keep loss spikes out of the weights: a step whose loss jumps far above the running
median of the last steps is skipped, or ends the run."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

from ..core import Pack, hook, override
from ..core.checks import whole_number
from ._common import refuse_closure_optimizer, require_phased_step, zero_grads
from ._divergence import agreed_failure, record, world

__all__ = ["SpikeGuard"]

#: The modes whose steps may be train steps (benchmark and profile can measure them).
TRAIN_MODES = ("train", "benchmark", "profile")
ACTIONS = ("skip", "stop")


class SpikeGuard(Pack):
    """After each backward, compare the step's loss with the median of the training
    losses of the last ``window`` steps: a loss above ``threshold`` times that median is
    a spike. On a spike the optimizer step is not taken and the gradients are zeroed (as
    ``NaNGuard``'s skip), and then ``action="skip"`` goes on with the next batch, while
    ``action="stop"`` ends the run after this step with ``engine.stop(reason)``.

    The rule: a median, not a mean, so that one spike does not raise the bar for the
    next; a ratio, so the same ``threshold`` fits any loss scale (it assumes a positive
    loss, as cross-entropy and squared errors are). The guard is armed once ``window``
    losses are in; skipped steps stay out of the window, and so do non-finite losses
    (``NaNGuard``'s business). The window lives on the loss's device: a step adds its
    loss there without a sync; each armed step reads one number back (the verdict),
    which it must before the update is taken.

    Each spike is counted in ``spikes`` and ``state.metrics["spikes"]``, said on
    stderr (by rank 0) and recorded, with the loss and the median, in the run folder's
    ``divergence.json`` and ``engine.state.divergence``. The window and the records are
    in the checkpoint, so a resumed run sees the same window and takes the same skips.
    In a distributed run the verdict is agreed: a spike on any process skips (or stops
    at) the step on all; each process's window holds its own losses.
    """

    name = "spike_guard"
    writes = ("spikes",)

    def __init__(self, action: str = "skip", window: int = 32, threshold: float = 4.0) -> None:
        if action not in ACTIONS:
            raise ValueError(
                f"SpikeGuard action= must be 'skip' (skip the step and go on) or "
                f"'stop' (end the run), got {action!r}"
            )
        whole_number(window, "SpikeGuard window=", least=2, meaning="the steps of the median")
        if not isinstance(threshold, (int, float)) or not threshold > 1:
            raise ValueError(
                f"SpikeGuard threshold= is how many times the running median a loss must "
                f"exceed to be a spike, a number above 1, got {threshold!r}"
            )
        self.action, self.window, self.threshold = action, window, float(threshold)
        self.spikes = 0  # steps skipped for a spike, over the whole training
        self.records: list[dict[str, Any]] = []  # each spike's record, oldest first
        self._losses: torch.Tensor | None = None  # the window, on the loss's device
        self._seen = 0  # losses put into the window, over the whole training
        self._found: str | None = None  # this step's spike, until its optimizer step
        self._processes = 1

    def check_setup(self, engine: Any) -> None:
        """A closure optimizer is refused: its step cannot be skipped."""
        refuse_closure_optimizer(
            engine,
            type(self).__name__,
            "its loss is known only once the optimizer moved the weights for it, "
            "so a spike's step cannot be skipped",
        )

    @hook(modes=TRAIN_MODES)
    def setup(self, engine: Any) -> None:
        """A new run; in train mode, check that its step fires backward and
        optimizer_step (else this pack would never run)."""
        self._found, self._processes = None, world()
        require_phased_step(engine, type(self).__name__)

    @hook(priority=999, modes=TRAIN_MODES)  # before hooks that read gradients
    def backward(self, engine: Any) -> None:
        """The check once armed; then the loss into the window unless it spiked."""
        state = engine.state
        loss = state.loss.detach().reshape(()).float()
        if self._losses is None:
            self._losses = torch.full((self.window,), torch.nan, device=loss.device)
        elif self._losses.device != loss.device:  # loaded from a checkpoint, on the CPU
            self._losses = self._losses.to(loss.device)
        if self._seen >= self.window:
            median = self._losses.nanmedian()
            failed = agreed_failure(~(loss > self.threshold * median), state.rank, self._processes)
            if failed is not None:
                self._spike(engine, loss, median, failed)
                return
        # non-finite losses are NaNGuard's: kept out as NaN, which nanmedian passes over
        self._losses[self._seen % self.window] = torch.where(loss.isfinite(), loss, torch.nan)
        self._seen += 1

    @override("optimizer_step", priority=200, modes=TRAIN_MODES)
    def guard(self, engine: Any, default: Callable[[Any], Any]) -> None:
        """Step, unless this step's loss spiked."""
        if self._found is None:
            default(engine)
            return
        self._found = None
        zero_grads(engine.model)

    @hook(modes=TRAIN_MODES)
    def epoch_end(self, engine: Any) -> None:
        engine.state.metrics["spikes"] = self.spikes

    def state_dict(self) -> dict[str, Any]:
        window = self._losses.tolist() if self._losses is not None else None
        return {
            "spikes": self.spikes,
            "records": self.records,
            "seen": self._seen,
            "window": window,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.spikes, self._seen = int(state.get("spikes", 0)), int(state.get("seen", 0))
        self.records = list(state.get("records", []))
        window = state.get("window")
        self._losses = torch.tensor(window, dtype=torch.float32) if window is not None else None
        if self._losses is not None and len(self._losses) != self.window:
            raise ValueError(
                f"SpikeGuard: the checkpoint's window holds {len(self._losses)} losses, "
                f"this guard's window={self.window}"
            )

    def _spike(self, engine: Any, loss: torch.Tensor, median: torch.Tensor, rank: int) -> None:
        s = engine.state
        self.spikes += 1
        s.metrics["spikes"] = self.spikes
        where = "" if rank == s.rank else f" on process {rank}"
        entry = record(
            engine,
            {
                "guard": type(self).__name__,
                "action": self.action,
                "loss": float(loss),
                "median": float(median),
                "threshold": self.threshold,
                "rank": rank,
            },
        )
        self.records.append(entry)
        message = (
            f"{type(self).__name__}: loss spike{where} at step {s.step} (epoch {s.epoch}, "
            f"batch {s.epoch_step}): the step is skipped"
        )
        if rank == s.rank:
            message += (
                f"; loss {float(loss):.4g} > {self.threshold:g} x the median "
                f"{float(median):.4g} of the last {self.window} steps"
            )
        self._found = message
        if self.action == "stop":
            engine.stop(message)
        if s.rank == 0:
            print(message, file=sys.stderr)

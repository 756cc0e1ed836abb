"""Keep loss spikes out of the weights: a step whose loss jumps far above the running
median of the last steps is skipped, rolled back from an earlier checkpoint without its
batch, or ends the run."""

from __future__ import annotations

import math
import sys
from bisect import bisect_left, insort
from pathlib import Path
from typing import Any

import torch

from ..checkpoint.names import checkpoints_in, position
from ..core import hook
from ..core.checks import whole_number
from ._common import refuse_closure_optimizer, require_phased_step, zero_grads
from ._divergence import TRAIN_MODES, StepGuard, agreed_failure, record, world
from .checkpoint import Checkpoint

__all__ = ["SpikeGuard"]

ACTIONS = ("skip", "rollback", "stop")


class SpikeGuard(StepGuard):
    """After each backward, compare the step's loss with the median of the training
    losses of the last ``window`` steps: a loss above ``threshold`` times that median is
    a spike. On a spike the optimizer step is not taken and the gradients are zeroed (as
    ``NaNGuard``'s skip), and then ``action="skip"`` goes on with the next batch, while
    ``action="stop"`` ends the run after this step with ``engine.stop(reason)``.

    ``action="rollback"`` goes back instead: to the newest checkpoint of the run's
    ``Checkpoint`` pack (refused at setup without one) taken at least ``back`` steps
    before the spike's step, and trains on from there as a run resumed from it would,
    leaving out the spike's batch and the ``leave_out - 1`` batches after it in its epoch
    (``engine.leave_out``): each is drawn and dropped, without a step. Where no
    checkpoint is old enough, the spike's step is skipped as ``"skip"`` does.

    The rule: a median, not a mean, so that one spike does not raise the bar for the
    next; a ratio, so the same ``threshold`` fits any loss scale (it assumes a positive
    loss, as cross-entropy and squared errors are). The guard is armed once ``window``
    losses are in; skipped steps stay out of the window, and so do non-finite losses
    (``NaNGuard``'s business). Until it is armed the losses wait on their device, without
    a sync; from then on the window is kept on the host, and each step reads its loss
    back (one scalar read, which the verdict needs before the update is taken).

    Each spike is counted in ``spikes`` and ``state.metrics["spikes"]``, said on
    stderr (by rank 0) and recorded, with the loss and the median, in the run folder's
    ``divergence.json`` and ``engine.state.divergence``. The window, the records and the
    batches left out are in the checkpoint, so a resumed run sees the same window and
    takes the same skips and rollbacks at the same places. In a distributed run the
    verdict is agreed: a spike on any process skips, rolls back or stops the step on all;
    each process's window holds its own losses.
    """

    name = "spike_guard"
    writes = ("spikes",)

    def __init__(
        self,
        action: str = "skip",
        window: int = 32,
        threshold: float = 4.0,
        *,
        back: int = 0,
        leave_out: int = 1,
    ) -> None:
        if action not in ACTIONS:
            raise ValueError(
                f"SpikeGuard action= must be 'skip' (skip the step and go on), 'rollback' "
                f"(go back to a checkpoint and leave the spike's batch out) or 'stop' (end "
                f"the run), got {action!r}"
            )
        whole_number(window, "SpikeGuard window=", least=2, meaning="the steps of the median")
        if not isinstance(threshold, (int, float)) or not threshold > 1:
            raise ValueError(
                f"SpikeGuard threshold= is how many times the running median a loss must "
                f"exceed to be a spike, a number above 1, got {threshold!r}"
            )
        whole_number(back, "SpikeGuard back=", meaning="steps before the spike")
        whole_number(leave_out, "SpikeGuard leave_out=", least=1, meaning="batches")
        self.action, self.window, self.threshold = action, window, float(threshold)
        self.back, self.leave_out = back, leave_out
        self.spikes = 0  # spikes found, over the whole training
        self.records: list[dict[str, Any]] = []  # each spike's record, oldest first
        #: the rollbacks' batches left out: ``[epoch, first batch, count]``, oldest first
        self.left_out: list[list[int]] = []
        self._waiting: list[torch.Tensor] = []  # the losses before it is armed, on device
        self._ring: list[float] = []  # the window once armed: NaN for a non-finite loss
        self._sorted: list[float] = []  # its finite losses, sorted: the median's
        self._seen = 0  # losses put into the window, over the whole training
        self._rewinding = False  # a rollback's checkpoint is being loaded
        self._processes = 1

    def check_setup(self, engine: Any) -> None:
        """A closure optimizer is refused: its step cannot be skipped; so is a rollback
        without a Checkpoint pack to go back to."""
        refuse_closure_optimizer(
            engine,
            type(self).__name__,
            "its loss is known only once the optimizer moved the weights for it, "
            "so a spike's step cannot be skipped",
        )
        if self.action == "rollback" and engine.state.mode == "train" and not _checkpoints(engine):
            raise ValueError(
                "SpikeGuard(action='rollback') goes back to a checkpoint of the run, and "
                "no Checkpoint pack is attached: attach runmodel.packs.Checkpoint(directory, "
                "every=...) (a checkpoint every few hundred steps, say), or use "
                "action='skip'"
            )

    @hook(modes=TRAIN_MODES)
    def setup(self, engine: Any) -> None:
        """A new run; in train mode, check that its step fires backward and
        optimizer_step (else this pack would never run); the batches that earlier
        rollbacks left out stay out."""
        self._found, self._processes = None, world()
        require_phased_step(engine, type(self).__name__)
        for epoch, first, count in self.left_out:
            engine.leave_out(epoch, range(first, first + count))

    @hook(priority=999, modes=TRAIN_MODES)  # before hooks that read gradients
    def backward(self, engine: Any) -> None:
        """The check once armed; then the loss into the window unless it spiked."""
        state = engine.state
        if self._seen < self.window:  # not armed: no sync
            self._waiting.append(state.loss.detach().reshape(()).float())
            self._seen += 1
            if self._seen == self.window:
                self._arm()
            return
        value = state.loss.item()  # the one read
        median = self._median()
        ok = not value > self.threshold * median
        failed = agreed_failure(
            ok if self._processes == 1 else torch.tensor(ok, device=state.loss.device),
            state.rank,
            self._processes,
        )
        if failed is not None:
            self._spike(engine, value, median, failed)
            return
        at = self._seen % self.window
        old = self._ring[at]
        if not math.isnan(old):
            del self._sorted[bisect_left(self._sorted, old)]
        if math.isfinite(value):
            insort(self._sorted, value)
        else:  # non-finite losses are NaNGuard's: kept out of the median
            value = math.nan
        self._ring[at] = value
        self._seen += 1

    def _dropped(self) -> None:
        pass  # counted when found: in spikes

    @hook(modes=TRAIN_MODES)
    def epoch_start(self, engine: Any) -> None:
        engine.state.metrics["spikes"] = self.spikes  # also after a rollback's checkpoint

    @hook(modes=TRAIN_MODES)
    def epoch_end(self, engine: Any) -> None:
        engine.state.metrics["spikes"] = self.spikes

    def state_dict(self) -> dict[str, Any]:
        return {
            "spikes": self.spikes,
            "records": self.records,
            "left_out": self.left_out,
            "seen": self._seen,
            "window": self._window(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        window = state.get("window")
        if window is not None and len(window) != self.window:
            raise ValueError(
                f"SpikeGuard: the checkpoint's window holds {len(window)} losses, "
                f"this guard's window={self.window}"
            )
        self._seen, self._found = int(state.get("seen", 0)), None
        self._waiting, self._ring, self._sorted = [], [], []
        if window is not None:
            held = [float(x) for x in window]
            if self._seen < self.window:
                self._waiting = [torch.tensor(x) for x in held[: self._seen]]
            else:
                self._ring = held
                self._sorted = sorted(x for x in held if math.isfinite(x))
        if self._rewinding:  # a rollback's: the spikes and what they left out stay
            self._rewinding = False
            return
        self.spikes = int(state.get("spikes", 0))
        self.records = list(state.get("records", []))
        self.left_out = [[int(x) for x in entry] for entry in state.get("left_out", [])]

    # -- the window ---------------------------------------------------------------------

    def _arm(self) -> None:
        """The window is full: onto the host, in one read."""
        device = self._waiting[-1].device  # (those from a checkpoint are on the CPU)
        self._ring = torch.stack([t.to(device) for t in self._waiting]).tolist()
        self._ring = [x if math.isfinite(x) else math.nan for x in self._ring]
        self._sorted = sorted(x for x in self._ring if not math.isnan(x))
        self._waiting = []

    def _median(self) -> float:
        """The lower median of the window's finite losses (``torch.nanmedian``'s); NaN
        when none is finite (then nothing is a spike)."""
        n = len(self._sorted)
        return self._sorted[(n - 1) // 2] if n else math.nan

    def _window(self) -> list[float] | None:
        """The window as numbers in its order (NaN where no finite loss is)."""
        if self._seen >= self.window:
            return list(self._ring)
        if not self._seen:
            return None
        device = self._waiting[-1].device
        waiting: list[float] = torch.stack([t.to(device) for t in self._waiting]).tolist()
        finite = [x if math.isfinite(x) else math.nan for x in waiting]
        return finite + [math.nan] * (self.window - len(finite))

    # -- a spike --------------------------------------------------------------------------

    def _spike(self, engine: Any, loss: float, median: float, rank: int) -> None:
        s = engine.state
        self.spikes += 1
        s.metrics["spikes"] = self.spikes
        where = "" if rank == s.rank else f" on process {rank}"
        message = (
            f"{type(self).__name__}: loss spike{where} at step {s.step} (epoch {s.epoch}, "
            f"batch {s.epoch_step})"
        )
        if rank == s.rank:
            message += (
                f": loss {loss:.4g} > {self.threshold:g} x the median "
                f"{median:.4g} of the last {self.window} steps"
            )
        entry: dict[str, Any] = {
            "guard": type(self).__name__,
            "action": self.action,
            "loss": loss,
            "median": median,
            "threshold": self.threshold,
            "rank": rank,
        }
        again = self.action == "rollback" and self._in_replay(s.step)
        target = (
            self._checkpoint_before(engine) if self.action == "rollback" and not again else None
        )
        if self.action == "rollback" and target is None:
            entry["action"] = "skip"
            message += (
                "; it came back in the replay of a rollback (the batches left out were not "
                "its cause)"
                if again
                else f"; no checkpoint from {self.back} or more steps before it"
            )
        if target is None:
            self.records.append(record(engine, entry))
            message += "; the step is skipped"
            self._found = message
            if self.action == "stop":
                engine.stop(message)
            self._say(engine, message)
            return
        first, (_, to_step) = engine.batch_index(), position(target)
        self.left_out.append([s.epoch, first, self.leave_out])
        entry.update(batch=first, left_out=self.leave_out, checkpoint=target.name, to_step=to_step)
        self.records.append(record(engine, entry))
        last = first + self.leave_out - 1
        batches = f"batch {first}" if last == first else f"batches {first}-{last}"
        self._say(
            engine,
            f"{message}; rolled back to {target.name} (step {to_step}), leaving out "
            f"{batches} of epoch {s.epoch}",
        )
        engine.leave_out(s.epoch, range(first, first + self.leave_out))
        zero_grads(engine.model)  # the abandoned step's
        self._rewinding = True
        engine.rewind(target)

    def _in_replay(self, step: int) -> bool:
        """Whether ``step`` is at or before the spike the last rollback went back from:
        a spike in its replay, which another rollback would only repeat, without end."""
        last = next((r for r in reversed(self.records) if r["action"] == "rollback"), None)
        return last is not None and step <= last["step"]

    def _checkpoint_before(self, engine: Any) -> Path | None:
        """The newest checkpoint of the run taken ``back`` or more steps before this one."""
        latest = engine.state.step - self.back
        for pack in _checkpoints(engine):
            pack.wait()  # a checkpoint being written in the background
            for path in checkpoints_in(pack.directory):
                if 0 <= position(path)[1] <= latest:
                    return path
        return None

    @staticmethod
    def _say(engine: Any, message: str) -> None:
        if engine.state.rank == 0:
            print(message, file=sys.stderr)


def _checkpoints(engine: Any) -> list[Checkpoint]:
    """The run's Checkpoint packs."""
    return [p for p in engine.table.packs.values() if isinstance(p, Checkpoint)]

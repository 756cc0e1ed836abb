"""Where a run's data stands within its epoch, so that a run resumed mid-epoch draws the
batches, dropout masks and shuffles a straight run would.

A checkpoint taken mid-epoch keeps the position (the batches drawn in the epoch so far),
the random generators' states at that moment, the epoch's ``epoch_rng`` (their states
when the epoch's data began to be drawn) and what the run's ``DataTracker`` keeps (a
DataLoader's index order for the epoch and its generators; ``models/data.py``). A run
resumed from it starts that epoch again:

* with a tracker that can skip (a DataLoader over a map-style dataset; a torchdata
  ``StatefulDataLoader``), the data starts after the drawn batches, none of them loaded,
  and the generators are set to the checkpoint's states when its first batch is read;
* without one, the epoch's data is replayed: the generators are set to ``epoch_rng`` when
  the data begins, the drawn batches are dropped as they come (loaded, not run), then the
  generators are set to the checkpoint's states. A warning says so, once.

Where the run stands also decides what a checkpoint taken *now* holds (``Position.now``,
for ``checkpoint.save()`` from any hook): the loop moves ``stage`` as epochs begin and
end, never per step.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .snapshot import rng_state, set_rng_state

if TYPE_CHECKING:
    from .plan import DataTracker
    from .state import State

__all__ = ["Position"]

#: ``Position.stage``: between epochs (setup, teardown), an epoch's ``epoch_start``
#: hooks, its steps, its ``epoch_end`` hooks
BETWEEN, START, STEPS, END = "between", "start", "steps", "end"


class Position:
    """The data position of one run (``Loop.position``)."""

    def __init__(self, state: State, tracker: DataTracker | None) -> None:
        self.state, self.tracker = state, tracker
        self.skipped_before = state.skipped  # skipped batches before this epoch
        self.epoch_rng: Any = None
        self.replay = 0  # batches still to drop: a replayed epoch
        # restore the generators: before the next step, or the epoch's end if none comes
        self.pending: Callable[[], None] | None = None
        self._resume: dict[str, Any] | None = None
        self._replay_rng: Any = None
        #: where the epoch stands (``BETWEEN``, ``START``, ``STEPS``, ``END``): the loop
        #: moves it at an epoch's start, its first step and its end
        self.stage = BETWEEN

    def batches(self, counters: dict[str, int] | None = None) -> int:
        """The batches drawn in this epoch so far, dropped ones (``skip_step``) included,
        by the counters (``counters`` replacing some: where a resumed run starts)."""
        counters = counters or {}
        if counters.get("epoch", self.state.epoch) != self.state.epoch:
            return 0  # it resumes at the next epoch's start
        return (
            counters.get("epoch_step", self.state.epoch_step)
            + counters.get("skipped", self.state.skipped)
            - self.skipped_before
        )

    # -- checkpoints ------------------------------------------------------------------

    def now(self, in_step_start: bool) -> dict[str, int] | None:
        """The counters of a checkpoint taken now (``snapshot``'s), by where the run
        stands: in a step (its ``runstep`` hooks), after that step; in an epoch's
        ``epoch_end`` hooks, after that epoch (where it cut short: where it stopped);
        in a ``step_start`` hook (``in_step_start``) or an epoch's ``epoch_start`` hooks,
        before that step (its batch drawn again) or that epoch; between epochs, after
        the last one. None while a resumed epoch has not reached its checkpoint's
        position (its generators are still to be set): the run stands where that
        checkpoint does."""
        s = self.state
        if self.pending is not None or self.replay:
            return None
        if self.stage == STEPS and not in_step_start:
            return {"step": s.step + 1, "epoch_step": s.epoch_step + 1}
        if self.stage == END and s.epoch_complete:
            return {"epoch": s.epoch + 1, "epoch_step": 0}
        if self.stage == BETWEEN and s.epoch_complete:  # the epoch counted already
            return {"epoch_step": 0}
        return {}

    def snapshot(self, counters: dict[str, int] | None = None) -> dict[str, Any]:
        """What a checkpoint keeps; ``counters``: where a run resumed from it starts."""
        batches = self.batches(counters)
        if not batches:  # at an epoch's end: the loader's own generators, for the next
            boundary = getattr(self.tracker, "boundary_state", None)
            return {"batches": 0} if boundary is None else {"batches": 0, "data": boundary()}
        return {
            "batches": batches,
            "epoch_rng": self.epoch_rng,
            "data": None if self.tracker is None else self.tracker.state(),
        }

    def resume(self, saved: dict[str, Any], rng: Any, drawn: bool = False) -> None:
        """Continue a checkpoint's epoch: arm the tracker now (before any data is drawn),
        or prepare to replay; ``rng`` is the generators' state at the checkpoint.
        ``drawn``: the epoch's data were all drawn, in another number of processes than
        this run's: what the epoch yields here is dropped, and the generators are set at
        its end, as a checkpoint at the epoch's end would set them."""
        batches = int(saved.get("batches", 0))
        if not batches:
            self._resume_boundary(saved, rng)
            return
        self.skipped_before = self.state.skipped - (batches - self.state.epoch_step)
        if drawn:
            self.pending = _once(lambda: self._resume_boundary(saved, rng))
            self.replay = sys.maxsize  # all of it: the epoch's end restores (loop.py)
            return
        self.epoch_rng = saved["epoch_rng"]
        restore = _once(lambda: set_rng_state(rng))
        start = (
            None
            if self.tracker is None
            else self.tracker.resume(saved.get("data"), batches, restore)
        )
        self.pending = _once(start) if start is not None else restore
        if start is not None:
            return
        self.replay, self._replay_rng = batches, saved["epoch_rng"]
        if getattr(self.tracker, "quiet", False):  # batches in memory: nothing is loaded
            return
        warnings.warn(
            f"resuming in the middle of epoch {self.state.epoch}: its data cannot "
            f"start after the {batches} batches already drawn, so they are drawn "
            f"again and dropped (a DataLoader over a map-style dataset, or a "
            f"torchdata StatefulDataLoader, skips them without loading them)",
            stacklevel=2,
        )

    def _resume_boundary(self, saved: dict[str, Any], rng: Any) -> None:
        """The next epoch starts as it would after the saved one's end."""
        set_rng_state(rng)
        resume_boundary = getattr(self.tracker, "resume_boundary", None)
        if saved.get("data") is not None and resume_boundary is not None:
            resume_boundary(saved["data"], self._undo_iterator_draw)

    def _undo_iterator_draw(self) -> None:
        """Put torch's generator back where it stood as the epoch's data began: before a
        loader iterator drew its base seed, a draw a straight run made only once."""
        if self.epoch_rng is not None:
            import torch

            torch.set_rng_state(self.epoch_rng["torch"])

    # -- an epoch's data ---------------------------------------------------------------

    def epoch_begins(self, resumed: bool) -> None:
        """At ``epoch_start``, before its hooks; ``resumed``: the checkpoint's epoch."""
        if not resumed:
            self.skipped_before = self.state.skipped
        self.stage = START

    def data_begins(self, first_epoch_begun: bool) -> None:
        """The epoch's data is about to be drawn: after the ``epoch_start`` hooks, or
        before the model's loop for a loop without ``runstep.epochs()``."""
        if self._replay_rng is not None:
            set_rng_state(self._replay_rng)  # the replayed epoch draws as it did
            if first_epoch_begun:
                self._replay_rng = None
        elif self.pending is None:
            self.epoch_rng = rng_state()

    def close(self) -> None:
        if self.tracker is not None:
            self.tracker.close()


def _once(fn: Callable[[], None]) -> Callable[[], None]:
    """``fn``, run the first time only: the tracker's moment, or else the first step's."""
    done = [False]

    def once() -> None:
        if not done[0]:
            done[0] = True
            fn()

    return once

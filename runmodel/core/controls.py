"""What a hook (or the script) can do to the run under way: stop it, interrupt it, end
the epoch, skip or leave out batches, rewind to a checkpoint. The engine's loop
(``loop.py``) carries each out at the step's boundary; outside a run, each says so (or,
for ``stop``, ``interrupt`` and ``end_epoch``, does nothing)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, NoReturn

from .state import Rewind

if TYPE_CHECKING:
    from .loop import Loop

__all__ = ["RunControls"]


class RunControls:
    """The run controls of ``BareEngine``: each acts on the run under way (``_loop``)."""

    _loop: Loop | None

    def stop(self, reason: str | None = None) -> None:
        """End the run once the current step is done; teardown follows. ``reason`` (the
        first one given) goes into the run's result."""
        if self._loop is not None:
            self._loop.stop(reason)

    def interrupt(self, reason: str | None = None, signal: int | None = None) -> bool:
        """End the run as a first Ctrl-C does: after the current step the run raises
        ``Interrupted`` (``Preempted`` for a preemption ``signal``) with its state whole, so
        a ``Checkpoint`` pack saves that step; ``state.stopping`` says so, and the epoch cut
        short is not evaluated. False, doing nothing, when no run is under way."""
        if self._loop is None:
            return False
        self._loop.interrupt(reason, signal)
        return True

    def end_epoch(self) -> None:
        """End the current epoch once the current step is done: the model's remaining
        runstep calls in it do nothing. Without ``runstep.epochs()`` it ends the run."""
        if self._loop is not None:
            self._loop.end_epoch()

    def skip_step(self) -> None:
        """From a ``step_start`` hook: drop this batch. The step's action and ``runstep``
        hooks do not run, ``step`` does not advance, ``state.skipped`` does."""
        if self._loop is None:
            raise RuntimeError(
                "skip_step() drops a batch of a running step; call it from a step_start hook"
            )
        self._loop.skip_step()

    def batch_index(self) -> int:
        """The 0-based position in its epoch's data of the batch under way (of the next
        one, between steps): every batch the epoch's data yielded before it counts, left
        out or skipped ones too, as ``leave_out`` counts them."""
        return 0 if self._loop is None else self._loop.position.batches()

    def leave_out(self, epoch: int, batches: Iterable[int]) -> None:
        """Leave the batches at these 0-based positions in epoch ``epoch``'s data out of
        the run: each is drawn when its turn comes and dropped without a step (no hook
        fires for it; ``state.skipped`` counts it, as ``skip_step``'s). Positions count
        every batch the epoch's data yields, run or not. For this run (a pack that plans
        them puts them in its state and calls this again at ``setup``)."""
        if self._loop is None:
            raise RuntimeError("leave_out() plans a run's batches; call it from a hook")
        self._loop.leave_out(epoch, {int(b) for b in batches})

    def rewind(self, checkpoint: str | os.PathLike[str]) -> NoReturn:
        """From a hook during a step: abandon the step and go on from ``checkpoint`` as a
        run resumed from it would (its weights, optimizer, counters, every pack's state,
        random generators and data position; the hooks' filters counting from there), the
        model's loop started again. Batches left out (``leave_out``) stay left out; a
        pack that must keep state across the rewind keeps it itself. Raises ``Rewind``."""
        if self._loop is None:
            raise RuntimeError("rewind() goes back during a run; call it from a hook")
        raise Rewind(checkpoint)

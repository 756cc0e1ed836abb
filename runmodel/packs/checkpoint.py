"""Save the run's state every so often; resume from it with ``engine.run(resume=...)``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .. import checkpoint
from ..core import Hook, HookOptions, Pack
from ..core.options import parse_duration

__all__ = ["Checkpoint"]


class Checkpoint(Pack):
    """Write checkpoints into ``directory``: ``every="1ep"`` (at the end of every epoch),
    ``"2ep"``, ``"500st"`` (after every 500th step) or ``"10min"``; keep the newest
    ``keep`` (older ones are deleted only once the new one is on disk).

    Checkpoints at epoch ends resume exactly where the run left off; one taken mid-epoch
    (by ``"Nst"``, or at the end of an epoch that the step budget or ``stop()`` cut short)
    restores weights, optimizer and counters, and the model's loop starts that epoch's
    data again.
    """

    name = "checkpoint"

    def __init__(self, directory: str | os.PathLike[str], every: int | str = "1ep",
                 keep: int | None = 2) -> None:
        self.every = parse_duration(every, "every")
        if self.every.unit == "own":  # a count of epochs
            self.every = parse_duration(f"{int(self.every.amount)}ep", "every")
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
            raise ValueError(f"keep= must be a whole number >= 1 or None (keep all), got {keep!r}")
        self.directory, self.keep = Path(directory), keep
        self.saved: list[str] = []

    def hooks(self) -> Iterator[Hook]:
        phase = "epoch_end" if self.every.unit == "ep" else "runstep"
        # last: after other hooks' state changes
        yield Hook(self.save, phase, HookOptions.of(every=self.every.text, modes="train",
                                                      priority=-1000))

    def save(self, engine: Any) -> Path:
        s = engine.state
        if self.every.unit != "ep":  # after this step
            counters = {"step": s.step + 1, "epoch_step": s.epoch_step + 1}
        elif s.epoch_complete:  # after this epoch
            counters = {"epoch": s.epoch + 1, "epoch_step": 0}
        else:  # an epoch cut short by the budget or stop(): where it stopped
            counters = {}
        epoch, step = counters.get("epoch", s.epoch), counters.get("step", s.step)
        name = f"ckpt-{epoch:05d}-{step:010d}.pt"
        previous = self.saved
        # the list saved inside the checkpoint already holds the checkpoint itself, so a
        # run resumed from it prunes it in its turn
        kept = [n for n in previous if n != name] + [name]
        self.saved = kept[-self.keep:] if self.keep is not None else kept
        try:
            path = checkpoint.save(self.directory / name, engine.snapshot(counters))
        except BaseException:
            self.saved = previous
            raise
        for old in previous:  # only once the new one is on disk
            if old not in self.saved:
                (self.directory / old).unlink(missing_ok=True)
        return path

    def state_dict(self) -> dict[str, Any]:
        return {"saved": list(self.saved)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.saved = list(state.get("saved", []))

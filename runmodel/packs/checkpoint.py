"""Save the run's state every so often; resume from it with ``engine.run(resume=...)``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..checkpoint import save_checkpoint
from ..filters import parse_duration
from ..hooks import Hook
from ..pack import Pack

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
        self.every = parse_duration(every, option="every", scope="epoch")
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
            raise ValueError(f"keep= must be a whole number >= 1 or None (keep all), got {keep!r}")
        self.directory, self.keep = Path(directory), keep
        self.saved: list[str] = []

    def hooks(self) -> Iterator[Hook]:
        phase = "epoch_end" if self.every.unit == "ep" else "runstep"
        every = int(self.every.amount) if self.every.unit == "ep" else self.every.text
        yield Hook(self.save, phase, every=every, name="checkpoint.save", pack=self,
                   modes="train", priority=-1000)  # last: after other hooks' state changes

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
            path = save_checkpoint(engine, self.directory / name, counters)
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

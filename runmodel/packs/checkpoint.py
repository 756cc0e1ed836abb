"""Save the run's state every so often; resume from it with ``engine.run(resume=...)``."""

from __future__ import annotations

import os
import shutil
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
    ``keep`` (older ones are deleted only once the new one is on disk). Only process
    rank 0 writes.

    ``best=("eval_accuracy", "max")`` also keeps the best ``keep_best`` checkpoints by
    that metric of ``engine.state.metrics`` (``"min"`` for a loss), as
    ``best-<metric>=<value>-<epoch>-<step>.pt`` beside the newest ones; ``resume=`` with
    the folder still takes the newest checkpoint, not the best.

    A run resumed from any of them goes on exactly as a straight run would, also from one
    taken mid-epoch (by ``"Nst"``, or at the end of an epoch that the step budget or
    ``stop()`` cut short): the checkpoint holds where the epoch's data stands
    (``runmodel/core/position.py``).
    """

    name = "checkpoint"

    def __init__(self, directory: str | os.PathLike[str], every: int | str = "1ep",
                 keep: int | None = 2, best: tuple[str, str] | None = None,
                 keep_best: int = 1) -> None:
        self.every = parse_duration(every, "every")
        if self.every.unit == "own":  # a count of epochs
            self.every = parse_duration(f"{int(self.every.amount)}ep", "every")
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
            raise ValueError(f"keep= must be a whole number >= 1 or None (keep all), got {keep!r}")
        if best is not None and not (isinstance(best, (tuple, list)) and len(best) == 2
                                     and isinstance(best[0], str) and best[1] in ("min", "max")):
            raise ValueError(f"best= names a metric and whether lower or higher is better, as "
                             f"('eval_accuracy', 'max') or ('eval_loss', 'min'); got {best!r}")
        if isinstance(keep_best, bool) or not isinstance(keep_best, int) or keep_best < 1:
            raise ValueError(f"keep_best= must be a whole number >= 1, got {keep_best!r}")
        self.directory, self.keep = Path(directory), keep
        self.best, self.keep_best = (None if best is None else (best[0], best[1])), keep_best
        self.saved: list[str] = []
        self.best_saved: list[tuple[float, str]] = []  # (metric value, file), best first

    def hooks(self) -> Iterator[Hook]:
        phase = "epoch_end" if self.every.unit == "ep" else "runstep"
        # last: after other hooks' state changes
        yield Hook(self.save, phase, HookOptions.of(every=self.every.text, modes="train",
                                                      priority=-1000, rank=0))
        yield Hook(self.save_last, "teardown", HookOptions.of(modes="train", rank=0))

    def save_last(self, engine: Any) -> Path | None:
        """A run that ``stop()`` ended (early stopping, Ctrl-C in a config run) is saved
        where it stopped, unless the newest checkpoint is there already."""
        s = engine.state
        if s.error is not None or s.ended != "stopped":
            return None
        counters = {} if not s.epoch_complete else {"epoch_step": 0}
        if self.saved and self.saved[-1] == _name(s.epoch, s.step):
            return None
        return self._write(engine, counters)

    def save(self, engine: Any) -> Path:
        s = engine.state
        if self.every.unit != "ep":  # after this step
            counters = {"step": s.step + 1, "epoch_step": s.epoch_step + 1}
        elif s.epoch_complete:  # after this epoch
            counters = {"epoch": s.epoch + 1, "epoch_step": 0}
        else:  # an epoch cut short by the budget or stop(): where it stopped
            counters = {}
        return self._write(engine, counters)

    def _write(self, engine: Any, counters: dict[str, int]) -> Path:
        s = engine.state
        epoch, step = counters.get("epoch", s.epoch), counters.get("step", s.step)
        name = _name(epoch, step)
        previous, previous_best = self.saved, self.best_saved
        # the lists saved inside the checkpoint already hold the checkpoint itself, so a
        # run resumed from it prunes it in its turn
        kept = [n for n in previous if n != name] + [name]
        self.saved = kept[-self.keep:] if self.keep is not None else kept
        best_name = self._rank_best(s.metrics, epoch, step)
        try:
            path = checkpoint.save(self.directory / name, engine.snapshot(counters))
            if best_name is not None:
                _link(path, self.directory / best_name)
        except BaseException:
            self.saved, self.best_saved = previous, previous_best
            raise
        # only once the new ones are on disk
        for old in set(previous) - set(self.saved):
            (self.directory / old).unlink(missing_ok=True)
        for _, old in set(previous_best) - set(self.best_saved):
            (self.directory / old).unlink(missing_ok=True)
        return path

    def _rank_best(self, metrics: dict[str, Any], epoch: int, step: int) -> str | None:
        """Put this checkpoint among the best by the metric; its file name if it is."""
        if self.best is None:
            return None
        metric, mode = self.best
        if metric not in metrics:
            raise ValueError(f"Checkpoint(best=({metric!r}, {mode!r})): no metric {metric!r} in "
                             f"engine.state.metrics at epoch {epoch}, step {step}; there are: "
                             f"{', '.join(sorted(metrics)) or 'none'} (attach an Evaluate pack, "
                             f"or name one of these)")
        value = float(metrics[metric])
        name = f"best-{metric}={value:.6g}-{epoch:05d}-{step:010d}.pt"
        ranked = sorted([*self.best_saved, (value, name)], key=lambda entry: entry[0],
                        reverse=mode == "max")  # stable: an equal value keeps the older
        self.best_saved = ranked[:self.keep_best]
        return name if (value, name) in self.best_saved else None

    def state_dict(self) -> dict[str, Any]:
        return {"saved": list(self.saved),
                "best_saved": [[value, name] for value, name in self.best_saved]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.saved = list(state.get("saved", []))
        self.best_saved = [(float(value), str(name)) for value, name in
                           state.get("best_saved", [])]


def _name(epoch: int, step: int) -> str:
    """A checkpoint's file name: where a run resumed from it starts."""
    return f"ckpt-{epoch:05d}-{step:010d}.pt"


def _link(source: Path, target: Path) -> None:
    """``target`` as a second name of the file ``source`` (a copy where the file system
    has no hard links), put in place atomically."""
    temporary = target.with_name(f".{target.name}.tmp{os.getpid()}")
    temporary.unlink(missing_ok=True)
    try:
        os.link(source, temporary)
    except OSError:
        shutil.copyfile(source, temporary)
    os.replace(temporary, target)

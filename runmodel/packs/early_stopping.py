"""Stop training once a metric stops improving."""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..core import Hook, HookOptions, Pack
from ._common import metric_value

if TYPE_CHECKING:
    from ..core import Engine

__all__ = ["EarlyStopping"]

MODES = ("min", "max")


class EarlyStopping(Pack):
    """At the end of every full epoch (every ``every``-th), compare
    ``state.metrics[metric]`` with the best value so far; after ``patience`` checks in a
    row without an improvement of more than ``min_delta`` (down for ``mode="min"``, up
    for ``"max"``), stop the run, saying why in ``result.reason``.

    It runs after ``Evaluate`` (which puts ``eval_loss`` and the other ``eval_`` metrics
    into ``state.metrics``) and before ``Checkpoint`` saves the epoch. The best value, its
    epoch and the count of checks without improvement are in ``state_dict()``, so a
    resumed run continues the count; resuming a run that stopped early stops again at once
    (unless ``patience`` grew). Train runs only.
    """

    name = "early_stopping"

    def __init__(self, metric: str, patience: int, min_delta: float = 0.0, mode: str = "min",
                 every: int = 1) -> None:
        if not isinstance(metric, str) or not metric:
            raise TypeError(f"EarlyStopping(metric=) names a metric in state.metrics, such as "
                            f"'eval_loss'; got {metric!r}")
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise ValueError(f"EarlyStopping(patience=) must be a whole number >= 1 (the checks "
                             f"in a row without improvement before stopping); got {patience!r}")
        if isinstance(min_delta, bool) or not isinstance(min_delta, (int, float)) or not (
                math.isfinite(min_delta) and min_delta >= 0):
            raise ValueError(f"EarlyStopping(min_delta=) must be a number >= 0 (the least change "
                             f"that counts as an improvement); got {min_delta!r}")
        if mode not in MODES:
            close = difflib.get_close_matches(str(mode), MODES, n=1, cutoff=0.3)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"EarlyStopping(mode=) must be 'min' (lower is better, as for a "
                             f"loss) or 'max' (as for an accuracy); got {mode!r}.{hint}")
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"EarlyStopping(every=) must be a whole number of epochs >= 1 (as "
                             f"Evaluate's every=); got {every!r}")
        self.metric, self.patience, self.min_delta = metric, patience, float(min_delta)
        self.reads = (metric,)  # checked at setup against the metrics declared written
        self.mode, self.every = mode, every
        self.best: float | None = None
        self.best_epoch: int | None = None
        self.bad = 0  # checks in a row without improvement
        self.last: float | None = None  # the value of the latest check
        self._restored = False

    def hooks(self) -> Iterator[Hook]:
        yield Hook(self.setup, "setup", HookOptions.of(modes="train",
                                                       name="early_stopping.setup"))
        # after Evaluate (priority 0) and TensorBoard (-100), before Checkpoint (-1000)
        yield Hook(self.check, "epoch_end", HookOptions.of(
            priority=-200, after="evaluate", every=self.every, modes="train",
            name="early_stopping.check"))

    def setup(self, engine: Engine) -> None:
        if not self._restored:  # a run from the start (not resumed): a new count
            self.best, self.best_epoch, self.bad, self.last = None, None, 0, None
        self._restored = False
        if self.bad >= self.patience:  # resumed from the check that stopped it
            engine.stop(self.reason())

    def check(self, engine: Engine) -> None:
        s = engine.state
        if not s.epoch_complete:
            return  # an epoch cut short is run again by a resume: not a check
        self.last = value = metric_value(s, self.metric, "EarlyStopping")
        if not math.isnan(value) and (self.best is None or self._improved(value, self.best)):
            self.best, self.best_epoch, self.bad = value, s.epoch, 0
            return
        self.bad += 1
        if self.bad >= self.patience:
            engine.stop(self.reason())

    def _improved(self, value: float, best: float) -> bool:
        if self.mode == "min":
            return value < best - self.min_delta
        return value > best + self.min_delta

    def reason(self) -> str:
        """Why the run stops: what did not improve, for how long, and the best value."""
        by = f" by more than {self.min_delta:g}" if self.min_delta else ""
        checks = (f"{self.bad} epoch{'s' if self.bad != 1 else ''}" if self.every == 1
                  else f"{self.bad} checks {self.every} epochs apart")
        best = ("no value that was a number" if self.best is None or self.best_epoch is None
                else f"best {self.best:.6g} at epoch {self.best_epoch + 1}")  # from 1
        tail = "" if self.last is None else f", last {self.last:.6g}"
        return f"early stopping: {self.metric} did not improve{by} for {checks} ({best}{tail})"

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_epoch": self.best_epoch, "bad": self.bad,
                "last": self.last}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.best_epoch = state.get("best"), state.get("best_epoch")
        self.bad, self.last = int(state.get("bad", 0)), state.get("last")
        self._restored = True

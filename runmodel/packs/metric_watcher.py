"""``MetricWatcher``: one metric of ``state.metrics`` watched from check to check, as
Keras's ``MonitorCallback`` watches one for its callbacks. The packs that act on a metric
(``EarlyStopping``, ``LRSchedule``'s plateau, ``Checkpoint``'s best-K) share it, so that
"better", the best so far and the patience are decided in one place."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from ..core.checks import did_you_mean, is_number, whole_number
from ..core.exports import lazy_exports
from ._common import metric_value

__all__ = ["DIRECTIONS", "MetricWatcher"]

#: Which way is better: ``"min"``, lower (a loss); ``"max"``, higher (an accuracy).
DIRECTIONS = ("min", "max")

# MODES, the old name (the run's modes are core.MODES), kept for a release
__getattr__, __dir__ = lazy_exports(__name__, {}, deprecated={"MODES": f"{__name__}.DIRECTIONS"})
if TYPE_CHECKING:
    MODES = DIRECTIONS

T = TypeVar("T")


class MetricWatcher:
    """Watches ``state.metrics[metric]`` across checks.

    ``mode`` says which way is better: ``"min"`` (lower, as for a loss) or ``"max"``
    (higher, as for an accuracy). A value *improves* on the best so far when it is better
    by more than ``min_delta``; NaN never improves. ``check(state)`` reads the metric
    (a missing one is an error naming those there are) and records it: ``best``,
    ``best_epoch`` (``state.epoch`` of the check that found it), ``last`` and ``bad``, the
    checks in a row without an improvement; ``exhausted`` says when ``bad`` reached
    ``patience`` (None: never). ``best_first`` ranks values, for keeping the best K.
    ``state_dict``/``load_state_dict`` carry the record through a checkpoint.

    ``owner`` names the pack in errors (``"EarlyStopping"``), whose options these are: a
    bad one is refused when the pack is made, as ``EarlyStopping(mode=)`` and
    ``EarlyStopping(patience=)``; ``reader`` (default ``owner``) is who an error reading
    the metric names.
    """

    def __init__(
        self,
        metric: str,
        mode: str = "min",
        *,
        min_delta: float = 0.0,
        patience: int | None = None,
        owner: str = "MetricWatcher",
        reader: str | None = None,
    ) -> None:
        if not isinstance(metric, str) or not metric:
            raise TypeError(
                f"{owner}(metric=) names a metric in state.metrics, such as "
                f"'eval_loss'; got {metric!r}"
            )
        if mode not in DIRECTIONS:
            raise ValueError(
                f"{owner}(mode=) must be 'min' (lower is better, as for a loss) "
                f"or 'max' (as for an accuracy); got {mode!r}."
                f"{did_you_mean(mode, DIRECTIONS, cutoff=0.3)}"
            )
        if not is_number(min_delta) or not (math.isfinite(min_delta) and min_delta >= 0):
            raise ValueError(
                f"{owner}(min_delta=) must be a number >= 0 (the least change "
                f"that counts as an improvement); got {min_delta!r}"
            )
        whole_number(
            patience,
            f"{owner}(patience=)",
            least=1,
            none=True,
            meaning="the checks in a row without improvement that it waits for",
        )
        self.metric, self.mode, self.owner = metric, mode, owner
        self.reader = reader or owner  # who an error reading the metric names
        self.min_delta, self.patience = float(min_delta), patience
        self.best: float | None = None
        self.best_epoch: int | None = None
        self.bad = 0  # checks in a row without improvement
        self.last: float | None = None  # the value of the latest check

    def read(self, state: Any) -> float:
        """``state.metrics[metric]`` as a float (for ``"loss"`` without such a metric,
        the last step's loss); a missing metric is an error with a did-you-mean."""
        return metric_value(state, self.metric, self.reader)

    def improves(self, value: float, best: float | None = None) -> bool:
        """Whether ``value`` is better than ``best`` (default: the best so far) by more
        than ``min_delta``; anything but NaN improves on no best at all."""
        best = self.best if best is None else best
        if math.isnan(value):
            return False
        if best is None:
            return True
        if self.mode == "min":
            return value < best - self.min_delta
        return value > best + self.min_delta

    def update(self, value: float, epoch: int | None = None) -> bool:
        """Record ``value`` (found at ``epoch``); whether it improved on the best."""
        self.last = value
        if self.improves(value):
            self.best, self.best_epoch, self.bad = value, epoch, 0
            return True
        self.bad += 1
        return False

    def check(self, state: Any) -> bool:
        """Read the metric from ``state`` and record it; whether it improved."""
        return self.update(self.read(state), state.epoch)

    @property
    def exhausted(self) -> bool:
        """Whether ``patience`` checks in a row brought no improvement."""
        return self.patience is not None and self.bad >= self.patience

    def best_first(
        self, entries: Iterable[tuple[float, T]], keep: int | None = None
    ) -> list[tuple[float, T]]:
        """``entries`` of ``(value, item)`` best first (an equal value keeps the earlier
        entry first), at most ``keep`` of them."""
        ranked = sorted(entries, key=lambda entry: entry[0], reverse=self.mode == "max")
        return ranked if keep is None else ranked[:keep]

    def reset(self) -> None:
        """Forget every check: a run from the start."""
        self.best, self.best_epoch, self.bad, self.last = None, None, 0, None

    def state_dict(self) -> dict[str, Any]:
        return {
            "best": self.best,
            "best_epoch": self.best_epoch,
            "bad": self.bad,
            "last": self.last,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.best_epoch = state.get("best"), state.get("best_epoch")
        self.bad, self.last = int(state.get("bad", 0)), state.get("last")

    def __repr__(self) -> str:
        return f"MetricWatcher({self.metric!r}, {self.mode!r}, best={self.best}, bad={self.bad})"

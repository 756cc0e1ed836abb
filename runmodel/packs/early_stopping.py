"""Stop training once a metric stops improving."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..core import Hook, HookOptions, Pack
from ..core.checks import whole_number
from .metric_watcher import MetricWatcher

if TYPE_CHECKING:
    from ..core import BareEngine as Engine

__all__ = ["EarlyStopping"]


class EarlyStopping(Pack):
    """At the end of every full epoch (every ``every``-th), compare
    ``state.metrics[metric]`` with the best value so far; after ``patience`` checks in a
    row without an improvement of more than ``min_delta`` (down for ``mode="min"``, up
    for ``"max"``), stop the run, saying why in ``result.reason``.

    It runs after ``Evaluate`` (which puts ``eval_loss`` and the other ``eval_`` metrics
    into ``state.metrics``) and before ``Checkpoint`` saves the epoch. The best value, its
    epoch and the count of checks without improvement are in ``state_dict()``, so a
    resumed run continues the count; resuming a run that stopped early stops again at once
    (unless ``patience`` grew). Train runs only. ``watcher`` is its ``MetricWatcher``.
    """

    name = "early_stopping"

    def __init__(
        self, metric: str, patience: int, min_delta: float = 0.0, mode: str = "min", every: int = 1
    ) -> None:
        whole_number(
            patience,
            "EarlyStopping(patience=)",
            least=1,
            meaning="the checks in a row without improvement before stopping",
        )
        self.watcher = MetricWatcher(
            metric, mode, min_delta=min_delta, patience=patience, owner="EarlyStopping"
        )
        whole_number(
            every, "EarlyStopping(every=)", least=1, unit="epochs", meaning="as Evaluate's every="
        )
        self.metric, self.patience, self.min_delta = metric, patience, float(min_delta)
        self.reads = (metric,)  # checked at setup against the metrics declared written
        self.mode, self.every = mode, every
        self._restored = False

    @property
    def best(self) -> float | None:
        """The best value so far (None: no check found a number yet)."""
        return self.watcher.best

    @property
    def best_epoch(self) -> int | None:
        return self.watcher.best_epoch

    @property
    def bad(self) -> int:
        """Checks in a row without improvement."""
        return self.watcher.bad

    @property
    def last(self) -> float | None:
        """The value of the latest check."""
        return self.watcher.last

    def hooks(self) -> Iterator[Hook]:
        yield Hook(self.setup, "setup", HookOptions.of(modes="train", name="early_stopping.setup"))
        # after Evaluate (priority 0) and TensorBoard (-100), before Checkpoint (-1000)
        yield Hook(
            self.check,
            "epoch_end",
            HookOptions.of(
                priority=-200,
                after="evaluate",
                every=self.every,
                modes="train",
                name="early_stopping.check",
            ),
        )

    def setup(self, engine: Engine) -> None:
        if not self._restored:  # a run from the start (not resumed): a new count
            self.watcher.reset()
        self._restored = False
        if self.watcher.exhausted:  # resumed from the check that stopped it
            engine.stop(self.reason())

    def check(self, engine: Engine) -> None:
        if not engine.state.epoch_complete:
            return  # an epoch cut short is run again by a resume: not a check
        if not self.watcher.check(engine.state) and self.watcher.exhausted:
            engine.stop(self.reason())

    def reason(self) -> str:
        """Why the run stops: what did not improve, for how long, and the best value."""
        by = f" by more than {self.min_delta:g}" if self.min_delta else ""
        checks = (
            f"{self.bad} epoch{'s' if self.bad != 1 else ''}"
            if self.every == 1
            else f"{self.bad} checks {self.every} epochs apart"
        )
        best = (
            "no value that was a number"
            if self.best is None or self.best_epoch is None
            else f"best {self.best:.6g} at epoch {self.best_epoch + 1}"
        )  # from 1
        tail = "" if self.last is None else f", last {self.last:.6g}"
        return f"early stopping: {self.metric} did not improve{by} for {checks} ({best}{tail})"

    def state_dict(self) -> dict[str, Any]:
        return self.watcher.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.watcher.load_state_dict(state)
        self._restored = True

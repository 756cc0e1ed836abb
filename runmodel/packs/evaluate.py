"""Evaluate the model during training: ignite metrics over its eval data into
``state.metrics``, with the machinery eval mode uses (``runmodel.evaluate``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..core import Hook, HookOptions, Pack
from ..core.metric_names import TEST_PREFIX
from ..core.options import parse_duration
from ..models import TorchModel, evaluate

if TYPE_CHECKING:
    from ignite.metrics import Metric

    from ..core import Engine

__all__ = ["Evaluate"]


class Evaluate(Pack):
    """Every ``every`` (``"1ep"``: at the end of each epoch; ``"2ep"``; ``"500st"``: after
    every 500th step; ``"10min"``), compute ``metrics`` (default: the model's
    ``metrics()``, its loss and, for classifiers, accuracy) over ``data`` (default: the
    model's ``eval_data``) with ``runmodel.evaluate`` (no grad, the module in eval mode
    and back in train mode after), and put each value into ``state.metrics`` as
    ``prefix + name`` (``eval_loss``, ``eval_accuracy``).

    From there TensorBoard logs them at epoch ends, a config run's metrics.json has them,
    and ``EarlyStopping``/``LRSchedule(metric=)`` read them. The random number generators
    are put back after each evaluation, so evaluating does not change the training. Each
    pass fires the run's ``eval_start`` and ``eval_end`` phases around it (a model with
    state that runs on from batch to batch starts it afresh there), and sums its loss in
    double precision. Runs in the modes ``modes`` names (train only by default).
    """

    name = "evaluate"

    def __init__(
        self,
        every: int | str = "1ep",
        data: Iterable[Any] | None = None,
        metrics: Mapping[str, Metric] | None = None,
        prefix: str = "eval_",
        modes: str | Iterable[str] = "train",
    ) -> None:
        self.every = parse_duration(every, "every")
        if self.every.unit == "own":  # a count of epochs
            self.every = parse_duration(f"{int(self.every.amount)}ep", "every")
        if data is not None:
            if not isinstance(data, Iterable):
                raise TypeError(
                    f"Evaluate(data=) takes the batches to evaluate on (a DataLoader "
                    f"or a list of batches), got {type(data).__name__}"
                )
            if iter(data) is data:
                raise TypeError(
                    f"Evaluate(data=) is a one-shot iterator "
                    f"({type(data).__name__}) that the first evaluation would use "
                    f"up; give a DataLoader or a list of batches"
                )
        self.data = data
        self.metrics = _check_metrics(metrics)
        if not isinstance(prefix, str):
            raise TypeError(
                f"Evaluate(prefix=) must be a string such as 'eval_' or 'val_'; got {prefix!r}"
            )
        if prefix.startswith(TEST_PREFIX):  # a test split is evaluated once, after training
            raise ValueError(
                f"Evaluate(prefix={prefix!r}): the {TEST_PREFIX!r} prefix is "
                f"reserved for the test split (TorchModel.test_data), which a run "
                f"folder evaluates once after training with the best weights; "
                f"metrics measured during training are validation metrics: use "
                f"'eval_' or 'val_'"
            )
        self.prefix = prefix
        self.modes = HookOptions.of(modes=modes).modes
        self.last: dict[str, Any] = {}  # the latest evaluation's values, prefixed
        self._metrics: dict[str, Metric] = {}
        self._restored = False

    def hooks(self) -> Iterator[Hook]:
        yield Hook(self.setup, "setup", HookOptions.of(modes=self.modes, name="evaluate.setup"))
        by_epoch = self.every.unit == "ep"
        # priority 0 and named "evaluate": EarlyStopping, LRSchedule and TensorBoard (lower
        # priorities) come after it
        yield Hook(
            self.run_epoch if by_epoch else self.run,
            "epoch_end" if by_epoch else "runstep",
            HookOptions.of(every=self.every.text, modes=self.modes, name="evaluate"),
        )

    def check_setup(self, engine: Engine) -> None:
        """In a run it evaluates in: the model, its eval data and its metrics, whose
        names (with the prefix) this pack declares it writes."""
        self.writes = ()
        if self.modes is not None and engine.state.mode not in self.modes:
            return
        model = engine.model
        if not isinstance(model, TorchModel):
            raise TypeError(
                f"Evaluate needs a TorchModel (it feeds ignite metrics with its "
                f"module's outputs); got {type(model).__name__}"
            )
        if self.data is None and model.eval_data is None:
            raise ValueError(
                f"Evaluate: {type(model).__name__} has no eval_data; set it in the "
                f"model's setup() or give Evaluate(data=...)"
            )
        self._metrics = dict(self.metrics) if self.metrics is not None else model.metrics()
        if not self._metrics:
            raise ValueError(
                f"Evaluate: {type(model).__name__}.metrics() is empty (it has no "
                f"loss_fn); give Evaluate(metrics={{'name': ignite metric}})"
            )
        self.writes = tuple(self.prefix + name for name in self._metrics)

    def setup(self, engine: Engine) -> None:
        if not self._restored:  # a run from the start: nothing evaluated yet
            self.last = {}
        self._restored = False
        engine.state.metrics.update(self.last)  # a resumed run has what a straight one had

    def run_epoch(self, engine: Engine) -> None:
        """At an epoch's end: evaluate, unless an interrupt cut the epoch short (its
        partial epoch is no epoch to record)."""
        if not (engine.state.interrupted and not engine.state.epoch_complete):
            self.run(engine)

    def run(self, engine: Engine) -> dict[str, Any]:
        """Evaluate now; returns the values put into ``state.metrics``."""
        model: TorchModel = engine.model  # typed: mypy checks that it is Evaluable
        # fires eval_start and eval_end; leaves the generators as they were
        values = evaluate(model, self.data, self._metrics, engine=engine)
        self.last = {self.prefix + name: value for name, value in values.items()}
        engine.state.metrics.update(self.last)
        return self.last

    def state_dict(self) -> dict[str, Any]:
        return {"last": dict(self.last)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last, self._restored = dict(state.get("last", {})), True


def _check_metrics(metrics: object) -> dict[str, Metric] | None:
    if metrics is None:
        return None
    from ignite.metrics import Metric

    if (
        not isinstance(metrics, Mapping)
        or not metrics
        or not all(isinstance(k, str) and k and isinstance(v, Metric) for k, v in metrics.items())
    ):
        raise TypeError(
            f"Evaluate(metrics=) takes a dict of names to pytorch-ignite metrics, as "
            f"in {{'accuracy': ignite.metrics.Accuracy()}}, or None (the model's "
            f"metrics()); got {metrics!r}"
        )
    return dict(metrics)

"""Evaluate the model during training: ignite metrics over its eval data into
``state.metrics``, with the machinery eval mode uses (``runmodel.evaluate``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..core import Hook, HookOptions, Pack
from ..core.checks import whole_number
from ..core.metric_names import TEST_PREFIX
from ..core.options import parse_duration
from ..models import TorchModel, evaluate
from ..models.metrics import REDUCTIONS, with_loss_reduction

if TYPE_CHECKING:
    from ignite.metrics import Metric

    from ..core import Engine

__all__ = ["Evaluate"]

#: A source of eval batches: an iterable of them, or a function returning one per call.
Source = Iterable[Any] | Callable[[], Any]


class Evaluate(Pack):
    """Every ``every`` (``"1ep"``: at the end of each epoch; ``"2ep"``; ``"500st"``: after
    every 500th step; ``"10min"``), compute ``metrics`` (default: the model's
    ``metrics()``, its loss and, for classifiers, accuracy; pytorch-ignite metrics, or
    plain functions ``fn(predictions, targets) -> float`` over the whole pass, given the
    pass's outputs, a Hugging Face model's logits, and targets each concatenated into
    one tensor, as the Hugging Face ``Trainer``'s ``compute_metrics``) over ``data``
    (default: the
    model's ``eval_data``) with ``runmodel.evaluate`` (no grad, the module in eval mode
    and back in train mode after), and put each value into ``state.metrics`` as
    ``prefix + name`` (``eval_loss``, ``eval_accuracy``).

    ``data`` is an iterable of batches (a DataLoader, a list), a function of no arguments
    returning one batch per call (a script's ``get_batch``), or a mapping of names to
    such sources (``{"train": ..., "val": ...}``): each is evaluated in turn, as a pass of
    its own, into ``name + "_" + metric`` (``train_loss``, ``val_loss``; no ``prefix``).
    ``batches=N`` evaluates the first N batches of each iterable, or N batches of each
    function (which needs it). ``at_start=True`` also evaluates once before the first
    training step of a run that starts from step 0 (after the ``setup`` hooks; not when
    a run resumes).

    From there TensorBoard logs them at epoch ends, a config run's metrics.json has them,
    and ``EarlyStopping``/``LRSchedule(metric=)`` read them. Evaluating draws from the
    random number generators as a script's evaluation does (a shuffled DataLoader's
    iterator draws a seed from torch's) and leaves them so; ``isolate_rng=True`` puts
    torch's, Python's and NumPy's back after each evaluation, so that evaluating does not
    change the training. Each pass fires the run's ``eval_start`` and ``eval_end`` phases
    around it (a model with state that runs on from batch to batch starts it afresh
    there), and sums its loss in double precision, as ``total += loss.item() * len(y)``;
    ``loss_reduction="sum"`` sums ``loss_fn(out, y, reduction="sum")`` instead, and
    ``"float32"`` as a Lightning module's ``self.log`` does
    (``runmodel.models.loss_metric``). Runs in the modes ``modes`` names (train only by
    default).
    """

    name = "evaluate"

    def __init__(
        self,
        every: int | str = "1ep",
        data: Source | Mapping[str, Source] | None = None,
        metrics: Mapping[str, Metric | Callable[..., Any]] | None = None,
        prefix: str | None = None,
        modes: str | Iterable[str] = "train",
        *,
        batches: int | None = None,
        at_start: bool = False,
        isolate_rng: bool = False,
        loss_reduction: str = "mean",
    ) -> None:
        self.every = parse_duration(every, "every")
        if self.every.unit == "own":  # a count of epochs
            self.every = parse_duration(f"{int(self.every.amount)}ep", "every")
        self.batches = whole_number(batches, "Evaluate(batches=)", least=1, none=True)
        # nothing here iterates or calls data: an iterator would draw from the generators
        if isinstance(data, Mapping):
            if prefix is not None:
                raise ValueError(
                    f"Evaluate(prefix={prefix!r}) with data= a mapping: each source's "
                    f"metrics are named by its key (val_loss for 'val'); give one of them"
                )
            if not data:
                raise ValueError("Evaluate(data=) is an empty mapping: name a source to evaluate")
            # by the prefix of its metrics' names
            self.sources: dict[str, Source | None] = {
                f"{_check_name(name)}_": _check_source(source, f"data[{name!r}]", self.batches)
                for name, source in data.items()
            }
        else:
            if data is not None:
                _check_source(data, "data", self.batches)
            prefix = "eval_" if prefix is None else _check_prefix(prefix)
            self.sources = {prefix: data}
        self.data = data
        self.metrics = _check_metrics(metrics)
        self.prefix = None if isinstance(data, Mapping) else prefix
        self.modes = HookOptions.of(modes=modes).modes
        for flag, value in (("at_start", at_start), ("isolate_rng", isolate_rng)):
            if not isinstance(value, bool):
                raise TypeError(f"Evaluate({flag}=) takes True or False, got {value!r}")
        if loss_reduction not in REDUCTIONS:
            raise ValueError(
                f"Evaluate(loss_reduction=) is one of {', '.join(map(repr, REDUCTIONS))}; "
                f"got {loss_reduction!r}"
            )
        self.at_start, self.isolate_rng = at_start, isolate_rng
        self.loss_reduction = loss_reduction
        self.last: dict[str, Any] = {}  # the latest evaluation's values, prefixed
        self._metrics: dict[str, Metric] = {}
        self._restored = False
        self._start_pending = False  # at_start, in a run from step 0: not evaluated yet

    def hooks(self) -> Iterator[Hook]:
        yield Hook(self.setup, "setup", HookOptions.of(modes=self.modes, name="evaluate.setup"))
        if self.at_start:
            # the first epoch_start of a run from step 0, before any other hook of it (an
            # epoch's, then step 0's): the evaluation of the weights before training
            yield Hook(
                self.run_at_start,
                "epoch_start",
                HookOptions.of(modes=self.modes, name="evaluate.start", priority=10_000),
            )
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
        names (with the prefix, or each source's name) this pack declares it writes."""
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
        self._metrics = with_loss_reduction(self._metrics, self.loss_reduction)
        self.writes = tuple(prefix + name for prefix in self.sources for name in self._metrics)

    def setup(self, engine: Engine) -> None:
        from_start = not self._restored  # a run from the start: nothing evaluated yet
        if from_start:
            self.last = {}
        self._start_pending = self.at_start and from_start and engine.state.step == 0
        self._restored = False
        engine.state.metrics.update(self.last)  # a resumed run has what a straight one had

    def run_at_start(self, engine: Engine) -> None:
        """Before the first training step of a run from step 0: evaluate."""
        if self._start_pending and engine.state.step == 0:
            self.run(engine)
        self._start_pending = False

    def run_epoch(self, engine: Engine) -> None:
        """At an epoch's end: evaluate, unless an interrupt cut the epoch short (its
        partial epoch is no epoch to record)."""
        if not (engine.state.interrupted and not engine.state.epoch_complete):
            self.run(engine)

    def run(self, engine: Engine) -> dict[str, Any]:
        """Evaluate now, each source as a pass of its own; returns the values put into
        ``state.metrics``."""
        model: TorchModel = engine.model  # typed: mypy checks that it is Evaluable
        values: dict[str, Any] = {}
        for prefix, source in self.sources.items():
            # fires eval_start and eval_end; the metrics are reset for each pass
            measured = evaluate(
                model,
                source,
                self._metrics,
                batches=self.batches,
                engine=engine,
                isolate_rng=self.isolate_rng,
            )
            values.update({prefix + name: value for name, value in measured.items()})
        self.last = values
        engine.state.metrics.update(values)
        return values

    def state_dict(self) -> dict[str, Any]:
        return {"last": dict(self.last)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last, self._restored = dict(state.get("last", {})), True


def _check_source(source: object, what: str, batches: int | None) -> Any:
    """An iterable that can be iterated again (not a one-shot iterator), or a function
    with ``batches=``; neither iterated nor called here."""
    if isinstance(source, Iterator):
        raise TypeError(
            f"Evaluate({what}=) is a one-shot iterator ({type(source).__name__}) that "
            f"the first evaluation would use up; give a DataLoader or a list of batches"
        )
    if isinstance(source, Iterable):
        return source
    if callable(source):
        if batches is None:
            raise ValueError(
                f"Evaluate({what}=) is a function that returns one batch per call; "
                f"give batches=N: how many batches each evaluation takes of it"
            )
        return source
    raise TypeError(
        f"Evaluate({what}=) takes the batches to evaluate on (a DataLoader, a list of "
        f"batches, or a function returning one batch per call), got {type(source).__name__}"
    )


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise TypeError(
            f"Evaluate(data=) names its sources by strings such as 'train' and 'val'; got {name!r}"
        )
    if f"{name}_".startswith(TEST_PREFIX):
        raise ValueError(
            f"Evaluate(data={{{name!r}: ...}}): the {TEST_PREFIX!r} prefix is reserved "
            f"for the test split (TorchModel.test_data), which a run folder evaluates "
            f"once after training; name the source otherwise ('val')"
        )
    return name


def _check_prefix(prefix: object) -> str:
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
    return prefix


def _check_metrics(metrics: object) -> dict[str, Metric] | None:
    if metrics is None:
        return None
    from ignite.metrics import Metric

    if (
        not isinstance(metrics, Mapping)
        or not metrics
        or not all(
            isinstance(k, str) and k and (isinstance(v, Metric) or callable(v))
            for k, v in metrics.items()
        )
    ):
        raise TypeError(
            f"Evaluate(metrics=) takes a dict of names to pytorch-ignite metrics or "
            f"functions fn(predictions, targets) -> float over the whole pass, as in "
            f"{{'accuracy': ignite.metrics.Accuracy(), 'f1': f1}}, or None (the "
            f"model's metrics()); got {metrics!r}"
        )
    from ..models.function_metric import as_metrics

    return as_metrics(metrics)

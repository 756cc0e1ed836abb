"""What the engine asks of the layers above it, as small protocols: a ``ModeLike`` makes
a ``StepPlan`` (what a step does, and what a mode adds around the phases), a
``BackendLike`` prepares model and optimizer (and may give the run its
``CheckpointStorage``, how its checkpoints are written and read), and ``RunHorizon`` is
the run's horizon it is given. (``runmodel.modes.Mode`` and ``runmodel.Backend`` are
the classes that meet these protocols.)"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .engine import BareEngine
    from .hooks import Hook
    from .pack import Pack
    from .state import State

__all__ = [
    "Action",
    "BackendLike",
    "CheckpointStorage",
    "DataTracker",
    "ModeLike",
    "RunHorizon",
    "StepPlan",
    "Wrapper",
]

Action = Callable[[Any], Any]
#: ``wrap(phase, hook, fn) -> fn``: what dispatch calls instead of ``fn``, a hook's
#: compiled function (``hook`` given) or a whole phase's ``fire`` (``hook`` is None).
Wrapper = Callable[[str, "Hook | None", Callable[..., Any]], Callable[..., Any]]


@dataclass
class StepPlan:
    """What a mode gives a run: the action of each action phase it has (``runstep`` at
    least), built-ins that run before or after a phase's hooks (metrics, timers), a
    context around the model's loop (``no_grad``, the profiler), a ``Wrapper`` for hooks
    and phases (profile mode labels and times them) and ``finish``, which adds to the
    run's result."""

    actions: dict[str, Action]
    before: dict[str, list[Action]] = field(default_factory=dict)
    after: dict[str, list[Action]] = field(default_factory=dict)
    context: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
    wrap: Wrapper | None = None
    finish: Callable[[Any], dict[str, Any]] = lambda engine: {}
    data: DataTracker | None = None  # where the run's data stands, for an exact resume
    # per phase, the function its action calls to do the work: an error raised in it is
    # the phase's, also when a step calls it directly (train mode's step while nothing
    # hooks the three phases)
    parts: dict[str, Callable[..., Any]] = field(default_factory=dict)
    # the metrics (keys of state.metrics) the mode's built-ins write: declared names
    # (core/metric_names.py), as the metrics eval mode computes
    writes: tuple[str, ...] = ()


class DataTracker(Protocol):
    """Where the data of a run stands (``runmodel/models/data.py`` has the ones for
    DataLoaders), so that a run resumed mid-epoch draws the batches a straight run would."""

    def state(self) -> Any:
        """What a checkpoint keeps (plain values): the epoch's order, generator states."""
        ...

    def resume(
        self, state: Any, batches: int, restore: Callable[[], None]
    ) -> Callable[[], None] | None:
        """Make the next epoch start after its first ``batches`` batches, as ``state``
        recorded them. ``restore()`` puts the random generators where they were at the
        checkpoint; return what must run before that epoch's first step (``restore`` and
        the tracker's own state), which the tracker may also call earlier, when the
        epoch's first batch is about to be read. ``None``: it cannot, and the engine
        replays those batches instead."""
        ...

    def close(self) -> None:
        """The run is over: leave the data as it was."""
        ...


class ModeLike(Protocol):
    """A mode with its options (``runmodel.modes``): ``name`` is one of ``MODES``,
    ``kind`` the step it runs (``"train"``, ``"eval"`` or ``"infer"``)."""

    @property
    def name(self) -> str:
        """One of ``MODES``."""
        ...

    @property
    def kind(self) -> str:
        """The step a runstep is: ``"train"``, ``"eval"`` or ``"infer"``."""
        ...

    def budget(self, steps: int | None) -> int | None:
        """The step budget this mode runs with, ``steps`` given (checked here)."""
        ...

    def plan(self, engine: BareEngine, model: Any) -> StepPlan:
        """What a step does for ``model``; called after its setup, and checked then."""
        ...


class CheckpointStorage(Protocol):
    """How a run's checkpoints are written and read (``runmodel.checkpoint``: plain files,
    or under ``fsdp`` a folder of shards per save). The engine holds the run's as
    ``engine.storage``, for the packs that save (``Checkpoint``) and for whoever writes
    the run's final weights; the engine itself only reads the checkpoint a run resumes
    from through it."""

    #: whether a save writes the model's state itself (the ``fsdp`` backend's sharded
    #: storage), so that the engine's snapshot leaves it out
    writes_model_state: bool

    def load(self, path: str | os.PathLike[str], model: Any) -> tuple[Path, dict[str, Any]]:
        """``(the checkpoint used, its snapshot)`` for ``path``: a checkpoint, or a folder
        of them (its newest readable one). The snapshot is what ``engine.snapshot()``
        returned; its ``model`` part may be an object with ``restore_into(model)`` (a
        sharded checkpoint's, each process reading its own shards), which the engine
        calls in place of ``model.load_state_dict``."""
        ...

    def full_model_state(self, model: Any) -> dict[str, Any] | None:
        """Every process calls it (under ``fsdp`` a collective): the module's full state
        dict, or None on a process that does not get it (under ``fsdp``, all but rank 0)."""
        ...


class BackendLike(Protocol):
    """Prepares model and optimizer after ``model.setup()`` (``runmodel.backends``)."""

    def initialize(self, model: Any, spec: RunHorizon) -> None: ...

    def pack(self) -> Pack | None:
        """Hooks and overrides the backend needs during the run, if any."""
        ...

    def storage(self) -> CheckpointStorage | None:
        """After ``initialize``: how this run's checkpoints are written and read (a
        sharding backend's own), or None for the engine's own (plain files)."""
        ...


@dataclass(frozen=True)
class RunHorizon:
    """The run's horizon, so that schedules know it: epochs and steps in all (``None``
    where unknown), steps per epoch and batch size of the training data (when it has a
    ``len`` and a ``batch_size``)."""

    total_epochs: int | None
    total_steps: int | None
    steps_per_epoch: int | None
    batch_size: int | None

    @classmethod
    def of_model(cls, model: Any, kind: str, state: State) -> RunHorizon:
        """The horizon of a run of ``model``'s ``kind`` steps, with ``state``'s budget."""
        data_for = getattr(model, "data_for", None)
        try:
            data = data_for(kind) if data_for is not None else None
        except ValueError:  # no data of that kind
            data = None
        return cls.of(data, state.max_steps, state.max_epochs)

    @classmethod
    def of(cls, data: Any, steps: int | None, epochs: int | None) -> RunHorizon:
        try:
            per_epoch: int | None = len(data)
        except TypeError:
            per_epoch = None
        total = steps
        if total is None and epochs is not None and per_epoch is not None:
            total = epochs * per_epoch
        return cls(epochs, total, per_epoch, getattr(data, "batch_size", None))

"""What a run looks like from a hook: the state, the result, the runstep callable."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .checks import whole_number

if TYPE_CHECKING:
    from .engine import BareEngine

__all__ = [
    "REFUSED",
    "Interrupted",
    "Preempted",
    "Refusal",
    "Rewind",
    "RunResult",
    "RunStep",
    "State",
    "StopRun",
    "current_rank",
    "refused_at_setup",
    "run_lengths",
    "signal_name",
]


class Refusal(str):
    """The type of the note (``REFUSED``) on an error raised by the setup-time checks (a
    checkpoint that does not fit, a pack's ``check_setup``, a metric name): the run was
    refused before its first step. A note, so that the error keeps its own type (a
    ``ValueError`` stays one) and its traceback says it; read by its type, not its text."""


REFUSED = Refusal("runmodel: refused at setup, before the first step")


def refused_at_setup(error: BaseException) -> bool:
    """Whether ``error`` ended a run at its setup-time checks: bad input, not a failure
    of the run (the command line exits 2 for it, as for a usage error)."""
    return any(isinstance(note, Refusal) for note in getattr(error, "__notes__", ()))


class StopRun(BaseException):
    """Ends a run cleanly from inside ``runstep``: the budget is spent or ``stop()`` was
    called. A ``BaseException``, so a model's ``except Exception`` cannot swallow it."""


class Rewind(BaseException):
    """Leaves the step under way for ``engine.rewind(checkpoint)``: the engine goes on
    from ``checkpoint`` and starts the model's loop again. A ``BaseException``, as
    ``StopRun``, so a model's ``except Exception`` cannot swallow it."""

    def __init__(self, checkpoint: str | os.PathLike[str]) -> None:
        super().__init__(os.fspath(checkpoint))
        self.checkpoint = checkpoint


class Interrupted(KeyboardInterrupt):
    """The ``KeyboardInterrupt`` a run ends with when ``engine.interrupt()`` (a first
    Ctrl-C) stopped it: raised once the current step was done, so the run's state is
    whole and a ``Checkpoint`` pack saves it; ``exception`` hooks see it. ``signal`` is
    the signal that asked for it (SIGINT for Ctrl-C)."""

    signal: int = 2  # SIGINT


class Preempted(Interrupted):
    """The ``Interrupted`` a run ends with when a preemption signal (SIGTERM from a
    scheduler, or one the run was told to watch) stopped it; ``signal`` is its number."""

    def __init__(self, message: str, signal: int) -> None:
        super().__init__(message)
        self.signal = signal


def signal_name(number: int) -> str:
    """``SIGTERM`` for 15: a signal's name, as messages and run folders give it."""
    import signal

    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# shown as runmodel.Interrupted in tracebacks (the name users catch)
Interrupted.__module__ = Preempted.__module__ = "runmodel"


def run_lengths(
    steps: object, epochs: object, iterations: object
) -> tuple[int | None, int | None, int | None]:
    """``engine.run``'s ``steps``, ``epochs`` and ``iterations``, checked: each a whole
    number or None, and not both ``steps`` and ``iterations``."""
    steps = whole_number(steps, "steps=", none=True)
    epochs = whole_number(epochs, "epochs=", none=True)
    iterations = whole_number(iterations, "iterations=", none=True)
    if steps is not None and iterations is not None:
        raise ValueError(
            f"steps={steps} and iterations={iterations} exclude each other: both are "
            f"the run's length, iterations= in optimizer steps (k steps each under "
            f"GradAccumulation(k)); give one of them"
        )
    return steps, epochs, iterations


class State:
    """The run as hooks see it. Counters are 0-based indices while their unit runs and
    counts once it is done: in the first step ``step == 0``; after 3 epochs ``epoch == 3``.
    """

    __slots__ = (
        "accumulation",
        "batch",
        "divergence",
        "ended",
        "epoch",
        "epoch_complete",
        "epoch_step",
        "epoch_sums",
        "error",
        "files",
        "grad_scaler",
        "kind",
        "loss",
        "max_epochs",
        "max_iterations",
        "max_steps",
        "metrics",
        "mode",
        "output",
        "rank",
        "skipped",
        "step",
        "stopping",
        "timings",
        "window_padding",
    )

    def __init__(self) -> None:
        self.mode = self.kind = "train"  # kind: the step a runstep is (train, eval, infer)
        self.ended: str | None = None  # in teardown hooks: how the run ended (as the result)
        self.epoch = self.step = self.epoch_step = self.skipped = self.rank = 0
        # the runsteps of one iteration (GradAccumulation's k; the engine sets it when a
        # train run starts), and those that epochs' shorter last windows lacked, so that
        # a window always starts at a multiple of it (iteration reads both)
        self.accumulation = 1
        self.window_padding = 0
        self.max_steps: int | None = None
        self.max_epochs: int | None = None
        # iterations= (max_steps is it times accumulation): the run counts iterations
        self.max_iterations: int | None = None
        # in epoch_end: whether the epoch's loop finished (False when the budget or stop()
        # cut it short)
        self.epoch_complete = False
        self.batch: Any = None
        self.output: Any = None
        self.loss: Any = None
        self.metrics: dict[str, Any] = {}
        #: what accumulates over an epoch, by name (the train mode's sum of the step
        #: losses behind ``metrics["loss"]``): each a ``state_dict()``/``load_state_dict()``
        #: object, or the plain value a checkpoint gave until its owner takes it. Saved with
        #: the counters, so that an epoch a resume goes on with has the straight run's means
        self.epoch_sums: dict[str, Any] = {}
        # what packs measured (Timer); the run's result.timings holds it beside the mode's
        self.timings: dict[str, Any] = {}
        # files the run wrote that its result names (the Checkpoint pack's best and last)
        self.files: dict[str, str] = {}
        # the loss scaler of a mixed-precision run (the amp backend's GradScaler), so that
        # packs that read gradients (clipping, NaN checks) can unscale them first
        self.grad_scaler: Any = None
        self.error: BaseException | None = None
        #: the newest divergence found (``NaNGuard(locate=True)``, ``SpikeGuard``): the
        #: record it added to the run folder's ``divergence.json``; None while none is
        self.divergence: dict[str, Any] | None = None
        #: why the run is ending once it is: ``"stopped"`` (``stop()``), ``"budget"``
        #: (the step budget is spent), ``"interrupted"`` (Ctrl-C) or ``"preempted"`` (a
        #: preemption signal); None while it runs on. ``epoch_end`` hooks of an epoch cut
        #: short see it (an interrupted epoch is neither evaluated nor logged as one)
        self.stopping: str | None = None

    @property
    def iteration(self) -> int:
        """The iteration (optimizer step) the current runstep belongs to, from 0, as
        ``step`` is the runstep's; once the run is over, the iterations it did. Equal to
        ``step`` without gradient accumulation; ``step // k`` with ``GradAccumulation(k)``
        (an epoch whose steps are no multiple of k ends with a shorter window, one
        iteration too). Computed when read: a step costs nothing more for it."""
        return (self.step + self.window_padding) // self.accumulation

    @property
    def counts_iterations(self) -> bool:
        """Whether the run counts iterations apart from steps (it accumulates gradients,
        or was given ``iterations=``): then logs, the progress bar and TensorBoard's axis
        say iterations."""
        return self.accumulation > 1 or self.max_iterations is not None

    @property
    def interrupted(self) -> bool:
        """Whether an interrupt (Ctrl-C, a preemption signal) is ending the run."""
        return self.stopping in ("interrupted", "preempted")

    def start(
        self,
        mode: str,
        kind: str,
        max_steps: int | None,
        max_epochs: int | None,
        keep_counters: bool,
    ) -> None:
        """A new run: counters from 0 (or kept, for a resumed run), nothing from the last."""
        if not keep_counters:
            self.step = self.epoch = self.epoch_step = self.skipped = self.window_padding = 0
            self.loss, self.metrics, self.epoch_sums = None, {}, {}
            self.divergence = None
        self.mode, self.kind, self.max_steps, self.max_epochs = mode, kind, max_steps, max_epochs
        self.accumulation = 1
        self.ended = self.stopping = None
        self.rank = current_rank()
        self.batch = self.output = self.error = self.grad_scaler = None
        self.timings = {}
        self.files = {}

    def result(
        self, ended: str, reason: str | None, seconds: float, extras: dict[str, Any]
    ) -> RunResult:
        """The run's result: its counters and metrics, and the mode's ``extras`` (outputs,
        timings and files, merged over the packs' ``timings`` and ``files``)."""
        timings = {**self.timings, **extras.pop("timings", {})}
        extras.setdefault("iterations", self.iteration if self.counts_iterations else None)
        files = {**self.files, **extras.pop("files", {})}
        return RunResult(
            self.mode,
            ended,
            self.step,
            self.epoch,
            self.skipped,
            seconds,
            dict(self.metrics),
            timings=timings,
            files=files,
            reason=reason,
            **extras,
        )

    def __repr__(self) -> str:
        return (
            f"State(mode={self.mode!r}, epoch={self.epoch}, step={self.step}, "
            f"iteration={self.iteration}, epoch_step={self.epoch_step}, "
            f"skipped={self.skipped}, metrics={self.metrics})"
        )


def current_rank() -> int:
    """This process's rank: torch.distributed's once it is initialised, else ``$RANK``."""
    dist = sys.modules.get("torch.distributed")  # no group without it: not imported here
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return int(os.environ.get("RANK", "0"))


@dataclass
class RunResult:
    """What ``engine.run`` returns. ``ended`` is ``"completed"`` (the model's loop
    finished), ``"budget"`` (the step budget ran out) or ``"stopped"`` (``stop()``, with
    the ``reason`` it was given)."""

    mode: str
    ended: str
    steps: int
    epochs: int
    skipped: int
    seconds: float
    metrics: dict[str, Any] = field(default_factory=dict)
    outputs: list[Any] | None = None
    timings: dict[str, Any] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    reason: str | None = None
    #: the iterations (optimizer steps) done, where the run counts them
    #: (``State.counts_iterations``: gradients accumulated, or ``iterations=`` given)
    iterations: int | None = None


class RunStep(Protocol):
    """The callable handed to ``Model.run``: one call is one step."""

    engine: BareEngine
    mode: str
    kind: str
    steps: int | None

    def __call__(self, batch: Any = None) -> Any: ...

    def epochs(self) -> Iterator[int]: ...

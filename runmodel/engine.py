"""``runmodel.Engine``: the core engine (``runmodel.core``) with what needs the layers
above it. ``Engine.run`` is the core's run with these steps around it, each a method:

- ``instead_of_first_run``: how the ``runmodel`` command runs a script up to its
  ``engine.run`` and does the asked thing instead (given the run's ``RunArguments``);
- modes and backends given by name (``as_mode``, ``make_backend``), and a model's
  declared setup options checked before anything runs;
- ``run_dir=``: the run's folder (``_folder_for``): relative folders of packs go inside
  it, and a train run gets its writer (``session/folder.py``) with the packs a run in a
  folder has (``FinalEvaluation``, TensorBoard events unless a TensorBoard is attached);
- ``resume="auto"``: the attached Checkpoint packs' newest checkpoint
  (``_newest_checkpoint_folder``);
- the progress bar a terminal gets when nothing shows progress (``_progress_for``);
- the one interrupt path (``_run_watched``, ``session/interrupt.py``): Ctrl-C and the
  preemption signals end the run once its step is done and saved, the folder says how it
  ended, and the run says where it saved and how to go on;
- ``engine.ignite``: a pytorch-ignite view of the run."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from . import core
from .backends.distributed import env
from .checkpoint import FileStorage
from .config.registry import Spec, make_backend
from .models import setup_options_for
from .modes import as_mode
from .session.interrupt import (
    OUTPUT_CLOSED,
    StoppedAtOnce,
    ends_as_its_signal,
    preempting,
    say,
    signal_number,
    watch_interrupts,
)

if TYPE_CHECKING:
    import ignite.engine

    from .session.folder import RunFolder

__all__ = ["Engine", "RunArguments", "instead_of_first_run"]

#: What a backend may be given as: an object, or a registered name (with its arguments).
BackendArgument = core.BackendLike | Spec | str | dict[str, Any] | None


@dataclass(frozen=True)
class RunArguments:
    """``engine.run``'s arguments after the model, each documented here; what the
    ``runmodel`` command reads when it does something else in a script's run's place
    (``instead_of_first_run``)."""

    #: a mode's name (``train``, ``eval``, ``infer``, ``benchmark``, ``profile``) or a mode
    #: object with its options, such as ``runmodel.Benchmark(measure="infer")``
    mode: core.ModeLike | str = "train"
    #: at most this many steps, counted from the start of training (a resumed run given
    #: the same number ends where one straight run would); None: the model's loop decides
    steps: int | None = None
    #: at most this many epochs, counted likewise (a loop that never marks its epochs
    #: with ``runstep.epochs()`` is one)
    epochs: int | None = None
    #: what ``model.setup`` is given, checked against the options it declares
    setup_options: dict[str, Any] | None = None
    #: what prepares model and optimizer after ``model.setup()``: a ``Backend``, or a
    #: registered name (with its arguments); default ``plain``
    backend: BackendArgument = None
    #: a checkpoint file or a folder of them (its newest readable one) to continue from,
    #: or ``"auto"``: the newest checkpoint of the attached ``Checkpoint`` packs when
    #: there is one, else a fresh start (said on stderr), so a script rerun after a crash
    #: goes on where it was
    resume: str | os.PathLike[str] | None = None
    #: the folder a config run has, for a train run (``docs/runs.md``): ``run.json``,
    #: ``status.json``, ``metrics.json``, ``run.log``, the trained weights, TensorBoard
    #: events; packs given relative folders (``Checkpoint("checkpoint")``,
    #: ``TensorBoard``, ``Profile``) put them inside it, and ``runmodel runs``, ``plot``,
    #: ``eval`` and ``resume`` treat the run as a config run. A folder holding a run is
    #: continued with ``resume="auto"`` only
    run_dir: str | os.PathLike[str] | RunFolder | None = None
    #: signals (numbers or names: ``signal.SIGTERM``, ``"SIGUSR1"``) that end the run as
    #: Ctrl-C does, once its step is done: a ``Checkpoint`` pack saves that step, the run
    #: folder says ``preempted``, and ``runmodel.Preempted`` is raised (Ctrl-C:
    #: ``interrupted``, ``runmodel.Interrupted``); uncaught, it ends the process as the
    #: signal would have
    preempt_signals: tuple[int | str, ...] = ()
    #: at most this many iterations (optimizer steps: ``k`` steps each under
    #: ``GradAccumulation(k)``), counted likewise; instead of ``steps``, not with it
    iterations: int | None = None


#: What the first ``engine.run`` does instead while ``instead_of_first_run`` is in force.
_instead: ContextVar[Callable[[Engine, Any, RunArguments], Any] | None] = ContextVar(
    "runmodel_instead_of_first_run", default=None
)


@contextlib.contextmanager
def instead_of_first_run(replace: Callable[[Engine, Any, RunArguments], Any]) -> Iterator[None]:
    """While the block runs, the first ``engine.run`` (of any engine) calls
    ``replace(engine, model, arguments)`` instead and returns its result: how the
    ``runmodel`` command runs a script up to its run and then does the asked thing
    (describe, benchmark, evaluate with a trained run's weights, continue the run).
    Scoped to the block (and its thread): nothing outside it is changed."""
    token = _instead.set(replace)
    try:
        yield
    finally:
        _instead.reset(token)


class Engine(core.BareEngine):
    """Owns the phases, their hooks and overrides, the run state and the run.

    ``Engine(*packs)`` attaches ``packs`` as ``attach`` would. A train run shows a
    progress bar when the output is a terminal or a Jupyter kernel and no progress
    display is attached (``runmodel.packs.Progress``, or ignite's ``ProgressBar`` through
    ``engine.ignite``); ``progress=False`` turns that off."""

    def __init__(self, *packs: core.Pack, progress: bool = True) -> None:
        super().__init__(storage=FileStorage())  # plain files, unless the backend has its own
        self._ignite: Any = None
        self.progress = progress
        self._auto_progress: core.HookHandle | None = None  # the bar this run added
        self._on_setup: Callable[[Any], None] | None = None  # Ctrl-C: the loaders' workers
        if packs:
            self.attach(*packs)

    def run(
        self,
        model: Any,
        mode: core.ModeLike | str = "train",
        *,
        steps: int | None = None,
        epochs: int | None = None,
        setup_options: dict[str, Any] | None = None,
        backend: BackendArgument = None,
        resume: str | os.PathLike[str] | Literal["auto"] | None = None,
        run_dir: str | os.PathLike[str] | RunFolder | None = None,
        preempt_signals: Iterable[int | str] | int | str = (),
        iterations: int | None = None,
    ) -> core.RunResult:
        """Run ``model`` in ``mode`` for at most ``steps`` steps (or ``iterations``
        optimizer steps) and ``epochs`` epochs, prepared by ``backend``, from ``resume``,
        in ``run_dir``, stopped by Ctrl-C and ``preempt_signals`` once a step is done
        (each argument: ``RunArguments``). The steps around the core's run are the
        methods below, in this order (the module's docstring lists them)."""
        preempt = preempting(preempt_signals)  # bad input: before the run
        given = RunArguments(
            mode,
            steps,
            epochs,
            setup_options,
            backend,
            resume,
            run_dir,
            tuple(preempt),
            iterations,
        )
        replace = _instead.get()
        if replace is not None:
            _instead.set(None)  # once: the asked thing may run the engine itself
            return replace(self, model, given)
        mode = as_mode(mode)
        folder = self._folder_for(run_dir, mode) if run_dir is not None else None
        auto = resume == "auto"
        if auto:
            resume = self._newest_checkpoint_folder()
        setup_options = setup_options_for(model, setup_options)
        if folder is not None and not folder.claimed and env.rank() == 0:
            folder.claim(resuming=resume is not None, auto=auto)
        with self._attached_for_run(folder, mode):
            return self._run_watched(
                model, mode, folder, auto, preempt, steps=steps, epochs=epochs,
                setup_options=setup_options, backend=_backend(backend), resume=resume,
                iterations=iterations,
            )  # fmt: skip

    def _run_watched(
        self,
        model: Any,
        mode: core.ModeLike,
        folder: RunFolder | None,
        auto: bool,
        preempt: list[signal.Signals],
        **arguments: Any,
    ) -> core.RunResult:
        """The core's run, watched for Ctrl-C and the preemption signals (the one
        interrupt path); the folder's writer finishes on every outcome. An interrupted
        run saved before it ended: it then says where, and how to go on."""
        try:
            with watch_interrupts(self, preempt) as self._on_setup:
                try:  # the status written while a second signal is still the same one
                    result = super().run(model, mode, **arguments)
                except BaseException as error:
                    if folder is not None:
                        folder.finish(self, None, error)
                    raise
                if folder is not None:
                    folder.finish(self, result)
        except core.Interrupted as interrupted:  # saved: now say so, in one line
            if env.rank() == 0:
                say(self._interrupted(interrupted, auto, folder))
            ends_as_its_signal(interrupted)  # uncaught, it ends the process as its signal
            raise interrupted.with_traceback(None) from None
        except StoppedAtOnce as stopped:
            ends_as_its_signal(stopped)
            raise
        return result

    @contextlib.contextmanager
    def _attached_for_run(self, folder: RunFolder | None, mode: core.ModeLike) -> Iterator[None]:
        """For this run only: the folder's writer and the packs a run in a folder has
        (``folder_packs``), and a progress bar where one is wanted (``_progress_for``)."""
        bar = self._progress_for(mode) if self._loop is None else None
        if bar is not None:
            self._auto_progress = bar
        handle = self.attach(folder, *self.folder_packs(folder)) if folder is not None else None
        try:
            yield
        finally:
            if handle is not None:
                handle.detach()
            if bar is not None:
                bar.detach()
                self._auto_progress = None

    def _folder_for(
        self, run_dir: str | os.PathLike[str] | RunFolder, mode: core.ModeLike
    ) -> RunFolder | None:
        """``run_dir``: relative folders of attached packs (and of a Profile mode) go
        inside it; a train run gets a ``RunFolder``, its writer (a config or model
        source's run gives its own)."""
        from .session.folder import RunFolder, start_record

        given, directory = (
            (run_dir, run_dir.directory)
            if isinstance(run_dir, RunFolder)
            else (None, Path(run_dir))
        )
        for holder in (*self.table.packs.values(), mode):
            folder = getattr(holder, "directory", None)
            inside = isinstance(folder, Path) and (
                folder.parts[: len(directory.parts)] == directory.parts
            )
            if isinstance(folder, Path) and not folder.is_absolute() and not inside:
                setattr(holder, "directory", directory / folder)  # noqa: B010
        if mode.name != "train":
            return None
        return given or RunFolder(directory, start_record(self.table.packs, mode.name))

    def folder_packs(self, folder: RunFolder) -> list[core.Pack]:
        """What every run in a folder has beside its writer: the evaluation it ends with
        (``FinalEvaluation``), and TensorBoard events unless a TensorBoard is attached."""
        from .packs import TensorBoard
        from .packs.final_evaluation import FinalEvaluation
        from .session.folder import MODEL

        packs: list[core.Pack] = [FinalEvaluation(folder.directory / MODEL)]
        if not any(isinstance(p, TensorBoard) for p in self.table.packs.values()):
            packs.append(TensorBoard(folder.directory / "tensorboard"))
        return packs

    def _interrupted(
        self, interrupted: core.Interrupted, auto: bool, folder: RunFolder | None
    ) -> str:
        """What a run that an interrupt stopped says once it saved: where, how to go on."""
        from .packs.checkpoint import Checkpoint
        from .session.folder import COMMAND_KINDS

        if isinstance(interrupted, core.Preempted):
            what = signal_number(interrupted.signal).name
        else:
            what = "a closed output" if OUTPUT_CLOSED in str(interrupted) else "Ctrl-C"
        step = self.state.step
        saved = [
            p.last_path
            for p in self.table.packs.values()
            if isinstance(p, Checkpoint) and p.last_path is not None
        ]
        if not saved:
            return (
                f"runmodel: {what} stopped the run after step {step}; nothing saved "
                f"(attach a runmodel.packs.Checkpoint for a run that can go on)"
            )
        if folder is not None and folder.kind in COMMAND_KINDS:
            again = f"continue it with `runmodel resume {folder.directory}`"
        elif auto:
            again = 'run the script again (resume="auto" continues from it)'
        else:
            again = 'run it again with engine.run(..., resume="auto")'
        return f"runmodel: {what} stopped the run after step {step}; saved {saved[0]}; {again}"

    def _prepare(self, model: Any, *args: Any) -> Any:
        prepared = super()._prepare(model, *args)
        if self._on_setup is not None:  # the model's loaders exist now
            self._on_setup(model)
        return prepared

    def _progress_for(self, mode: core.ModeLike) -> core.HookHandle | None:
        """A progress bar for this run when one is wanted and none is attached."""
        from .packs.progress import Progress, interactive

        if (
            not self.progress
            or mode.name != "train"
            or not interactive(sys.stderr)
            or any(isinstance(p, Progress) for p in self.table.packs.values())
            or (self._ignite is not None and self._ignite.has_progress_bar())
        ):
            return None
        return self.attach(Progress())

    def state_dict(self, counters: dict[str, int] | None = None) -> dict[str, Any]:
        state = super().state_dict(counters)
        if self._auto_progress is not None:  # there or not by the terminal: not a run's state
            state["packs"] = {
                k: v
                for k, v in state["packs"].items()
                if self.table.packs.get(k) not in self._auto_progress.packs
            }
        return state

    def _newest_checkpoint_folder(self) -> Path | None:
        """For ``resume="auto"``: the attached Checkpoint packs' folder holding the newest
        checkpoint (``None`` when they hold none)."""
        from .checkpoint.names import checkpoints_in, newest
        from .packs.checkpoint import Checkpoint

        folders = {p.directory for p in self.table.packs.values() if isinstance(p, Checkpoint)}
        if not folders:
            raise ValueError(
                'resume="auto" continues from the newest checkpoint of an attached '
                "Checkpoint pack, and none is attached: attach one "
                '(engine.attach(runmodel.packs.Checkpoint("DIR"))) or pass '
                'resume="DIR"'
            )
        found = newest([c for f in folders if f.is_dir() for c in checkpoints_in(f)])
        if found is None:
            if env.rank() == 0:  # once, not once per process
                print(
                    f"runmodel: no checkpoint in {', '.join(sorted(map(str, folders)))} yet: "
                    f"starting fresh",
                    file=sys.stderr,
                )
            return None
        self.announce_resume = True  # once the checkpoint is read: a torn one is skipped
        return found.parent

    @property
    def ignite(self) -> ignite.engine.Engine:
        """A pytorch-ignite ``Engine`` that mirrors this engine's runs, built on first use,
        so that ignite's handlers and metrics attach to a runmodel run unchanged."""
        if self._ignite is None:
            from .integrations.ignite import IgniteView

            self._ignite = IgniteView(self)
        return self._ignite.engine


def _backend(backend: BackendArgument) -> core.BackendLike:
    """The backend a run is prepared by: the one given, or the one registered under the
    name given (default ``plain``)."""
    if backend is None or isinstance(backend, (str, Spec, dict)):
        return make_backend(backend or "plain")
    return backend

"""``runmodel.Engine``: the core engine (``runmodel.core``) with what needs the layers
above it: modes and backends given by name, a model's declared setup options checked
before anything runs, and ``engine.ignite``, a pytorch-ignite view of the run."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from . import core
from .backends.distributed import env
from .checkpoint import FileStorage
from .config.registry import Spec, make_backend
from .models import declared_options
from .modes import as_mode
from .runs.interrupt import ends_as_its_signal, say, signal_number, watch_interrupts

if TYPE_CHECKING:
    import ignite.engine

    from .runs.folder import RunFolder

__all__ = ["Engine", "instead_of_first_run"]

#: What the first ``engine.run`` does instead while ``instead_of_first_run`` is in force.
_instead: ContextVar[Callable[[Engine, Any, dict[str, Any]], Any] | None] = ContextVar(
    "runmodel_instead_of_run", default=None
)


@contextlib.contextmanager
def instead_of_first_run(replace: Callable[[Engine, Any, dict[str, Any]], Any]) -> Iterator[None]:
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


class Engine(core.Engine):
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
        mode: core.Mode | str = "train",
        *,
        steps: int | None = None,
        epochs: int | None = None,
        setup_options: dict[str, Any] | None = None,
        backend: core.Backend | Spec | str | dict[str, Any] | None = None,
        resume: str | os.PathLike[str] | Literal["auto"] | None = None,
        run_dir: str | os.PathLike[str] | RunFolder | None = None,
        preempt_signals: Iterable[int | str] = (),
    ) -> core.RunResult:
        """Run ``model`` in ``mode`` (a name, or a mode object with its options such as
        ``runmodel.Benchmark(measure="infer")``) for at most ``steps`` steps and
        ``epochs`` epochs.

        Without either, the model's loop decides (``runstep.epochs()`` yields one epoch).
        ``steps``/``epochs`` count from the start of training, so a resumed run given the
        same numbers ends where one straight run would. ``backend`` (a ``Backend`` or a
        registered name; default plain) prepares model and optimizer after
        ``model.setup()``; ``resume`` is a checkpoint file or a folder of them (its newest
        readable one), or ``"auto"``: the newest checkpoint of the attached ``Checkpoint``
        packs when there is one, else a fresh start (which, is said on stderr), so a script
        rerun after a crash goes on where it was.

        ``run_dir`` gives a train run the folder a config run has (``docs/runs.md``):
        ``run.json`` (how it was started), ``status.json``, ``metrics.json``, ``run.log``,
        the trained weights and TensorBoard events; packs given relative folders
        (``Checkpoint("checkpoint")``, ``TensorBoard``, ``Profile``) put them inside it.
        ``runmodel runs``, ``plot``, ``eval`` and ``resume`` then treat the run as a
        config run. A folder holding a run is continued with ``resume="auto"`` only.

        Ctrl-C, and each signal of ``preempt_signals`` (numbers or names, such as
        ``signal.SIGTERM`` or ``"SIGUSR1"``), end the run once its step is done: a
        ``Checkpoint`` pack saves that step, the run folder says ``interrupted`` (or
        ``preempted``), and ``runmodel.Interrupted`` (``runmodel.Preempted``) is raised;
        uncaught, it ends the process as the signal would have.
        """
        replace = _instead.get()
        if replace is not None:
            _instead.set(None)  # once: the asked thing may run the engine itself
            return replace(
                self,
                model,
                {
                    "mode": mode,
                    "steps": steps,
                    "epochs": epochs,
                    "setup_options": setup_options,
                    "backend": backend,
                    "resume": resume,
                    "run_dir": run_dir,
                    "preempt_signals": preempt_signals,
                },
            )
        mode = as_mode(mode)
        preempt = [signal_number(s) for s in preempt_signals]  # bad input: before the run
        folder = self._run_folder(run_dir, mode) if run_dir is not None else None
        auto = resume == "auto"
        if resume == "auto":
            resume = self._newest_checkpoint_folder()
        prepares = (
            make_backend(backend or "plain")
            if backend is None or isinstance(backend, (str, Spec, dict))
            else backend
        )
        if setup_options is not None or getattr(model, "setup_defaults", None):
            setup_options = declared_options(
                model, "setup", setup_options, getattr(model, "setup_defaults", {})
            )
        if folder is not None and not folder.claimed and env.rank() == 0:
            folder.claim(resuming=resume is not None, auto=auto)
        bar = self._progress_for(mode) if self._loop is None else None
        if bar is not None:
            self._auto_progress = bar
        handle = self.attach(folder) if folder is not None else None
        try:
            with watch_interrupts(self, preempt) as self._on_setup:
                result = super().run(
                    model,
                    mode,
                    steps=steps,
                    epochs=epochs,
                    setup_options=setup_options,
                    backend=prepares,
                    resume=resume,
                )
        except core.Interrupted as interrupted:  # saved: now say so, in one line
            if folder is not None:
                folder.finish(self, None, interrupted)
            if env.rank() == 0:
                say(self._interrupted(interrupted, auto, folder))
            ends_as_its_signal(interrupted)  # uncaught, it ends the process as its signal
            raise interrupted.with_traceback(None) from None
        except BaseException as error:
            if folder is not None:
                folder.finish(self, None, error)
            raise
        finally:
            if handle is not None:
                handle.detach()
            if bar is not None:
                bar.detach()
                self._auto_progress = None
        if folder is not None:
            folder.finish(self, result)
        return result

    def _run_folder(
        self, run_dir: str | os.PathLike[str] | RunFolder, mode: core.Mode
    ) -> RunFolder | None:
        """``run_dir``: relative folders of attached packs (and of a Profile mode) go
        inside it; a train run gets a ``RunFolder`` (and TensorBoard events there, unless
        a TensorBoard pack is attached). A config run gives its own ``RunFolder``."""
        from .packs import TensorBoard
        from .runs.folder import RunFolder, start_record

        given, directory = (
            (run_dir, run_dir.directory)
            if isinstance(run_dir, RunFolder)
            else (None, Path(run_dir))
        )
        packs = list(self.table.packs.values())
        for holder in (*packs, mode):
            folder = getattr(holder, "directory", None)
            inside = isinstance(folder, Path) and (
                folder.parts[: len(directory.parts)] == directory.parts
            )
            if isinstance(folder, Path) and not folder.is_absolute() and not inside:
                setattr(holder, "directory", directory / folder)  # noqa: B010
        if mode.name != "train":
            return None
        folder = given or RunFolder(directory, start_record(self.table.packs, mode.name))
        if not any(isinstance(p, TensorBoard) for p in packs):
            setattr(folder, "tensorboard", TensorBoard(directory / "tensorboard"))  # noqa: B010
        return folder

    def _interrupted(
        self, interrupted: core.Interrupted, auto: bool, folder: RunFolder | None
    ) -> str:
        """What a run that an interrupt stopped says once it saved: where, how to go on."""
        from .packs.checkpoint import Checkpoint
        from .runs.folder import COMMAND_KINDS

        what = (
            "Ctrl-C"
            if not isinstance(interrupted, core.Preempted)
            else signal_number(interrupted.signal).name
        )
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

    def _progress_for(self, mode: core.Mode) -> core.HookHandle | None:
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

"""``runmodel.Engine``: the core engine (``runmodel.core``) with what needs the layers
above it: modes and backends given by name, a model's declared setup options checked
before anything runs, and ``engine.ignite``, a pytorch-ignite view of the run."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from . import core
from .backends.distributed import env
from .config.registry import Spec, make_backend
from .models import declared_options
from .modes import as_mode
from .runs.interrupt import ctrl_c_finishes_the_step

if TYPE_CHECKING:
    import ignite.engine

    from .runs.folder import RunFolder

__all__ = ["Engine", "instead_of_first_run"]

#: What the first ``engine.run`` does instead while ``instead_of_first_run`` is in force.
_instead: ContextVar[Callable[[Engine, Any, dict[str, Any]], Any] | None] = ContextVar(
    "runmodel_instead_of_run", default=None)


@contextlib.contextmanager
def instead_of_first_run(replace: Callable[[Engine, Any, dict[str, Any]], Any]
                         ) -> Iterator[None]:
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
        super().__init__()
        self._ignite: Any = None
        self.progress = progress
        self._auto_progress: core.HookHandle | None = None  # the bar this run added
        self._on_setup: Callable[[Any], None] | None = None  # Ctrl-C: the loaders' workers
        if packs:
            self.attach(*packs)

    def run(self, model: Any, mode: core.Mode | str = "train", *, steps: int | None = None,
            epochs: int | None = None, setup_options: dict[str, Any] | None = None,
            backend: core.Backend | Spec | str | dict[str, Any] | None = None,
            resume: str | os.PathLike[str] | Literal["auto"] | None = None,
            run_dir: str | os.PathLike[str] | None = None) -> core.RunResult:
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
        """
        replace = _instead.get()
        if replace is not None:
            _instead.set(None)  # once: the asked thing may run the engine itself
            return replace(self, model, {
                "mode": mode, "steps": steps, "epochs": epochs, "setup_options": setup_options,
                "backend": backend, "resume": resume, "run_dir": run_dir})
        mode = as_mode(mode)
        folder = self._run_folder(Path(run_dir), mode) if run_dir is not None else None
        auto = resume == "auto"
        if resume == "auto":
            resume = self._newest_checkpoint_folder()
        prepares = (make_backend(backend or "plain") if backend is None
                    or isinstance(backend, (str, Spec, dict)) else backend)
        if setup_options is not None or getattr(model, "setup_defaults", None):
            setup_options = declared_options(model, "setup", setup_options,
                                             getattr(model, "setup_defaults", {}))
        if folder is not None:
            folder.check_start(resuming=resume is not None, auto=auto)
        bar = self._progress_for(mode) if self._loop is None else None
        if bar is not None:
            self._auto_progress = bar
        handle = self.attach(folder) if folder is not None else None
        try:
            with ctrl_c_finishes_the_step(self) as self._on_setup:
                result = super().run(model, mode, steps=steps, epochs=epochs,
                                     setup_options=setup_options, backend=prepares,
                                     resume=resume)
        except core.Interrupted as interrupted:  # one line, one short traceback
            if folder is not None:
                folder.finish(self, None, KeyboardInterrupt(*interrupted.args))
            print(self._interrupted(auto), file=sys.stderr, flush=True)
            # a plain KeyboardInterrupt: Python exits "killed by SIGINT" (130 in a shell)
            # only for that exact type, as it does for any Ctrl-C
            raise KeyboardInterrupt(*interrupted.args) from None
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

    def _run_folder(self, run_dir: Path, mode: core.Mode) -> RunFolder | None:
        """``run_dir``: relative folders of attached packs (and of a Profile mode) go
        inside it; a train run gets a ``RunFolder`` (and TensorBoard events there, unless
        a TensorBoard pack is attached)."""
        from .packs import TensorBoard
        from .runs.folder import RunFolder, start_record

        packs = list(self.table.packs.values())
        for holder in (*packs, mode):
            directory = getattr(holder, "directory", None)
            inside = isinstance(directory, Path) and (
                directory.parts[:len(run_dir.parts)] == run_dir.parts)
            if isinstance(directory, Path) and not directory.is_absolute() and not inside:
                setattr(holder, "directory", run_dir / directory)  # noqa: B010
        if mode.name != "train":
            return None
        folder = RunFolder(run_dir, start_record(self.table.packs, mode.name))
        if not any(isinstance(p, TensorBoard) for p in packs):
            setattr(folder, "tensorboard", TensorBoard(run_dir / "tensorboard"))  # noqa: B010
        return folder

    def _interrupted(self, auto: bool) -> str:
        """What a run that Ctrl-C stopped says: where it saved, how to go on."""
        from .packs.checkpoint import Checkpoint

        step = self.state.step
        saved = [p.directory / p.saved[-1] for p in self.table.packs.values()
                 if isinstance(p, Checkpoint) and p.saved]
        if not saved:
            return (f"runmodel: Ctrl-C stopped the run after step {step}; nothing saved "
                    f"(attach a runmodel.packs.Checkpoint for a run that can go on)")
        again = ('run the script again (resume="auto" continues from it)' if auto else
                 'run it again with engine.run(..., resume="auto")')
        return f"runmodel: Ctrl-C stopped the run after step {step}; saved {saved[0]}; {again}"

    def _prepare(self, model: Any, *args: Any) -> Any:
        prepared = super()._prepare(model, *args)
        if self._on_setup is not None:  # the model's loaders exist now
            self._on_setup(model)
        return prepared

    def _progress_for(self, mode: core.Mode) -> core.HookHandle | None:
        """A progress bar for this run when one is wanted and none is attached."""
        from .packs.progress import Progress, interactive

        if (not self.progress or mode.name != "train" or not interactive(sys.stderr)
                or any(isinstance(p, Progress) for p in self.table.packs.values())
                or (self._ignite is not None and self._ignite.has_progress_bar())):
            return None
        return self.attach(Progress())

    def state_dict(self, counters: dict[str, int] | None = None) -> dict[str, Any]:
        state = super().state_dict(counters)
        if self._auto_progress is not None:  # there or not by the terminal: not a run's state
            state["packs"] = {k: v for k, v in state["packs"].items()
                              if self.table.packs.get(k) not in self._auto_progress.packs}
        return state

    def _newest_checkpoint_folder(self) -> Path | None:
        """For ``resume="auto"``: the attached Checkpoint packs' folder holding the newest
        checkpoint (``None`` when they hold none)."""
        from .checkpoint.sharded import all_checkpoints_in as checkpoints_in
        from .packs.checkpoint import Checkpoint

        folders = {p.directory for p in self.table.packs.values() if isinstance(p, Checkpoint)}
        if not folders:
            raise ValueError('resume="auto" continues from the newest checkpoint of an attached '
                             'Checkpoint pack, and none is attached: attach one '
                             '(engine.attach(runmodel.packs.Checkpoint("DIR"))) or pass '
                             'resume="DIR"')
        newest = max((c for f in folders if f.is_dir() for c in checkpoints_in(f)),
                     key=lambda c: c.stem.rsplit("-", 2)[1:], default=None)  # epoch, step
        if newest is None:
            if env.rank() == 0:  # once, not once per process
                print(f"runmodel: no checkpoint in {', '.join(sorted(map(str, folders)))} yet: "
                      f"starting fresh", file=sys.stderr)
            return None
        self.announce_resume = True  # once the checkpoint is read: a torn one is skipped
        return newest.parent

    @property
    def ignite(self) -> ignite.engine.Engine:
        """A pytorch-ignite ``Engine`` that mirrors this engine's runs, built on first use,
        so that ignite's handlers and metrics attach to a runmodel run unchanged."""
        if self._ignite is None:
            from .integrations.ignite import IgniteView

            self._ignite = IgniteView(self)
        return self._ignite.engine

"""What a command runs: a target, opened from what the user named.

    ConfigTarget   a config file (``.toml``/``.json``), or a config run's folder
    ModelTarget    a model source: ``path/file.py``, ``file.py:Class``, ``package.module:Class``
    ScriptTarget   a ``.py`` file that defines no ``Model``, or sets its run up under
                   ``if __name__ == "__main__":`` without a ``configure(engine)``
                   (``script.is_script``; with its arguments), or the folder of a run a
                   script started (``engine.run(..., run_dir=)``)

``open_target(source)`` tells them apart; every command then asks the target, never the
kind of source. A target runs an *action* one way, ``target.run_with(action)``: it makes
the model and the engine as the source makes them and calls ``action(engine, model,
arguments)``, ``arguments`` being ``engine.run``'s arguments as the source gives them
(``runmodel.engine.RunArguments``). A script runs as ``__main__`` up to its first
``engine.run``, which the action replaces (``runs/script.py``). The actions are
``Describe``, ``Measure`` (benchmark, profile), ``Train`` (``runmodel run`` of a model),
``WithWeights`` (eval, infer with a trained run's weights) and ``Continue`` (resume a
script run). ``target.run(request)`` and ``target.resume(request)`` are what ``runmodel
run`` and ``runmodel resume`` do: a config's run and a model source's train run each in the
folder derived from it, prepared by the one preparer (``folder_run.py``, given a
``config_run.ConfigKind`` or a ``source_run.SourceKind``); a target that cannot do one says
why.

A run the command starts (or continues) is preempted by SIGTERM and by the signals of
``--preempt-signal`` (``RunRequest.preempt``), and interrupted by Ctrl-C, on the one
interrupt path (``runmodel/session/interrupt.py``).
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from .._io import read_json
from ..backends.distributed import env
from ..config import is_config_file
from ..config.overrides import split_options
from ..config.registry import check_model_args
from ..config.runconfig import RunConfig, load_config, overridden_model_args
from ..core import Pack, RunResult
from ..engine import Engine, RunArguments
from ..models import Model, configure_engine, load_model_class, resolve_options
from ..models.seeding import seed as seed_generators
from ..session.folder import RECORD, is_script_run, read_status
from ..session.interrupt import say
from . import torchrun
from .config_run import build_config, import_sources, load_run_config, prepare, resume_dir
from .folder_run import FolderRun, follow_into, prepare_in_folder, refuse_checkpoints_outside
from .script import is_script, main_block_ignored, run_script
from .source_run import SourceKind, source_record
from .weights import evaluate_model

__all__ = [
    "Action",
    "ConfigTarget",
    "Continue",
    "Describe",
    "Measure",
    "ModelTarget",
    "RunRequest",
    "ScriptTarget",
    "Target",
    "TargetError",
    "Train",
    "WithWeights",
    "open_run",
    "open_target",
]


class TargetError(ValueError):
    """What was named cannot be run, or not that way: bad input, said before any run."""


@contextlib.contextmanager
def loading() -> Iterator[None]:
    """Around what reads and builds a target (a source, a config, a run folder, options):
    what goes wrong there is bad input, raised as one ``TargetError`` with the cause's
    words (a ``KeyError``'s without its quotes)."""
    try:
        yield
    except TargetError:
        raise
    except (OSError, ImportError, ValueError, TypeError, KeyError, SyntaxError) as error:
        raise TargetError(_words(error)) from error


def _words(error: BaseException) -> str:
    """An error's message (a ``KeyError``'s without the quotes its ``str`` adds)."""
    if isinstance(error, KeyError) and len(error.args) == 1:
        return str(error.args[0])
    return str(error)


class Action(Protocol):
    """What a command does with a source's model and engine."""

    #: whether the action takes training steps: a config target then builds its backend
    #: and optimizer (evaluating weights needs neither)
    trains: ClassVar[bool]

    def __call__(self, engine: Engine, model: Any, arguments: RunArguments) -> Any: ...


@dataclass(frozen=True)
class RunRequest:
    """How ``runmodel run`` (or ``resume``) asks for a run: its mode and length (for a
    config: overrides of its values; for a resume: the length to continue to), whether to
    show progress, packs to attach (``--timer``), the distributed backend under torchrun
    (``--backend``), and for a config where its folder goes and what to do with a run
    there; the signals that preempt the run (``engine.run``'s ``preempt_signals``)."""

    mode: str | None = None
    epochs: int | None = None
    steps: int | None = None
    progress: bool = True
    packs: tuple[Pack, ...] = ()
    iterations: int | None = None
    backend: str | None = None
    runs_dir: str = "runs"
    resume: bool = False
    restart: bool = False
    preempt: tuple[int, ...] = ()


# -- actions --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Describe:
    """The model (class, device, parameters, options in effect) and the resolved phase and
    hook table of its engine; nothing runs."""

    source: str
    trains: ClassVar[bool] = False

    def __call__(self, engine: Engine, model: Any, arguments: RunArguments) -> str:
        cls = type(model)
        setup = arguments.setup_options
        if setup is None and getattr(cls, "setup_defaults", None):
            setup = dict(cls.setup_defaults)  # what the run would be given
        lines = [f"model: {cls.__qualname__} from {self.source}", f"device: {model.device}"]
        native = model.model()
        parameters = getattr(native, "parameters", None)
        if callable(parameters):
            count = sum(p.numel() for p in parameters())
            lines.append(f"module: {type(native).__name__}, {count:,} parameters")
        for kind, options in (("init", getattr(model, "init_options", None)), ("setup", setup)):
            if options:
                lines.append(
                    f"{kind} options: " + ", ".join(f"{k}={v!r}" for k, v in options.items())
                )
        return "\n".join(lines) + "\n\n" + engine.describe()


@dataclass(frozen=True)
class Measure:
    """A benchmark or profile run (``mode``, a ``Benchmark`` or ``Profile``) of ``steps``
    steps, with ``packs`` attached."""

    mode: Any
    steps: int | None
    packs: tuple[Pack, ...] = ()
    trains: ClassVar[bool] = True

    def __call__(self, engine: Engine, model: Any, arguments: RunArguments) -> RunResult:
        engine.attach(*self.packs)
        return engine.run(
            model,
            self.mode,
            steps=self.steps,
            backend=arguments.backend,
            setup_options=arguments.setup_options,
        )


@dataclass(frozen=True)
class Train:
    """``runmodel run`` of a model outside a run folder (``--mode eval``, ``infer``):
    ``request``'s mode and length, its progress display and packs; under torchrun with
    the distributed backend."""

    request: RunRequest
    trains: ClassVar[bool] = True

    def __call__(self, engine: Engine, model: Any, arguments: RunArguments) -> RunResult:
        from ..packs import Progress

        request = self.request
        mode = request.mode or arguments.mode
        if request.progress and mode == "train":
            engine.attach(Progress())
        engine.attach(*request.packs)
        backend = (request.backend or "ddp") if env.launched() else arguments.backend
        return engine.run(
            model,
            mode,
            steps=request.steps,
            epochs=request.epochs,
            setup_options=arguments.setup_options,
            backend=backend,
            preempt_signals=request.preempt,
            iterations=request.iterations,
        )


@dataclass(frozen=True)
class WithWeights:
    """Eval or infer (``mode``) with ``weights`` loaded into the model once it is set up
    (``averaged``: the average an EMA or SWA pack kept in the checkpoint), on the model's
    eval data (``split="test"``: its test data)."""

    weights: Path
    mode: str
    averaged: bool = False
    split: str = "eval"
    trains: ClassVar[bool] = False

    def __call__(self, engine: Engine, model: Any, arguments: RunArguments) -> RunResult:
        return evaluate_model(
            model,
            self.weights,
            self.mode,
            setup_options=arguments.setup_options,
            averaged=self.averaged,
            split=self.split,
        )


@dataclass(frozen=True)
class Continue:
    """A run continued in its folder ``run_dir`` from its newest checkpoint, to ``epochs``
    (``steps``, or ``iterations`` instead of steps) from its start: more than it has
    extends it; preempted by ``preempt`` too. The folder named here wins over the one
    the script gives (a copied run folder continues in the copy), and a copy whose
    Checkpoint pack saves outside it is refused (``refuse_checkpoints_outside``)."""

    run_dir: Path
    epochs: int | None
    steps: int | None
    preempt: tuple[int, ...] = ()
    iterations: int | None = None
    trains: ClassVar[bool] = True

    def __call__(self, engine: Engine, model: Any, arguments: RunArguments) -> RunResult:
        record = read_json(self.run_dir / RECORD)
        epochs = self.epochs if self.epochs is not None else record.get("epochs", arguments.epochs)
        steps = self.steps if self.steps is not None else record.get("steps", arguments.steps)
        if self.iterations is not None:  # the length in iterations, instead of steps
            steps = None
        named = _folder_of(arguments.run_dir)
        follow_into(engine, self.run_dir, named)
        with loading():  # bad input: said as the command says it
            refuse_checkpoints_outside(engine, self.run_dir, named)
        return engine.run(
            model,
            arguments.mode,
            epochs=epochs,
            steps=steps,
            iterations=self.iterations,
            setup_options=arguments.setup_options,
            backend=arguments.backend,
            resume="auto",
            run_dir=self.run_dir,
            preempt_signals=(*self.preempt, *arguments.preempt_signals),
        )


def _folder_of(run_dir: Any) -> Path | None:
    """The folder a script's ``engine.run(..., run_dir=)`` names (from its working
    folder), if it names one."""
    if run_dir is None:
        return None
    return Path(getattr(run_dir, "directory", run_dir)).resolve()


# -- targets --------------------------------------------------------------------------------


class Target(abc.ABC):
    """Something a command runs (see the module's docstring)."""

    #: what it is, in words, for messages ("a script", "a config")
    what: ClassVar[str]
    source: str
    #: the run folder it came from, if it was opened from one
    directory: Path | None = None

    @abc.abstractmethod
    def run_with(self, action: Action) -> Any:
        """The model and engine as the source makes them, given to ``action``."""

    def describe(self) -> str:
        text: str = self.run_with(Describe(self.source))
        return text

    @abc.abstractmethod
    def run(self, request: RunRequest) -> RunResult:
        """``runmodel run``."""

    def resume(self, request: RunRequest) -> RunResult:
        """``runmodel resume``: the run of this target's folder, continued."""
        raise TargetError(
            f"{self.source} is {self.what}, not a run folder: `runmodel resume` "
            f"continues a run from its folder"
        )

    def processes(self) -> dict[str, Any] | None:
        """How a continuation of this target's run is launched (``world_size``,
        ``nproc_per_node``, ``nnodes``), where it needs torchrun; else None."""
        return None


@dataclass
class ModelTarget(Target):
    """A model source, with the command's ``--device``, ``--set`` options and ``--seed``;
    or a model source's run folder (``directory``: the source and options it records,
    ``record``). A train run goes into the run folder derived from it
    (``source_run.py``)."""

    source: str
    device: str | None = None
    options: Sequence[str] = ()
    seed: int | None = None
    directory: Path | None = None
    record: dict[str, Any] | None = None
    what: ClassVar[str] = "a model source"

    @classmethod
    def of_run(cls, directory: Path) -> ModelTarget:
        record = read_json(directory / RECORD)
        if not isinstance(record.get("source"), str):
            raise TargetError(
                f"{directory} is a model source's run, and its run.json names "
                f"no source to make its model from"
            )
        return cls(
            record["source"],
            record.get("device"),
            seed=record.get("seed"),
            directory=directory,
            record=record,
        )

    def _model(self) -> tuple[type[Model], Model, dict[str, Any], dict[str, Any], dict[str, Any]]:
        """The model class, the init and setup options given (``--set``, or as the run
        folder records them), the model (made after seeding, where a seed is given) and
        its setup options resolved against its declared ones."""
        cls = load_model_class(self.source)
        if self.record is not None:
            init = dict(self.record.get("init_options") or {})
            setup = dict(self.record.get("setup_options") or {})
        else:
            init, setup = split_options(self.options, cls)
        if self.seed is not None:
            seed_generators(self.seed)
        model = cls(device=self.device, init_options=init or None)
        resolved = setup
        if getattr(cls, "setup_defaults", None):  # a bad setup option is bad input too
            resolved = resolve_options(model, "setup", setup, cls.setup_defaults)
        return cls, model, init, setup, resolved

    @staticmethod
    def _engine(cls: type[Model], model: Model, packs: Sequence[Pack] = ()) -> Engine:
        """The engine: ``packs`` attached, then what the model's file configures."""
        engine = Engine(progress=False)  # the command attaches its own (--no-progress)
        engine.attach(*packs)
        configure_engine(cls, engine, model)
        return engine

    def run_with(self, action: Action) -> Any:
        with loading():
            cls, model, _, _, setup = self._model()
            engine = self._engine(cls, model)
        return action(engine, model, RunArguments(setup_options=setup or None))

    def run(self, request: RunRequest) -> RunResult:
        """A train run in the run folder derived from the source (``source_run.py``); an
        eval or infer run (``--mode``) in none."""
        if self.directory is not None:
            raise TargetError(
                f"{self.directory} is a run folder: continue its run with "
                f"`runmodel resume {self.directory}`"
            )
        if (request.mode or "train") != "train":
            result: RunResult = self.run_with(Train(request))
            return result
        if self.seed is None:  # seeded as a config run is (seed = 0 unless told)
            self.seed = 0
        return self._in_folder(request)

    def resume(self, request: RunRequest) -> RunResult:
        if self.directory is None:
            return super().resume(request)
        return self._in_folder(request)

    def processes(self) -> dict[str, Any] | None:
        if self.directory is None or self.record is None:
            return None
        return _processes(self.directory, self.record.get("backend") in torchrun.BACKENDS)

    def _backend(self, request: RunRequest) -> str | None:
        """Under torchrun, the distributed backend: ``--backend``, or the one the run
        records, else ``ddp``; in one process the plain one (None)."""
        recorded = None if self.record is None else self.record.get("backend")
        if not env.launched():
            return None
        if request.backend and recorded and request.backend != recorded:
            raise TargetError(
                f"--backend {request.backend}: the run in {self.directory} "
                f"trains with backend {recorded!r}; drop --backend"
            )
        return str(request.backend or recorded or "ddp")

    def _in_folder(self, request: RunRequest) -> RunResult:
        """The source's train run in its folder (``folder_run.py``): a new one (or
        ``--resume``, ``--restart`` of the one there), or the folder's run continued."""
        with loading():
            if request.resume and request.restart:
                raise TargetError("--resume and --restart exclude each other")
            cls, model, init, setup, resolved = self._model()
            backend = self._backend(request)
            epochs, steps = request.epochs, request.steps
            if self.directory is None or self.record is None:
                assert self.seed is not None
                record = source_record(
                    self.source,
                    cls,
                    init=init,
                    setup=setup,
                    device=self.device,
                    seed=self.seed,
                    backend=backend,
                    epochs=epochs,
                    steps=steps,
                    iterations=request.iterations,
                )
            else:  # the folder's run, to the length it has now unless told
                record = {**self.record, "backend": backend}
                status = read_status(self.directory)
                epochs = (
                    epochs if epochs is not None else status.get("epochs", record.get("epochs"))
                )
                if request.iterations is None:  # --iterations replaces the steps it had
                    steps = steps if steps is not None else status.get("steps", record.get("steps"))
            kind = SourceKind(
                record,
                lambda: (model, resolved or None, cls),
                (epochs, steps, request.iterations),
            )
            prepared = prepare_in_folder(
                kind,
                request.runs_dir,
                directory=self.directory,
                resume=request.resume or self.directory is not None,
                restart=request.restart,
                progress=request.progress,
                packs=request.packs,
            )
        return _run_in_folder(prepared, request)


@dataclass
class ScriptTarget(Target):
    """A script run as ``__main__`` with ``argv`` from ``cwd``; from a script run's folder,
    as the run was started (its record, ``run.json``)."""

    source: str
    argv: Sequence[str] = ()
    cwd: str = "."
    directory: Path | None = None
    what: ClassVar[str] = "a script"

    @classmethod
    def of_run(cls, directory: Path) -> ScriptTarget:
        record = read_json(directory / RECORD)
        script = record.get("script")
        if not script or not Path(script).is_file():
            raise TargetError(
                f"{directory} is a script run, and its script {script!r} is not there to run"
            )
        return cls(script, record.get("argv") or [], record.get("cwd", "."), directory)

    def run_with(self, action: Action) -> Any:
        return run_script(self.source, self.argv, self.cwd, action)

    def run(self, request: RunRequest) -> RunResult:
        """``runmodel run`` takes a model source or a config: loading the script as a model
        source says what it lacks (a Model subclass), or which import failed; a file
        whose model's run is set up under its ``__main__`` block says so."""
        with loading():
            cls = load_model_class(self.source)
        raise TargetError(
            f'{self.source} sets its run up under `if __name__ == "__main__":` and '
            f"defines no configure(engine), so it is a script (every command runs it as "
            f"one): run it with `python {self.source}`, move that setup into a "
            f"configure(engine) function, or name the class to train it without that "
            f"setup (`runmodel run {self.source}:{cls.__name__}`)"
        )

    def resume(self, request: RunRequest) -> RunResult:
        if self.directory is None:
            return super().resume(request)
        say(f"run directory: {self.directory} (a run of {self.source})")
        result: RunResult = self.run_with(
            Continue(
                self.directory, request.epochs, request.steps, request.preempt, request.iterations
            )
        )
        return result


@dataclass
class ConfigTarget(Target):
    """A config (read from ``source`` with its overrides), or a config run's folder
    (``directory``: the config it was started with). ``base`` is where the config's
    relative imports are found; ``model_args`` the model options given on the command
    line (checked against what the model declares)."""

    source: str
    config: RunConfig
    base: Path
    directory: Path | None = None
    model_args: dict[str, str] = dataclasses.field(default_factory=dict)
    what: ClassVar[str] = "a config"

    @classmethod
    def of_file(cls, path: str, overrides: Sequence[str] = ()) -> ConfigTarget:
        base = Path(path).resolve().parent
        return cls(
            path, load_config(path, overrides), base, model_args=overridden_model_args(overrides)
        )

    @classmethod
    def of_run(cls, directory: Path) -> ConfigTarget:
        config, base = load_run_config(directory)
        return cls(str(directory), config, base, directory)

    def _checked(self, request: RunRequest | None = None) -> RunConfig:
        """The config with ``request``'s mode and length as overrides, its imports loaded
        and its command-line model options checked against the model's."""
        config = self.config
        if request is not None:
            config = config.with_overrides(
                [
                    f"{key}={value!r}"
                    for key, value in (
                        ("mode", request.mode),
                        ("epochs", request.epochs),
                        ("steps", request.steps),
                        ("iterations", request.iterations),
                    )
                    if value is not None
                ],
                source=self.source,
            )
        if self.model_args:
            import_sources(config, self.base)
            unchecked = check_model_args(config.model, self.model_args)
            if unchecked:
                print(
                    f"runmodel: warning: model {config.model.type_!r} declares no init "
                    f"options (init_defaults), so these go to it unchecked: "
                    f"{', '.join(self.model_args[name] for name in unchecked)}",
                    file=sys.stderr,
                )
        return config

    def run_with(self, action: Action) -> Any:
        with loading():
            config = self._checked()
            if _distributed(config) and not env.launched():  # one process, plain backend
                config = dataclasses.replace(config, backend=None)
            config, model, backend, imported = build_config(
                config, self.base, backend=action.trains
            )
            engine = Engine(progress=False)
            for module in imported:
                configure_engine(module, engine, model)
        return action(
            engine,
            model,
            RunArguments(
                mode=config.mode,
                epochs=config.epochs,
                steps=config.steps,
                backend=backend,
                setup_options=dict(config.setup) or None,
            ),
        )

    def describe(self) -> str:
        """The model and the engine a run of the config has: its packs (and the default
        ones) as ``prepare`` attaches them, prepared in a throwaway folder (describing a
        run writes nothing)."""
        with loading(), tempfile.TemporaryDirectory(prefix="runmodel-describe-") as folder:
            config = self._checked()
            prepared = prepare(config, directory=Path(folder) / "run", base=self.base)
        engine = prepared.engine  # what a run attaches: its folder's writer and packs
        engine.attach(prepared.folder, *engine.folder_packs(prepared.folder))
        return Describe(f"{self.source} (model {config.model.type_!r})")(
            engine, prepared.model, RunArguments()
        )

    def run(self, request: RunRequest) -> RunResult:
        if self.directory is not None:
            raise TargetError(
                f"{self.source} is a run folder: continue its run with "
                f"`runmodel resume {self.source}`"
            )
        with loading():
            if request.resume and request.restart:
                raise TargetError("--resume and --restart exclude each other")
            config = self._checked(request)
            self._refuse_outside_torchrun(config, "run it")
            prepared = prepare(
                config,
                request.runs_dir,
                resume=request.resume,
                restart=request.restart,
                progress=request.progress,
                packs=request.packs,
                base=self.base,
                backend=request.backend,
            )
        return _run_in_folder(prepared, request)

    def resume(self, request: RunRequest) -> RunResult:
        if self.directory is None:
            return super().resume(request)
        with loading():
            self._refuse_outside_torchrun(self.config, "resume it")
            prepared = resume_dir(
                self.directory,
                progress=request.progress,
                epochs=request.epochs,
                steps=request.steps,
                iterations=request.iterations,
                packs=request.packs,
            )
        return _run_in_folder(prepared, request)

    def processes(self) -> dict[str, Any] | None:
        if self.directory is None:
            return None
        return _processes(self.directory, _distributed(self.config))

    def _refuse_outside_torchrun(self, config: RunConfig, doing: str) -> None:
        """A ``ddp``/``fsdp`` run outside torchrun would fail at setup on a missing process
        group: said at once, with how to start it."""
        if _distributed(config) and not env.launched():
            assert config.backend is not None
            raise TargetError(
                f"{self.source}: the config's backend is "
                f"{config.backend.type_!r}, which runs in processes torchrun "
                f"starts: {doing} with --nproc-per-node N (1 for one process)"
            )


def _processes(directory: Path, distributed: bool) -> dict[str, Any] | None:
    """How the run in ``directory`` continues: a run of ``ddp`` or ``fsdp`` under
    torchrun, in the processes its status records; where the status does not say (it is
    damaged, or the run never wrote it), in one process, as its own record
    (``distributed``) or its sharded checkpoints say it needs torchrun's process group.
    None: in this process (a one-process run of the plain, amp, compile... backend)."""
    status = read_status(directory)
    world = status.get("world_size")
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        world = 1
    if world <= 1 and not (
        status.get("backend") in torchrun.BACKENDS or distributed or _sharded(directory)
    ):
        return None
    return {
        "world_size": world,
        "nproc_per_node": status.get("nproc_per_node", world),
        "nnodes": status.get("nnodes", 1),
    }


def _distributed(config: RunConfig) -> bool:
    """Whether the config's backend runs in processes torchrun starts."""
    return config.backend is not None and config.backend.type_ in torchrun.BACKENDS


def _run_in_folder(prepared: FolderRun, request: RunRequest) -> RunResult:
    """A prepared run (a config's, a model source's), said where it runs (by rank 0).
    Ctrl-C and the request's preemption signals end it as any run ends: saved, its folder
    saying how to go on, ``runmodel.Interrupted`` (``Preempted``) raised."""
    if env.rank() == 0:
        say(
            f"run directory: {prepared.directory}"
            + (f" (resuming from {prepared.checkpoint})" if prepared.checkpoint else "")
        )
    return prepared.run(request.preempt)


def _sharded(directory: Path) -> bool:
    """Whether the run folder holds sharded checkpoints (an ``fsdp`` run's)."""
    from ..checkpoint.names import checkpoints_in

    return any(path.is_dir() for path in checkpoints_in(directory))


def open_target(
    source: str,
    *,
    device: str | None = None,
    options: Sequence[str] = (),
    argv: Sequence[str] = (),
    seed: int | None = None,
) -> Target:
    """The target ``source`` names: a config file (``options`` are its ``--set``
    overrides, ``device`` and ``seed`` more), a run folder (``open_run``), a script (run
    with ``argv`` from here), or a model source (``device``, ``options`` and ``seed`` its
    own)."""
    if Path(source).is_dir():
        return open_run(source)
    with loading():
        if is_config_file(source):
            overrides = [
                *options,
                *([f"device={device!r}"] if device is not None else []),
                *([f"seed={seed!r}"] if seed is not None else []),
            ]
            return ConfigTarget.of_file(source, overrides)
        if is_script(source):
            return ScriptTarget(source, argv, os.getcwd())
        if main_block_ignored(source):  # the user named the class: say what is left out
            say(
                f"runmodel: note: {source} is loaded as a model source: the "
                f'`if __name__ == "__main__":` block of {source.partition(":")[0]} does not '
                f"run, so the packs and hooks it attaches are not attached (name the file "
                f"alone to run it as a script, or attach them in a configure(engine))"
            )
        return ModelTarget(source, device, options, seed)


def open_run(directory: str | os.PathLike[str]) -> Target:
    """The target of a run folder: a model source's run (its source and options, as
    recorded), a script run's (its script, as it was started), else a config run's (its
    config; a folder that holds none says so)."""
    with loading():
        found = Path(directory).resolve()
        if read_json(found / RECORD).get("kind") == "source":
            return ModelTarget.of_run(found)
        return ScriptTarget.of_run(found) if is_script_run(found) else ConfigTarget.of_run(found)

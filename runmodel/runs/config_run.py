"""Config runs: every config run lands in a folder derived from its config, and is an
engine run in that folder (``engine.run(..., run_dir=RunFolder)``): the files are those
of every run folder (``folder.py``), with the config beside them.

    runs/digits-hidden128_adam-lr0.005_3f9a2c1b40/
        config.json      the canonical config (its hash is in the folder's name)
        run.json         its kind, id, digest, the folder its imports are found from
        status.json      running / finished / failed / interrupted / preempted, ...
        metrics.json     the final result: metrics, steps, epochs, how it ended
        run.log          one line per epoch and at the start and end
        model.pt         the trained weights
        checkpoint/      checkpoints (every epoch, the newest 2, unless the config's
                         checkpoint pack says otherwise)
        tensorboard/     event files

The same config always resolves to the same folder; running it again there resumes or
restarts only when asked, and never overwrites a run silently.

Under torchrun (``runmodel run CONFIG --nproc-per-node N``: ``torchrun.py``) every process
builds the run and rank 0 alone claims the folder and writes its files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._io import read_json
from ..backends.distributed import env
from ..checkpoint.names import checkpoints_in
from ..config.registry import (
    Spec,
    known_model_args,
    make_backend,
    make_interface,
    make_model,
    make_pack,
    optimizer_factory,
    registries,
)
from ..config.runconfig import RunConfig
from ..core import Pack, RunResult
from ..engine import Engine
from ..models import configure_engine, load_source
from ..models.seeding import seed
from ..packs import MLflow, TensorBoard
from . import torchrun
from .folder import RunExists, RunFolder, read_status, record_status
from .interrupt import say
from .table import flatten

__all__ = [
    "INTERRUPTED",
    "PreparedRun",
    "RunExists",
    "claim_folder",
    "execute",
    "prepare",
    "record_launch_failure",
    "resume_dir",
    "run_dir_for",
    "tell_launcher",
]

#: What an interrupted run's ``reason`` says (a run interrupted by Ctrl-C raises
#: ``runmodel.Interrupted``: no result carries it any more).
INTERRUPTED = "interrupted: Ctrl-C"


#: Packs every config run has (with their defaults) unless its config lists them itself.
DEFAULT_PACKS = ("checkpoint", "tensorboard", "progress")


def run_dir_for(config: RunConfig, root: str | os.PathLike[str] = "runs") -> Path:
    return Path(root) / config.run_name()


def import_sources(config: RunConfig, base: Path) -> None:
    """Load the files and modules ``config.imports`` names (a relative ``.py`` from
    ``base``), which register what the config names."""
    for item in config.imports:
        path = base / item if item.endswith(".py") and not os.path.isabs(item) else item
        load_source(str(path))


@dataclass
class PreparedRun:
    """A config checked and built, its directory claimed: ``run()`` starts it."""

    config: RunConfig
    folder: RunFolder
    model: Any
    backend: Any
    engine: Engine
    checkpoint: Path | None
    base: Path
    #: the length to run to, where it is not the config's (``runmodel resume --epochs``)
    epochs: int | None = None
    steps: int | None = None
    #: whether this process writes the run folder's files (rank 0 under torchrun)
    lead: bool = True

    @property
    def directory(self) -> Path:
        return self.folder.directory

    def run(self, preempt_signals: Iterable[int | str] = ()) -> RunResult:
        """Run it: an engine run in its folder, which records status, metrics and the
        trained model there (``RunFolder``, as a script's ``run_dir=`` run does);
        ``preempt_signals`` as ``engine.run`` takes them (the command: SIGTERM and those
        of ``--preempt-signal``).

        The first Ctrl-C stops the run once the current step is done: the Checkpoint pack
        saves where it stopped, the run is marked ``interrupted``, and the run raises
        ``runmodel.Interrupted``; ``runmodel resume`` continues it exactly. A second
        Ctrl-C interrupts at once.
        """
        config = self.config
        epochs = config.epochs if self.epochs is None else self.epochs
        steps = config.steps if self.steps is None else self.steps
        if self.lead:
            tell_launcher(self.directory)
        return self.engine.run(
            self.model,
            mode=config.mode,
            steps=steps,
            epochs=epochs,
            backend=self.backend,
            resume=self.checkpoint,
            run_dir=self.folder,
            preempt_signals=preempt_signals,
        )


#: Where the launcher (``runmodel run --nproc-per-node``) learns the run folder, to name
#: a killed process in its status.
LAUNCH_RECORD = "RUNMODEL_LAUNCH_RECORD"


def tell_launcher(run_dir: Path) -> None:
    """Under a launch of several processes, tell the launcher the run's folder."""
    path = os.environ.get(LAUNCH_RECORD)
    if path and env.several():
        with contextlib.suppress(OSError):
            Path(path).write_text(str(run_dir.resolve()))


def record_launch_failure(run_dir: Path, rank: int, text: str) -> None:
    """The launcher's word on a failed run in several processes: which process failed
    first (rank 0, which wrote the status, may only have seen a peer go)."""
    status = read_json(run_dir / "status.json")
    if not status or status.get("status") == "finished":
        return
    seen = status.get("error")
    status.update(
        status="failed", error=text, failed_rank=rank, ended=status.get("ended") or time.time()
    )
    if seen and seen != text:
        status["rank_0_error"] = seen
    record_status(run_dir, status, RuntimeError(text))


def build(
    config: RunConfig, base: str | os.PathLike[str] = ".", *, backend: bool = True
) -> tuple[RunConfig, Any, Any]:
    """The config as a run records it, and the model and the backend it names, seeded
    (``base``: where relative ``imports`` are found). ``backend=False``: the model alone
    (None for the backend), to evaluate a run's weights in this one process, whatever
    backend (ddp, fsdp) trained it."""
    seed(config.seed)  # runmodel.seed: before the model is built
    import_sources(config, Path(base))
    # issue 19: a model option the model ignores names no folder and changes no hash
    config = dataclasses.replace(config, model=known_model_args(config.model))
    model = make_model(config.model, device=config.device)
    if config.interface is not None:
        model.interface = make_interface(config.interface)
    if not backend:
        return config, model, None
    made = make_backend(config.backend or "plain")
    if config.optimizer is not None:  # a bad name or bad arguments show now
        made.optimizer = optimizer_factory(config.optimizer)
    return config, model, made


def load_run_config(directory: Path) -> tuple[RunConfig, Path]:
    """The config of the config run in ``directory`` and the folder its relative
    ``imports`` are found from."""
    data = read_json(directory / "config.json")
    if not data:
        raise FileNotFoundError(f"{directory} is not a run directory (no readable config.json)")
    base = read_json(directory / "run.json").get("base") or read_status(directory).get("base")
    return RunConfig.from_dict(data, source=str(directory / "config.json")), Path(base or ".")


def prepare(
    config: RunConfig,
    root: str | os.PathLike[str] = "runs",
    *,
    directory: str | os.PathLike[str] | None = None,
    resume: bool = False,
    restart: bool = False,
    take_over: bool = False,
    base: str | os.PathLike[str] = ".",
    engine: Engine | None = None,
    progress: bool = True,
    packs: Sequence[Pack] = (),
    backend: str | None = None,
) -> PreparedRun:
    """Check and build everything ``config`` names, then claim its run directory
    (``directory``, or derived under ``root``; a new run creates it, so two runs of one
    config cannot both start there); nothing is written before that works.

    If the directory holds a run already, ``resume=True`` continues it from its newest
    checkpoint and ``restart=True`` moves it aside (``NAME.old-TIME``) and starts anew;
    otherwise ``RunExists`` says so. ``take_over=True`` continues a run whose status says
    it is running elsewhere (a sweep's trial whose machine died): from its newest
    checkpoint where there is one, else afresh (saying so). ``base`` is where relative
    ``imports`` are found. ``progress=False`` leaves out the default progress display;
    ``packs`` are attached too (``runmodel run --timer`` gives a Timer).

    Under torchrun the run takes the config's ``ddp`` or ``fsdp`` backend, else
    ``backend`` (``--backend``; default ``ddp``); rank 0 alone claims the directory and
    tells the others (``torchrun.py``). A group torchrun restarted after a failure
    (``--max-restarts``) continues the run from its newest checkpoint, as ``runmodel
    resume`` would (with none yet, it starts over, the old folder kept beside it).
    """
    if env.several():
        config = torchrun.with_backend(config, backend)
    if env.restarted():  # torchrun started the group again (--max-restarts): continue
        resume, restart, take_over = True, False, True
    config, model, made_backend = build(config, base)
    run_dir = Path(directory) if directory is not None else run_dir_for(config, root)
    named = {spec.type_ for spec in config.packs}
    # every run directory holds checkpoints and TensorBoard events, and a run shows its
    # progress; a config that lists these packs sets their options
    defaults = [
        Spec(name)
        for name in DEFAULT_PACKS
        if name not in named and (progress or name != "progress")
    ]
    made = [
        *packs,
        *(make_pack(spec, directory=run_dir / spec.type_) for spec in (*config.packs, *defaults)),
    ]
    status = {}
    if env.launched():  # what `runmodel resume` relaunches with (1 process too)
        status = {**env.launch_world(), "backend": config.backend and config.backend.type_}
    folder = RunFolder(
        run_dir,
        {
            "kind": "config",
            "digest": config.digest(),
            "base": str(Path(base).resolve()),
            "cwd": os.getcwd(),
        },
        files={"config.json": config.to_dict()},
        status=status,
        claimed=True,
    )
    checkpoint = claim_folder(
        folder, resume=resume, restart=restart, take_over=take_over, same="config"
    )
    engine = engine or Engine(progress=False)  # progress= above decides
    for pack in made:  # the config's values: TensorBoard's HParams, MLflow's parameters
        if isinstance(pack, (TensorBoard, MLflow)):
            pack.hparams = flatten(config.to_dict())
        if isinstance(pack, MLflow) and pack.run_name is None:
            pack.run_name = run_dir.name  # the MLflow run named as the run's folder
    engine.attach(*made)
    configure_engine(registries["model"].get(config.model.type_), engine)
    return PreparedRun(
        config, folder, model, made_backend, engine, checkpoint, Path(base), lead=env.rank() == 0
    )


def claim_folder(
    folder: RunFolder, *, resume: bool, restart: bool, take_over: bool, same: str = "config"
) -> Path | None:
    """Claim the folder of a config's (or a model source's) run for a new run, or find
    the checkpoint to continue its run from (``resume``, ``take_over``), or move its run
    aside (``restart``): see ``prepare``. Returns the checkpoint to continue from. Under
    torchrun rank 0 alone claims it and tells the others, which must have derived the
    same folder (from the same ``same``: config, source and options)."""
    run_dir = folder.directory
    decision = torchrun.decided(
        lambda: {
            "directory": str(run_dir),
            "checkpoint": (
                None
                if (found := _claim(folder, resume, restart, take_over)) is None
                else str(found)
            ),
        }
    )
    if Path(decision["directory"]).resolve() != run_dir.resolve():
        raise ValueError(
            f"process rank 0 runs in {decision['directory']}, this process "
            f"(rank {env.rank()}) would in {run_dir}: start every process "
            f"with the same {same}, in the same working folder"
        )
    return None if decision["checkpoint"] is None else Path(decision["checkpoint"])


def _claim(folder: RunFolder, resume: bool, restart: bool, take_over: bool) -> Path | None:
    """``claim_folder`` in the process that claims it."""
    run_dir = folder.directory
    if folder.holds_run():
        status = read_status(run_dir)
        if status.get("status") == "running" and (resume or restart) and not take_over:
            raise RunExists(
                f"{run_dir} is running now (pid {status.get('pid')} on "
                f"{status.get('host')}); wait for it, or stop it first"
            )
        if not (resume or restart or take_over):
            folder.claim(resuming=False)  # says it holds a run, and what to do
        if resume or take_over:
            found = checkpoints_in(run_dir)
            if found:
                return found[0].parent
            if resume and not take_over:
                raise FileNotFoundError(
                    f"{run_dir} has no checkpoint to resume from: the run (status "
                    f"{status.get('status', 'unknown')}) ended before it wrote its first one; "
                    f"start it again with --restart (the old run is kept beside it)"
                )
            say(
                f"runmodel: {run_dir} holds no checkpoint of its run to continue from: "
                f"starting it over (the old folder is kept beside it)"
            )
        folder.move_aside()
    elif resume:
        raise FileNotFoundError(f"no run to resume at {run_dir}")
    elif take_over:
        say(f"runmodel: {run_dir} is not here (a folder of another machine): starting the run over")
    try:  # a new run: claim the directory, or find it taken
        run_dir.mkdir(parents=True)
    except FileExistsError:
        raise RunExists(
            f"{run_dir} exists but holds no run: another run of this config "
            f"may be starting; if not, remove the empty directory"
        ) from None
    return None


def execute(
    config: RunConfig, root: str | os.PathLike[str] = "runs", **options: Any
) -> tuple[RunResult, Path]:
    """``prepare(config, root, **options).run()``; returns the result and the directory."""
    prepared = prepare(config, root, **options)
    return prepared.run(), prepared.directory


def resume_dir(
    directory: str | os.PathLike[str],
    engine: Engine | None = None,
    *,
    epochs: int | None = None,
    steps: int | None = None,
    **options: Any,
) -> PreparedRun:
    """Prepare the run in ``directory`` to continue from its newest checkpoint; with
    ``epochs``/``steps``, to that length (more than it has: an extension, recorded in
    its status and run log; its config and folder stay those it was started with)."""
    directory = Path(directory)
    config, base = load_run_config(directory)
    prepared = prepare(
        config, directory=directory, resume=True, base=base, engine=engine, **options
    )
    prepared.epochs, prepared.steps = epochs, steps
    if epochs is None and steps is None:  # the length it has now (after an extension)
        status = read_status(directory)
        prepared.epochs = status.get("epochs", config.epochs)
        prepared.steps = status.get("steps", config.steps)
    return prepared

"""A run in a folder derived from its source: the one way a config's run and a model
source's train run are prepared (``prepare``) and started (``FolderRun.run``); a sweep's
trial is a config's run.

A kind of run (``RunKind``: ``config_run.ConfigKind``, ``source_run.SourceKind``)
supplies only what differs between them: its record (``run.json``: what a resume needs to
start it again), its identity (the fields hashed into the folder's name), the readable
part of that name, the values trackers record, and how its model, backend and packs are
built. ``prepare`` owns the rest, once for every kind:

    the folder's name       ``run_dir_for``: readable part, then the identity's digest
    the default packs       a checkpoint every epoch (the newest 2), TensorBoard events,
                            progress, unless the kind's own packs include them
    the trackers' names     every pack with ``describe_run(name, params)`` (TensorBoard's
                            HParams, MLflow's run name and params) is told them
    torchrun                every process builds the run (a ``ddp`` or ``fsdp`` backend),
                            rank 0 alone claims the folder and tells the others; a group
                            torchrun restarted continues the run
    the claim               a new run creates its folder; one there is continued
                            (``resume``, ``take_over``) or moved aside (``restart``), or
                            refused with what to do
    the run                 ``engine.run(..., run_dir=RunFolder)``: the folder's one
                            writer (``session/folder.py``) records it

    runs/digits-hidden128_adam-lr0.005_3f9a2c1b40/
        run.json, status.json, metrics.json, run.log, model.pt    (``session/folder.py``)
        config.json      a config run's canonical config
        checkpoint/      checkpoints (unless the kind's packs say otherwise)
        tensorboard/     event files
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .._io import read_json
from ..backends.distributed import env
from ..checkpoint.names import checkpoints_in
from ..config.registry import Spec, make_pack
from ..config.runconfig import RunConfig, run_folder_name
from ..core import Pack, RunResult
from ..engine import Engine
from ..models import configure_engine
from ..session.folder import (
    COMMAND_KINDS,
    STATUS,
    RunExists,
    RunFolder,
    read_status,
    record_status,
)
from ..session.interrupt import say
from . import torchrun

__all__ = [
    "DEFAULT_PACKS",
    "LAUNCH_RECORD",
    "Built",
    "DescribesRun",
    "FolderRun",
    "RunKind",
    "claim_folder",
    "follow_into",
    "prepare_in_folder",
    "record_launch_failure",
    "refuse_checkpoints_outside",
    "run_dir_for",
    "tell_launcher",
]

#: Packs every run in a derived folder has (with their defaults) unless its kind's own
#: packs include them: checkpoints, TensorBoard events, progress.
DEFAULT_PACKS = ("checkpoint", "tensorboard", "progress")

#: Where the launcher (``runmodel run --nproc-per-node``) learns the run folder, to name
#: a killed process in its status.
LAUNCH_RECORD = "RUNMODEL_LAUNCH_RECORD"


@dataclass(frozen=True)
class Built:
    """A kind's run, built: the model (seeded), the backend that prepares it, the setup
    options it is given, and what its ``configure(engine)`` is called from (a model
    source's class: its file's; a config's imported modules, each of its own)."""

    model: Any
    backend: Any
    setup_options: dict[str, Any] | None
    configured_by: tuple[Any, ...] = ()


class RunKind(Protocol):
    """What a kind of run in a derived folder supplies (the module's docstring)."""

    @property
    def kind(self) -> str:
        """``run.json``'s kind (``session.folder.COMMAND_KINDS``)."""
        ...

    @property
    def mode(self) -> str:
        """The mode it runs in."""
        ...

    @property
    def epochs(self) -> int | None:
        """Its length in epochs (None: as the model's loop decides)."""
        ...

    @property
    def steps(self) -> int | None:
        """Its length in steps (None: as the model's loop decides)."""
        ...

    @property
    def iterations(self) -> int | None:
        """Its length in iterations, instead of steps (None: not given so)."""
        ...

    @property
    def config(self) -> RunConfig | None:
        """The config it runs, as built (a model source's run has none)."""
        ...

    def under_torchrun(self, backend: str | None) -> RunKind:
        """This run in several processes: with its ``ddp``/``fsdp`` backend, or
        ``backend`` (``--backend``; default ``ddp``), which is part of its identity."""
        ...

    def build(self) -> tuple[RunKind, Built]:
        """The run as built (a config without the model options its model ignores), and
        what it runs."""
        ...

    def record(self) -> dict[str, Any]:
        """How the run is started, as ``run.json`` records it."""
        ...

    def identity(self) -> Any:
        """What makes the run, hashed into its folder's name (JSON data)."""
        ...

    def readable_name(self) -> str:
        """The readable part of its folder's name."""
        ...

    def params(self) -> dict[str, Any]:
        """The values trackers record for the run (flat: ``optimizer.args.lr``)."""
        ...

    def files(self) -> dict[str, dict[str, Any]]:
        """Files written beside ``run.json`` at its setup (a config's ``config.json``)."""
        ...

    def backend_name(self) -> str | None:
        """The backend's registered name, if the run names one."""
        ...

    def packs(self, run_dir: Path) -> list[Pack]:
        """Its own packs (a config's), in ``run_dir``."""
        ...


@runtime_checkable
class DescribesRun(Protocol):
    """A pack that records a run's name and parameters (TensorBoard's HParams, MLflow's
    run name and params): a run in a derived folder tells it both before the run."""

    def describe_run(self, name: str, params: Mapping[str, Any]) -> None: ...


def run_dir_for(run: RunKind | RunConfig, root: str | os.PathLike[str] = "runs") -> Path:
    """The folder of ``run``'s run (a kind's, or a config's) under ``root``: readable and
    unique (``config.runconfig.run_folder_name``)."""
    identity = run.identity()
    return Path(root) / run_folder_name(run.readable_name(), identity)


def default_packs(run_dir: Path, progress: bool = True, named: Iterable[str] = ()) -> list[Pack]:
    """``DEFAULT_PACKS`` in ``run_dir`` (but those ``named`` already, and the progress
    display unless ``progress``)."""
    own = set(named)
    return [
        make_pack(Spec(name), directory=run_dir / name)
        for name in DEFAULT_PACKS
        if name not in own and (progress or name != "progress")
    ]


@dataclass
class FolderRun:
    """A run prepared in its folder, the folder claimed: ``run()`` starts (or continues)
    it."""

    folder: RunFolder
    engine: Engine
    model: Any
    #: the kind of run, as built (a config's: ``kind.config`` is what it runs)
    kind: RunKind
    built: Built
    #: the checkpoint to continue from (None: from step 0)
    checkpoint: Path | None
    epochs: int | None
    steps: int | None

    @property
    def directory(self) -> Path:
        return self.folder.directory

    @property
    def config(self) -> RunConfig | None:
        """The config the run runs, as built (None for a model source's run)."""
        return self.kind.config

    def run(self, preempt_signals: Iterable[int | str] = ()) -> RunResult:
        """An engine run in its folder, which records status, metrics and the trained
        model there (``RunFolder``, as a script's ``run_dir=`` run does); Ctrl-C and
        ``preempt_signals`` (the command: SIGTERM and those of ``--preempt-signal``) end
        it as every run ends: saved, its folder saying how to go on, ``runmodel.Interrupted``
        (``Preempted``) raised. ``runmodel resume`` continues it exactly."""
        if env.rank() == 0:
            tell_launcher(self.directory)
        return self.engine.run(
            self.model,
            self.kind.mode,
            steps=self.steps,
            # unless a length in steps replaced it (a resume's: --steps, or its status's)
            iterations=self.kind.iterations if self.steps is None else None,
            epochs=self.epochs,
            setup_options=self.built.setup_options,
            backend=self.built.backend,
            resume=self.checkpoint,
            run_dir=self.folder,
            preempt_signals=preempt_signals,
        )


def prepare_in_folder(
    kind: RunKind,
    root: str | os.PathLike[str] = "runs",
    *,
    directory: str | os.PathLike[str] | None = None,
    resume: bool = False,
    restart: bool = False,
    take_over: bool = False,
    engine: Engine | None = None,
    progress: bool = True,
    packs: Sequence[Pack] = (),
    backend: str | None = None,
) -> FolderRun:
    """Build ``kind``'s run and claim its folder (``directory``, or derived under
    ``root``; a new run creates it, so two runs of one source cannot both start there);
    nothing is written before that works.

    If the folder holds a run already, ``resume=True`` continues it from its newest
    checkpoint and ``restart=True`` moves it aside (``NAME.old-TIME``) and starts anew;
    otherwise ``RunExists`` says so. ``take_over=True`` continues a run whose status says
    it is running elsewhere (a sweep's trial whose machine died): from its newest
    checkpoint where there is one, else afresh (saying so). ``progress=False`` leaves out
    the default progress display; ``packs`` are attached too (``runmodel run --timer``).

    Under torchrun the run takes its ``ddp`` or ``fsdp`` backend, else ``backend``
    (``--backend``; default ``ddp``); rank 0 alone claims the folder and tells the others.
    A group torchrun restarted after a failure (``--max-restarts``) continues the run from
    its newest checkpoint, as ``runmodel resume`` would (with none yet, it starts over,
    the old folder kept beside it)."""
    if env.several():
        kind = kind.under_torchrun(backend)
    if env.restarted():  # torchrun started the group again (--max-restarts): continue
        resume, restart, take_over = True, False, True
    kind, built = kind.build()
    run_dir = Path(directory) if directory is not None else run_dir_for(kind, root)
    own = kind.packs(run_dir)
    named = [getattr(p, "name", "") for p in own]
    engine = engine or Engine(progress=False)  # progress= above decides
    engine.attach(*packs, *own, *default_packs(run_dir, progress, named))
    for source in built.configured_by:
        configure_engine(source, engine, built.model)
    record = kind.record()
    record.setdefault("directory", str(run_dir.resolve()))  # where it was started
    if directory is not None:  # a folder's run continued: its checkpoints stay inside it
        refuse_checkpoints_outside(engine, run_dir, _started_in(record))
    status = {}
    if env.launched():  # what `runmodel resume` relaunches with (1 process too)
        status = {**env.launch_world(), "backend": kind.backend_name()}
    folder = RunFolder(run_dir, record, files=kind.files(), status=status, claimed=True)
    checkpoint = claim_folder(
        folder, resume=resume, restart=restart, take_over=take_over, same=kind.kind
    )
    for pack in engine.table.packs.values():
        if isinstance(pack, DescribesRun):
            pack.describe_run(run_dir.name, kind.params())
    return FolderRun(folder, engine, built.model, kind, built, checkpoint, kind.epochs, kind.steps)


def _started_in(record: Mapping[str, Any]) -> Path | None:
    """The folder a run was started in, as its record says."""
    directory = record.get("directory")
    return Path(directory).resolve() if isinstance(directory, str) else None


def follow_into(engine: Engine, run_dir: Path, named: Path | None) -> None:
    """A run continued in ``run_dir`` (a copy, a folder moved) whose script names its own
    folder ``named`` (``engine.run(..., run_dir=)``, resolved): a pack folder inside
    ``named``, however the script spelled it (``RUN + "/checkpoint"``, absolute or
    relative to the working folder), is the same folder inside ``run_dir``."""
    if named is None:
        return
    for pack in engine.table.packs.values():
        folder = getattr(pack, "directory", None)
        if isinstance(folder, Path) and folder.resolve().is_relative_to(named):
            pack.directory = run_dir.resolve() / folder.resolve().relative_to(named)  # type: ignore[attr-defined]


def refuse_checkpoints_outside(engine: Engine, run_dir: Path, started_in: Path | None) -> None:
    """A run continued in a folder other than the one it was started in (a copy, a
    folder moved or moved aside) must not save into a Checkpoint folder outside it: that
    folder holds the checkpoints of the run that was started there. Said before the run
    (bad input), naming the folder."""
    from ..packs.checkpoint import Checkpoint

    here = run_dir.resolve()
    if started_in is None or started_in == here:
        return
    for pack in engine.table.packs.values():
        if not isinstance(pack, Checkpoint):
            continue
        folder = Path(pack.directory)  # a relative one goes inside run_dir (engine.run)
        folder = (folder if folder.is_absolute() else here / folder).resolve()
        if not folder.is_relative_to(here):
            raise ValueError(
                f"{run_dir} is a copy of the run folder {started_in} (or was moved from "
                f"there), and its Checkpoint pack saves in {folder}, outside it: continuing "
                f"the copy would write into the checkpoints of the run in {started_in}. "
                f"Give the Checkpoint pack a folder inside run_dir (as "
                f'Checkpoint("checkpoint")), or resume {started_in} itself'
            )


def claim_folder(
    folder: RunFolder, *, resume: bool, restart: bool, take_over: bool, same: str = "config"
) -> Path | None:
    """Claim the folder for a new run, or find the checkpoint to continue its run from
    (``resume``, ``take_over``), or move its run aside (``restart``): see
    ``prepare_in_folder``. Returns the checkpoint to continue from. Under torchrun rank 0 alone
    claims it and tells the others, which must have derived the same folder (from the
    same ``same``: config, or model source and options)."""
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
            f"{run_dir} exists but holds no run: another run of this "
            f"{COMMAND_KINDS.get(folder.kind, 'source')} may be starting; if not, remove the "
            f"empty directory"
        ) from None
    return None


def tell_launcher(run_dir: Path) -> None:
    """Under a launch of several processes, tell the launcher the run's folder."""
    path = os.environ.get(LAUNCH_RECORD)
    if path and env.several():
        with contextlib.suppress(OSError):
            Path(path).write_text(str(run_dir.resolve()))


def record_launch_failure(run_dir: Path, rank: int, text: str) -> None:
    """The launcher's word on a failed run in several processes: which process failed
    first (rank 0, which wrote the status, may only have seen a peer go)."""
    status = read_json(run_dir / STATUS)  # as written: a launcher's word on a dead run
    if not status or status.get("status") == "finished":
        return
    seen = status.get("error")
    status.update(
        status="failed", error=text, failed_rank=rank, ended=status.get("ended") or time.time()
    )
    if seen and seen != text:
        status["rank_0_error"] = seen
    record_status(run_dir, status, RuntimeError(text))

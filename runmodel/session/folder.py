"""A run's folder, and the one object that writes it: every train run given a folder
(``engine.run(..., run_dir=PATH)`` from a script, ``runmodel run CONFIG``) writes the same
files the same way (``docs/runs.md``).

    run.json       how the run was started: its kind (script or config) and id, its start
                   time; a script's path, arguments and working folder; a config's digest
                   and the folder its imports are found from; the packs, epochs/steps
                   (as extended), library versions
    config.json    a config run's canonical config (its hash names the folder)
    status.json    running / finished / failed / interrupted / preempted, times, pid,
                   host, the run's id, epochs and steps, the best and last checkpoints;
                   in a group torchrun restarted, the restarts and whose failure each
                   followed
    metrics.json   the final result: metrics (``eval_*`` measured once training is done;
                   ``test_*``: the model's ``test_data``, evaluated once with the best
                   weights: ``packs/final_evaluation.py``), steps, epochs, how it ended
    run.log        one line at the start, at each epoch's end and at the end
    model.pt       the trained weights (the interface's save; under ``fsdp`` the full
                   state gathered from every process)
    eval.json      after the run: each ``runmodel eval`` of its weights
                   (``record_evaluation``)
    tensorboard/   event files

Paths in ``status.json`` and ``metrics.json`` are relative to the folder, so a folder that
is moved, copied or renamed still names its own checkpoints. Status writes survive a full
disk: the folder keeps a small reserve file that a status write frees when the disk is
full.

``runmodel.runs`` (above the engine) lists, evaluates and continues runs from these files.
"""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import sys
import time
import traceback
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .._io import DiskFullError, read_json, write_json
from ..backends.distributed.failures import restarts
from ..core import Hook, HookOptions, Interrupted, Pack, Preempted, RunResult
from ..core.state import refused_at_setup, signal_name

if TYPE_CHECKING:
    from ..checkpoint.storage import Storage

__all__ = [
    "COMMAND_KINDS",
    "INTERRUPTS",
    "RunExists",
    "RunFolder",
    "is_run",
    "is_script_run",
    "live_pid",
    "mark",
    "read_status",
    "record_evaluation",
    "record_status",
    "resolve",
    "start_record",
]

STATUS, RECORD, METRICS, CONFIG, MODEL, EVAL = (
    "status.json",
    "run.json",
    "metrics.json",
    "config.json",
    "model.pt",
    "eval.json",
)
#: A run ended by one of these can be continued: it stopped on its own path and saved.
INTERRUPTS = ("interrupted", "preempted")
#: The kinds of run (``run.json``'s ``kind``) that the ``runmodel`` command starts in a
#: folder it derives (from a config, or a model source): ``runmodel resume`` continues
#: them, ``--restart`` starts them again.
COMMAND_KINDS = {"config": "config", "source": "model source"}
#: Freed by a status write that meets a full disk, so that the status is always written.
RESERVE, RESERVE_BYTES = ".runmodel-reserve", 64 * 1024
#: How much of a failure's traceback the status keeps.
TRACEBACK_CHARS = 2000


class RunExists(FileExistsError):
    """The folder holds a run already, or another live process runs in it: continue it,
    restart it, or give this run another folder."""


def live_pid(status: dict[str, Any]) -> int | None:
    """The pid of the live process of this host that a ``running`` status names, if any."""
    pid = status.get("pid")
    if (
        status.get("status") != "running"
        or status.get("host") != socket.gethostname()
        or (not isinstance(pid, int) or pid <= 0)
    ):  # pid 0 would ask about our process group
        return None
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, ValueError):
        return None
    except PermissionError:
        pass
    return pid


def is_run(directory: Path) -> bool:
    """Whether ``directory`` is a run folder: a config run's (``config.json``) or a script
    run's (``run.json``, written by ``engine.run(..., run_dir=)``)."""
    return (directory / CONFIG).is_file() or (directory / RECORD).is_file()


def is_script_run(directory: Path) -> bool:
    return not (directory / CONFIG).is_file() and (directory / RECORD).is_file()


def read_status(directory: Path) -> dict[str, Any]:
    """The run's status: a run marked running whose process (on this host) is gone was
    interrupted; a status file that does not parse is ``damaged`` (its checkpoints still
    say where the run stands)."""
    path = Path(directory) / STATUS
    status = read_json(path)
    if not status and path.is_file() and path.read_bytes().strip():
        return {"status": "damaged"}
    if (
        status.get("status") == "running"
        and status.get("host") == socket.gethostname()
        and live_pid(status) is None
    ):
        status["status"] = "interrupted"
    return status


def resolve(directory: Path, name: str | None) -> Path | None:
    """A path that the run folder's files name: relative to the folder (as they are
    written), or, in folders written before, absolute or relative to where the run was
    started."""
    if not name:
        return None
    path = Path(name)
    return path if path.is_absolute() else Path(directory) / path


def _relative(directory: Path, files: dict[str, str]) -> dict[str, str]:
    """``files`` with the paths inside ``directory`` made relative to it."""
    inside = {}
    for key, name in files.items():
        try:
            inside[key] = str(Path(name).resolve().relative_to(directory.resolve()))
        except (ValueError, OSError):
            inside[key] = name
    return inside


def versions() -> dict[str, str]:
    """The versions of Python, torch and runmodel running now."""
    import torch

    try:  # as runmodel.__version__ (the package's __init__ is above this module)
        runmodel = version("runmodel")
    except PackageNotFoundError:
        runmodel = "0+unknown"
    return {"python": platform.python_version(), "torch": torch.__version__, "runmodel": runmodel}


def start_record(packs: dict[str, Pack], mode: str) -> dict[str, Any]:
    """How a run is being started from a Python script: the script and its arguments,
    the working folder, the packs attached (key and class), the mode, and the seed the
    script set with ``runmodel.seed`` (None: it set none)."""
    from ..models.seeding import last_seed  # here: reading a run folder imports no torch

    main = sys.modules.get("__main__")
    script = getattr(main, "__file__", None)
    return {
        "kind": "script",
        "script": None if script is None else str(Path(script).resolve()),
        "argv": list(sys.argv[1:]),
        "cwd": os.getcwd(),
        "mode": mode,
        "packs": {key: type(pack).__name__ for key, pack in packs.items()},
        "seed": last_seed(),
    }


class RunFolder(Pack):
    """The folder of one train run, and the one writer of its files (the module's
    docstring). ``record`` is how the run was started (``kind``: script or config, and
    what a resume needs to start it again); ``files`` are written beside it at the run's
    setup (a config run's ``config.json``); ``status`` adds keys to the status (the
    processes of a torchrun launch). ``claimed``: the folder was claimed for this run
    already (``claim``), as a config run's is before its processes start.

    Before the run, ``claim`` refuses a folder that another live process runs in and a
    run from step 0 into a folder that holds a run. At setup (rank 0) it writes the
    record and the status ``running``; at teardown, once training ended without an error
    (every process: under ``fsdp`` gathering the weights is collective), it writes the
    trained weights; ``finish`` writes the status and the final metrics. It writes, and
    only writes: the ``eval_*`` and ``test_*`` metrics it records are measured by the
    ``FinalEvaluation`` pack that a run in a folder has beside it."""

    name = "run_folder"

    def __init__(
        self,
        directory: str | os.PathLike[str],
        record: dict[str, Any] | None = None,
        *,
        files: dict[str, dict[str, Any]] | None = None,
        status: dict[str, Any] | None = None,
        claimed: bool = False,
    ) -> None:
        self.directory = Path(directory)
        self.record = dict(record or {})
        self.files = dict(files or {})
        self.extra = dict(status or {})
        self.claimed = claimed
        from ..packs.run_log import RunLog  # here: reading a run folder imports no torch

        self.log = RunLog(self.directory / "run.log")
        self.began = False  # whether this run claimed the folder (its setup hook ran)
        self._status: dict[str, Any] = {}

    # -- before the run -------------------------------------------------------------------

    @property
    def kind(self) -> str:
        return str(self.record.get("kind", "script"))

    def holds_run(self) -> bool:
        """Whether the folder holds a run already."""
        return any((self.directory / name).is_file() for name in (RECORD, STATUS, CONFIG))

    def claim(self, resuming: bool, *, auto: bool = False, take_over: bool = False) -> None:
        """Refuse, before anything of the run happens, a folder that another live process
        runs in (unless ``take_over``: its process is known dead elsewhere) and a run from
        step 0 (not ``resuming``) into a folder that holds a run."""
        status = read_json(self.directory / STATUS)
        pid = live_pid(status)
        if pid is not None and pid != os.getpid() and not take_over:
            raise RunExists(
                f"{self.directory} is the folder of a run that is running now (pid "
                f"{pid} on {status.get('host')}); two processes never share a run "
                f"folder: wait for it, stop it, or {self._elsewhere()}"
            )
        if resuming or not self.holds_run() or restarts():
            return  # (a group torchrun restarted goes on with its run, or starts it over)
        if auto:
            raise RunExists(
                f"{self.directory} holds a run, but none of its checkpoints to continue it "
                f'from (resume="auto" looks in the attached Checkpoint packs\' folders: give '
                f'the run a Checkpoint pack, such as Checkpoint("checkpoint") inside '
                f"run_dir), or {self._elsewhere()}"
            )
        held = read_json(self.directory / RECORD).get("id") or status.get("run")
        now = read_status(self.directory).get("status", "unknown")
        if self.kind in COMMAND_KINDS:
            raise RunExists(
                f"{self.directory} holds a run of this "
                f"{COMMAND_KINDS[self.kind]} already (status: "
                f"{now}); continue it with `runmodel resume {self.directory}` (or "
                f"--resume), or start again with --restart (the old run is kept "
                f"beside it)"
            )
        raise RunExists(
            f"{self.directory} holds a run already (run {held or '?'}, status "
            f"{now}); this run starts from step 0. Continue that run with "
            f'resume="auto" (or `runmodel resume {self.directory}`), or give '
            f"this run another run_dir"
        )

    def _elsewhere(self) -> str:
        return (
            "wait for it to end" if self.kind in COMMAND_KINDS else "give this run another run_dir"
        )

    def move_aside(self) -> Path:
        """Rename the folder to ``NAME.old-TIME`` (``-2``, ``-3``... if taken), so that a
        run can start afresh in it; nothing is deleted."""
        base = f"{self.directory.name}.old-{time.strftime('%Y%m%d-%H%M%S')}"
        target, n = self.directory.with_name(base), 2
        while target.exists():
            target, n = self.directory.with_name(f"{base}-{n}"), n + 1
        self.directory.rename(target)
        return target

    # -- the run ----------------------------------------------------------------------------

    def hooks(self) -> Iterator[Hook]:
        # first: the folder is claimed before other packs write
        yield Hook(self.setup, "setup", HookOptions.of(priority=2000, rank=0, modes="train"))
        # every process (gathering the weights of a sharded model is collective), before
        # the backend's own teardown puts its data back, and before FinalEvaluation
        # tests with them
        yield Hook(
            self.save_model,
            "teardown",
            HookOptions.of(priority=1000, modes="train", name="run_folder.model"),
        )

    def check_setup(self, engine: Any) -> None:
        """Rank 0, which writes the folder, claims it (the other processes of a
        distributed run follow it: they would see its claim as another live run's)."""
        self.began = False
        if engine.state.rank != 0:  # rank 0 alone claims the folder (and writes it)
            return
        if not self.claimed:
            self.claim(engine.resumed_from is not None)
        held = read_json(self.directory / RECORD).get("id")
        if held and engine.resumed_from is not None and held != engine.run_record.get("id"):
            raise RunExists(
                f"{self.directory} holds run {held}, and this run continues run "
                f"{engine.run_record.get('id')} (from {engine.resumed_from}); a "
                f"folder holds one run: give it another folder"
            )

    def setup(self, engine: Any) -> None:
        """Claim the folder: the record (a continuation adds to it) and ``running``."""
        s, run = engine.state, engine.run_record
        self.directory.mkdir(parents=True, exist_ok=True)
        for name, data in self.files.items():
            write_json(self.directory / name, data)
        record = read_json(self.directory / RECORD) if engine.resumed_from else {}
        previous = read_json(self.directory / STATUS) if engine.resumed_from else {}
        if record:  # a continuation: the run's record, with the length it has now
            record.setdefault("continued", []).append(
                {
                    "at": time.time(),
                    "from": self._inside(engine.resumed_from),
                    "epochs": s.max_epochs,
                    "steps": s.max_steps,
                    "argv": self.record.get("argv"),
                }
            )
        else:
            record = {
                **self.record,
                "id": run.get("id"),
                "started": run.get("started"),
                "versions": versions(),
            }
        extensions = list(previous.get("extensions", record.get("extensions", [])))
        if engine.extension:
            extensions.append(engine.extension)
            self.log.write(f"extended: {engine.extension}")
        record.update(epochs=s.max_epochs, steps=s.max_steps, extensions=extensions)
        write_json(self.directory / RECORD, record)
        self._reserve()
        self._status = {
            "status": "running",
            "run": run.get("id"),
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.time(),
            "run_started": run.get("started"),
            "epochs": s.max_epochs,
            "steps": s.max_steps,
            **({"iterations": s.max_iterations} if s.max_iterations is not None else {}),
            "extensions": extensions,
            "resumed_from": self._inside(engine.resumed_from),
            **restarts(),
            **self.extra,
        }
        self._write_status(self._status)
        self.began = True

    def save_model(self, engine: Any) -> None:
        """A run that trained to its end (its budget, its epochs, or ``stop()``): the
        trained weights as ``model.pt``: the interface's save where every process holds
        the whole model; under ``fsdp`` the weights the run's storage gathers (every
        process calls it), written by rank 0."""
        model = engine.model
        interface = getattr(model, "interface", None)
        storage = cast("Storage", engine.storage)
        if engine.state.error is not None or interface is None:
            return
        if storage.group is None:  # the whole model is here
            if engine.state.rank == 0:
                with contextlib.suppress(NotImplementedError, ValueError):
                    interface.save(model, self.directory)
            return
        if not storage.ended_together:
            return  # a collective needs every process: they did not agree at the end
        state = storage.full_model_state(model)
        if state is not None and engine.state.rank == 0:
            import torch

            from .._io import atomic_write

            with atomic_write(self.directory / MODEL) as file:
                torch.save(state, file)
            engine.state.files["model"] = str(self.directory / MODEL)

    def finish(
        self, engine: Any, result: RunResult | None, error: BaseException | None = None
    ) -> None:  # one of the two
        """After the run (rank 0): its status, and for a run that ended without an error
        its final metrics."""
        if not self.began:
            if error is not None and not refused_at_setup(error) and engine.state.rank == 0:
                self._failed_before_setup(error)
            elif self.claimed:  # refused at setup: the folder as it was before the claim
                with contextlib.suppress(OSError):
                    self.directory.rmdir()  # only where the claim made it (empty)
            return
        self.began = False
        status = {**self._status, "ended": time.time()}
        if result is not None:
            status.update(status="finished", files=_relative(self.directory, result.files))
            write_json(
                self.directory / METRICS,
                {
                    "metrics": result.metrics,
                    "ended": result.ended,
                    "steps": result.steps,
                    **({"iterations": result.iterations} if result.iterations is not None else {}),
                    "epochs": result.epochs,
                    "seconds": result.seconds,
                    "timings": result.timings,
                    "files": _relative(self.directory, result.files),
                    "reason": result.reason,
                },
            )
        elif isinstance(error, Interrupted):
            status.update(
                status="preempted" if isinstance(error, Preempted) else "interrupted",
                error=str(error),
                step=engine.state.step,
                files=_relative(self.directory, engine.state.files),
            )
            if isinstance(error, Preempted):
                status["signal"] = signal_name(error.signal)
        elif error is not None:
            status.update(
                status="interrupted" if isinstance(error, KeyboardInterrupt) else "failed",
                error=f"{type(error).__name__}: {error}",
                traceback=_traceback(error),
            )
        self._write_status(status, error)

    def _failed_before_setup(self, error: BaseException) -> None:
        """The run failed before its setup hooks ran (in ``model.setup()``, say): the
        folder records that it failed, and why."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for name, data in self.files.items():
            if not (self.directory / name).is_file():
                write_json(self.directory / name, data)
        now = time.time()
        self._write_status(
            {
                **read_json(self.directory / STATUS),
                "status": "failed",
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started": now,
                "ended": now,
                **self.extra,
                "error": f"{type(error).__name__}: {error}",
                "traceback": _traceback(error),
            },
            error,
        )

    # -- writing ----------------------------------------------------------------------------

    def _inside(self, path: Path | None) -> str:
        return _relative(self.directory, {"p": str(path)})["p"] if path else ""

    def _reserve(self) -> None:
        """Keep ``RESERVE_BYTES`` on the disk for the status writes to come."""
        path = self.directory / RESERVE
        with contextlib.suppress(OSError):
            if not path.is_file() or path.stat().st_size < RESERVE_BYTES:
                path.write_bytes(b"\0" * RESERVE_BYTES)

    def _write_status(self, status: dict[str, Any], error: BaseException | None = None) -> None:
        """``status.json``, atomically; on a full disk, once more after freeing the
        reserve. If even that fails, the run's own error says so in a note (raised only
        when there is no error of the run's to raise)."""
        for attempt in (1, 2):
            try:
                write_json(self.directory / STATUS, status)
                return
            except DiskFullError as full:
                if attempt == 1 and (self.directory / RESERVE).is_file():
                    (self.directory / RESERVE).unlink()
                    continue
                if error is None:
                    raise
                error.add_note(
                    f"runmodel: could not record the run's status in "
                    f"{self.directory / STATUS}: {full}"
                )
                return


def record_status(
    directory: Path, status: dict[str, Any], error: BaseException | None = None
) -> None:
    """Write ``status`` for the run in ``directory`` outside its run (a launcher's word on
    a failed process): as the run's own writer does, reserve and all."""
    RunFolder(directory)._write_status(status, error)


def record_evaluation(directory: Path, key: str, entry: dict[str, Any]) -> None:
    """Add ``entry`` (a ``runmodel eval`` of the run's weights) under ``key`` to the run's
    ``eval.json``."""
    evaluated = read_json(Path(directory) / EVAL)
    evaluated[key] = entry
    write_json(Path(directory) / EVAL, evaluated)


def mark(directory: Path, state: str) -> None:
    """Record ``state`` as the status of the run in ``directory`` once it ended (a sweep's
    ``pruned``), as the run's own writer does, reserve and all."""
    path = Path(directory) / STATUS
    status = read_json(path)
    if status:
        record_status(directory, {**status, "status": state}, None)


def _traceback(error: BaseException) -> str:
    text = "".join(traceback.format_exception(error))
    return text if len(text) <= TRACEBACK_CHARS else "..." + text[-TRACEBACK_CHARS:]

"""A run's folder while it runs: the files that ``engine.run(..., run_dir=PATH)`` writes
for a run started from a script, as a config run has them (``docs/runs.md``).

    run.json       how the run was started: its id and start time, the script and its
                   arguments, the working folder, the packs, epochs/steps (as extended),
                   library versions
    status.json    running / finished / failed / interrupted, times, pid, host, the best
                   and last checkpoints
    metrics.json   the final result: metrics, steps, epochs, how it ended
    run.log        one line at the start, at each epoch's end and at the end
    model.pt       the trained weights (the interface's save)
    tensorboard/   event files (unless a TensorBoard pack of its own is attached)

The pack reads and writes these files; ``runmodel.runs`` (above the engine) lists,
evaluates and continues runs from them.
"""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from .._io import read_json, write_json
from ..core import Pack, RunResult, hook

__all__ = ["RunFolder", "is_run", "is_script_run", "live_pid", "read_status", "start_record"]

STATUS, RECORD, METRICS = "status.json", "run.json", "metrics.json"


def live_pid(status: dict[str, Any]) -> int | None:
    """The pid of the live process of this host that a ``running`` status names, if any."""
    pid = status.get("pid")
    if status.get("status") != "running" or status.get("host") != socket.gethostname() or (
            not isinstance(pid, int) or pid <= 0):  # pid 0 would ask about our process group
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
    return (directory / "config.json").is_file() or (directory / "run.json").is_file()


def is_script_run(directory: Path) -> bool:
    return not (directory / "config.json").is_file() and (directory / "run.json").is_file()


def read_status(directory: Path) -> dict[str, Any]:
    """The run's status; a run marked running whose process is gone was interrupted."""
    status = read_json(Path(directory) / STATUS)
    if (status.get("status") == "running" and status.get("host") == socket.gethostname()
            and live_pid(status) is None):
        status["status"] = "interrupted"
    return status


def versions() -> dict[str, str]:
    """The versions of Python, torch and runmodel running now."""
    import torch

    try:  # as runmodel.__version__ (the package's __init__ is above the packs)
        runmodel = version("runmodel")
    except PackageNotFoundError:
        runmodel = "0+unknown"
    return {"python": platform.python_version(), "torch": torch.__version__,
            "runmodel": runmodel}


class RunFolder(Pack):
    """The folder of one run (a train run; see the module's docstring). ``record`` is
    how it was started (``script``, ``argv``, ``cwd``, ``packs``...); the engine adds the
    run's id and start time. At setup it refuses a folder that another live process uses
    (naming its pid) and a run started from step 0 into a folder holding a run; then it
    claims the folder. ``finish`` writes the result once the run is over."""

    name = "run_folder"

    def __init__(self, directory: str | os.PathLike[str], record: dict[str, Any] | None = None
                 ) -> None:
        self.directory = Path(directory)
        self.record = dict(record or {})
        from ..packs.run_log import RunLog  # here: reading a run folder imports no torch

        self.log = RunLog(self.directory / "run.log")
        self.began = False  # whether this run claimed the folder (its setup hook ran)
        self._status: dict[str, Any] = {}

    def holds_run(self) -> bool:
        """Whether the folder holds a run already."""
        return (self.directory / RECORD).is_file() or (self.directory / STATUS).is_file()

    def check_start(self, resuming: bool, auto: bool = False) -> None:
        """Refuse a folder that another live process uses, and a run from step 0 into a
        folder that holds a run: before anything else of the run happens."""
        status = read_json(self.directory / STATUS)
        pid = live_pid(status)
        if pid is not None and pid != os.getpid():
            raise FileExistsError(f"{self.directory} is the folder of a run that is running "
                                  f"now (pid {pid} on {status.get('host')}); two processes "
                                  f"never share a run folder: wait for it, stop it, or give "
                                  f"this run another run_dir")
        if self.holds_run() and not resuming and auto:
            raise FileNotFoundError(
                f"{self.directory} holds a run, but none of its checkpoints to continue it "
                f"from (resume=\"auto\" looks in the attached Checkpoint packs' folders: give "
                f"the run a Checkpoint pack, such as Checkpoint(\"checkpoint\") inside "
                f"run_dir), or give this run another run_dir")
        if self.holds_run() and not resuming:
            held = read_json(self.directory / RECORD).get("id") or status.get("run")
            raise FileExistsError(
                f"{self.directory} holds a run already (run {held or '?'}, status "
                f"{read_status(self.directory).get('status', 'unknown')}); this run starts "
                f"from step 0. Continue that run with resume=\"auto\" (or `runmodel resume "
                f"{self.directory}`), or give this run another run_dir")

    def check_setup(self, engine: Any) -> None:
        self.began = False
        self.check_start(engine.resumed_from is not None)
        held = read_json(self.directory / RECORD).get("id")
        if held and engine.resumed_from is not None and held != engine.run_record.get("id"):
            raise FileExistsError(f"{self.directory} holds run {held}, and this run continues "
                                  f"run {engine.run_record.get('id')} (from "
                                  f"{engine.resumed_from}); give it another run_dir")

    @hook(priority=2000, rank=0)  # first: the folder is claimed before other packs write
    def setup(self, engine: Any) -> None:
        s, run = engine.state, engine.run_record
        self.directory.mkdir(parents=True, exist_ok=True)
        record = read_json(self.directory / RECORD) if engine.resumed_from else {}
        if record:  # a continuation: the run's record, with the length it has now
            record.setdefault("continued", []).append(
                {"at": time.time(), "from": str(engine.resumed_from), "epochs": s.max_epochs,
                 "steps": s.max_steps, "argv": self.record.get("argv")})
        else:
            record = {**self.record, "id": run.get("id"), "started": run.get("started"),
                      "versions": versions()}
        record.update(epochs=s.max_epochs, steps=s.max_steps)
        if engine.extension:
            record.setdefault("extensions", []).append(engine.extension)
        write_json(self.directory / RECORD, record)
        self._status = {"status": "running", "run": run.get("id"), "pid": os.getpid(),
                        "host": socket.gethostname(), "started": time.time(),
                        "run_started": run.get("started"),
                        "resumed_from": str(engine.resumed_from or "")}
        write_json(self.directory / STATUS, self._status)
        self.began = True

    def finish(self, engine: Any, result: RunResult | None,
               error: BaseException | None = None) -> None:
        """After the run: its status, and for a run that ended without an error its final
        metrics and the trained weights."""
        if not self.began:
            return
        self.began = False
        status = {**self._status, "ended": time.time()}
        if result is None:
            interrupted = isinstance(error, KeyboardInterrupt)
            status.update(status="interrupted" if interrupted else "failed",
                          error=f"{type(error).__name__}: {error}")
        else:
            interrupted = bool(result.reason and result.reason.startswith("interrupted"))
            status.update(status="interrupted" if interrupted else "finished",
                          files=dict(result.files))
            if interrupted:
                status["error"] = result.reason
            write_json(self.directory / METRICS, {
                "metrics": result.metrics, "ended": result.ended, "steps": result.steps,
                "epochs": result.epochs, "seconds": result.seconds, "timings": result.timings,
                "files": result.files, "reason": result.reason})
            self._save_model(engine.model)
        write_json(self.directory / STATUS, status)

    def _save_model(self, model: Any) -> None:
        interface = getattr(model, "interface", None)
        if interface is not None:
            with contextlib.suppress(NotImplementedError, ValueError):
                interface.save(model, self.directory)


def start_record(packs: dict[str, Pack], mode: str) -> dict[str, Any]:
    """How a run is being started from Python: the script and its arguments, the working
    folder, the packs attached (key and class), the mode."""
    main = sys.modules.get("__main__")
    script = getattr(main, "__file__", None)
    return {"kind": "script", "script": None if script is None else str(Path(script).resolve()),
            "argv": list(sys.argv[1:]), "cwd": os.getcwd(), "mode": mode,
            "packs": {key: type(pack).__name__ for key, pack in packs.items()}}

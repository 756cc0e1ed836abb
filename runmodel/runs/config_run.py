"""Config runs: every config run lands in a folder derived from its config.

    runs/digits-hidden128_adam-lr0.005_3f9a2c1b40/
        config.json      the canonical config (its hash is in the folder's name)
        status.json      running / finished / failed / interrupted, times, pid, error
        metrics.json     the final result: metrics, steps, epochs, how it ended
        run.log          one line per epoch and at the start and end
        model.pt         the trained weights (the interface's save)
        checkpoint/      checkpoints (every epoch, the newest 2, unless the config's
                         checkpoint pack says otherwise)
        tensorboard/     event files

The same config always resolves to the same folder; running it again there resumes or
restarts only when asked, and never overwrites a run silently.

Under torchrun (``runmodel run CONFIG --nproc-per-node N``: ``torchrun.py``) every process
builds the run and rank 0 alone claims the folder and writes its files; under ``fsdp`` the
final weights are the export of the last (sharded) checkpoint, as ``model.pt``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .._io import read_json, remove_stale, write_json
from ..backends.distributed import env
from ..checkpoint import sharded as checkpoint_sharded
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
from ..core.state import refused_at_setup
from ..engine import Engine
from ..models import configure_engine, load_source
from ..packs import RunLog, TensorBoard
from . import torchrun
from .folder import read_status
from .table import flatten

__all__ = ["PreparedRun", "RunExists", "execute", "prepare", "record_launch_failure",
           "resume_dir", "run_dir_for"]


#: Packs every config run has (with their defaults) unless its config lists them itself.
DEFAULT_PACKS = ("checkpoint", "tensorboard", "progress")


class RunExists(FileExistsError):
    """The config's run directory holds a run already; resume or restart it explicitly."""


def run_dir_for(config: RunConfig, root: str | os.PathLike[str] = "runs") -> Path:
    return Path(root) / config.run_name()


def _record_failure(path: Path, status: dict[str, Any], error: BaseException) -> None:
    """Write the status of a failed run, also on a full disk: then in place (truncating
    the file frees its blocks first), and if that fails too, the run's own error says so
    in a note rather than being replaced by this one."""
    try:
        write_json(path, status)
    except OSError:
        try:
            path.write_text(json.dumps(status, indent=2, sort_keys=True, default=str) + "\n")
        except OSError as failed:
            error.add_note(f"runmodel: could not record the failure in {path}: {failed}")


def _seed(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:
        pass


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
    directory: Path
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

    def run(self) -> RunResult:
        """Run it, recording status, metrics and the trained model in its directory.

        The first Ctrl-C stops the run once the current step is done: the Checkpoint pack
        saves where it stopped, the run is marked ``interrupted`` and ``runmodel resume``
        continues it exactly. A second Ctrl-C interrupts at once.
        """
        config, run_dir, lead = self.config, self.directory, self.lead
        if lead:
            run_dir.mkdir(parents=True, exist_ok=True)
            remove_stale(run_dir)  # status files of a run killed mid-write
            write_json(run_dir / "config.json", config.to_dict())
        epochs = config.epochs if self.epochs is None else self.epochs
        steps = config.steps if self.steps is None else self.steps
        before = read_status(run_dir)  # the length the run has: changed once checks pass
        status = {"status": "running", "started": time.time(), "pid": os.getpid(),
                  "host": socket.gethostname(), "digest": config.digest(),
                  "base": str(self.base.resolve()), "resumed_from": str(self.checkpoint or ""),
                  "epochs": before.get("epochs", config.epochs),
                  "steps": before.get("steps", config.steps),
                  "extensions": before.get("extensions", [])}
        if env.launched():  # what `runmodel resume` relaunches with (1 process too)
            status.update(env.launch_world(), backend=config.backend and config.backend.type_)
        if not lead:
            return self._follow(epochs, steps)
        write_json(run_dir / "status.json", status)
        _tell_launcher(run_dir)
        engine = self.engine

        @engine.on("setup", priority=1500, name="config_run.record")
        def record(engine: Any) -> None:  # the run's id, and an extension, in its folder
            status.update(run=engine.run_record.get("id"), epochs=epochs, steps=steps,
                          run_started=engine.run_record.get("started"))
            if engine.extension:
                status.setdefault("extensions", []).append(engine.extension)
                with open(run_dir / "run.log", "a") as log:
                    log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} extended: "
                              f"{engine.extension}\n")
            write_json(run_dir / "status.json", status)

        try:
            with _ctrl_c_stops(self.engine):
                result = self.engine.run(self.model, mode=config.mode, steps=steps,
                                         epochs=epochs, backend=self.backend,
                                         resume=self.checkpoint)
            env.end_distributed()  # rank 0's work after the run (eval metrics, export) is its own
            if result.reason == INTERRUPTED:
                status.update(status="interrupted", ended=time.time(), error=INTERRUPTED)
                write_json(run_dir / "status.json", status)
                return result
            if config.mode == "train":
                self._after_training(result)
            write_json(run_dir / "metrics.json", {  # a full disk here fails the run too
                "metrics": result.metrics, "ended": result.ended, "steps": result.steps,
                "epochs": result.epochs, "seconds": result.seconds, "timings": result.timings,
                "files": result.files})
        except BaseException as error:
            text = f"{type(error).__name__}: {error}"
            if before and refused_at_setup(error):  # a continuation refused: nothing ran,
                # the run is as it was (finished, interrupted...), and the refusal noted
                _record_failure(run_dir / "status.json", {**before, "refused": text}, error)
                raise
            status.update(status="interrupted" if isinstance(error, KeyboardInterrupt)
                          else "failed", ended=time.time(), error=text)
            _record_failure(run_dir / "status.json", status, error)
            raise
        finally:
            record.detach()
        status.update(status="finished", ended=time.time(), files=result.files)
        write_json(run_dir / "status.json", status)
        return result

    def _follow(self, epochs: int | None, steps: int | None) -> RunResult:
        """A process other than rank 0 under torchrun: the run alone, no file written
        (but its checkpoint shards)."""
        with _ctrl_c_stops(self.engine):
            return self.engine.run(self.model, mode=self.config.mode, steps=steps,
                                   epochs=epochs, backend=self.backend, resume=self.checkpoint)

    def _after_training(self, result: RunResult) -> None:
        """Save the trained model and, if it has eval data, record its eval metrics."""
        model, interface = self.model, getattr(self.model, "interface", None)
        if interface is None:
            return
        if self.config.backend is not None and self.config.backend.type_ == "fsdp":
            self._export_final(result)
            return
        with contextlib.suppress(NotImplementedError):
            interface.save(model, self.directory)
        eval_data = getattr(model, "eval_data", None)
        if eval_data is not None:
            with contextlib.suppress(NotImplementedError):
                evaluated = interface.evaluate(model, eval_data)
                result.metrics.update({f"eval_{k}": v for k, v in evaluated.items()})


    def _export_final(self, result: RunResult) -> None:
        """Under fsdp the module stays sharded, and its process group is gone: the final
        weights are the export of the run's last checkpoint (it saves where it ends), and
        its eval metrics those of a fresh model with them."""
        from .evaluate import evaluate_model

        last = result.files.get("last_checkpoint")
        used, out = checkpoint_sharded.export(last or self.directory,
                                              self.directory / "model.pt")
        result.files.update(model=str(out), model_from=str(used))
        if used.name != checkpoint_sharded.folder_name(Path(last or used).name):
            result.files["model_note"] = f"{last} was not readable; model.pt is {used}"
        if getattr(self.model, "eval_data", None) is None:
            return
        _, fresh, _ = build(self.config, self.base, backend=False)
        with contextlib.suppress(NotImplementedError):
            evaluated = evaluate_model(fresh, out, "eval", engine=Engine(progress=False))
            result.metrics.update({f"eval_{k}": v for k, v in evaluated.metrics.items()})


#: Where the launcher (``runmodel run --nproc-per-node``) learns the run folder, to name
#: a killed process in its status.
LAUNCH_RECORD = "RUNMODEL_LAUNCH_RECORD"


def _tell_launcher(run_dir: Path) -> None:
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
    status.update(status="failed", error=text, failed_rank=rank,
                  ended=status.get("ended") or time.time())
    if seen and seen != text:
        status["rank_0_error"] = seen
    _record_failure(run_dir / "status.json", status, RuntimeError(text))


INTERRUPTED = "interrupted: Ctrl-C"


@contextlib.contextmanager
def _ctrl_c_stops(engine: Engine) -> Iterator[None]:
    """While a config run runs in the main thread: the first SIGINT stops the run after
    its current step, the second raises KeyboardInterrupt as usual."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGINT, previous)  # the next Ctrl-C interrupts at once
        print("runmodel: stopping after this step, then saving (Ctrl-C again to stop now)",
              file=sys.stderr, flush=True)
        engine.stop(INTERRUPTED)

    previous = signal.signal(signal.SIGINT, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def build(config: RunConfig, base: str | os.PathLike[str] = ".", *, backend: bool = True
          ) -> tuple[RunConfig, Any, Any]:
    """The config as a run records it, and the model and the backend it names, seeded
    (``base``: where relative ``imports`` are found). ``backend=False``: the model alone
    (None for the backend), to evaluate a run's weights in this one process, whatever
    backend (ddp, fsdp) trained it."""
    _seed(config.seed)
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
    base = Path(read_status(directory).get("base", "."))
    return RunConfig.from_dict(data, source=str(directory / "config.json")), base


def prepare(config: RunConfig, root: str | os.PathLike[str] = "runs", *,
            directory: str | os.PathLike[str] | None = None, resume: bool = False,
            restart: bool = False, base: str | os.PathLike[str] = ".",
            engine: Engine | None = None, progress: bool = True,
            packs: Sequence[Pack] = (), backend: str | None = None) -> PreparedRun:
    """Check and build everything ``config`` names, then claim its run directory
    (``directory``, or derived under ``root``; a new run creates it, so two runs of one
    config cannot both start there); nothing is written before that works.

    If the directory holds a run already, ``resume=True`` continues it from its newest
    checkpoint and ``restart=True`` moves it aside (``NAME.old-TIME``) and starts anew;
    otherwise ``RunExists`` says so. ``base`` is where relative ``imports`` are found.
    ``progress=False`` leaves out the default progress display; ``packs`` are attached
    too (``runmodel run --timer`` gives a Timer).

    Under torchrun the run takes the config's ``ddp`` or ``fsdp`` backend, else
    ``backend`` (``--backend``; default ``ddp``); rank 0 alone claims the directory and
    tells the others (``torchrun.py``).
    """
    if env.several():
        config = torchrun.with_backend(config, backend)
    config, model, made_backend = build(config, base)
    run_dir = Path(directory) if directory is not None else run_dir_for(config, root)
    named = {spec.type_ for spec in config.packs}
    # every run directory holds checkpoints and TensorBoard events, and a run shows its
    # progress; a config that lists these packs sets their options
    defaults = [Spec(name) for name in DEFAULT_PACKS
                if name not in named and (progress or name != "progress")]
    made = [RunLog(run_dir / "run.log"), *packs]
    made += [make_pack(spec, directory=run_dir / spec.type_)
             for spec in (*config.packs, *defaults)]
    decision = torchrun.decided(lambda: {"directory": str(run_dir), "checkpoint": _as_text(
        _claim(run_dir, resume=resume, restart=restart))})
    if Path(decision["directory"]).resolve() != run_dir.resolve():
        raise ValueError(f"process rank 0 runs in {decision['directory']}, this process "
                         f"(rank {env.rank()}) would in {run_dir}: start every process "
                         f"with the same config, in the same working folder")
    checkpoint = None if decision["checkpoint"] is None else Path(decision["checkpoint"])
    engine = engine or Engine(progress=False)  # progress= above decides
    for pack in made:  # the config's values, on TensorBoard's HParams dashboard
        if isinstance(pack, TensorBoard):
            pack.hparams = flatten(config.to_dict())
    engine.attach(*made)
    configure_engine(registries["model"].get(config.model.type_), engine)
    return PreparedRun(config, run_dir, model, made_backend, engine, checkpoint, Path(base),
                       lead=env.rank() == 0)


def _as_text(path: Path | None) -> str | None:
    return None if path is None else str(path)


def _claim(run_dir: Path, *, resume: bool, restart: bool) -> Path | None:
    """Claim ``run_dir`` for a new run, or find the checkpoint to continue its run from
    (``resume``), or move its run aside (``restart``): see ``prepare``."""
    checkpoint = None
    if (run_dir / "config.json").exists():
        status = read_status(run_dir)
        if status.get("status") == "running" and (resume or restart):
            raise RunExists(f"{run_dir} is running now (pid {status.get('pid')} on "
                            f"{status.get('host')}); wait for it, or stop it first")
        if restart:
            _move_aside(run_dir)
        elif resume:
            found = checkpoint_sharded.all_checkpoints_in(run_dir)
            if not found:
                raise FileNotFoundError(
                    f"{run_dir} has no checkpoint to resume from: the run (status "
                    f"{status.get('status', 'unknown')}) ended before it wrote its first one; "
                    f"start it again with --restart (the old run is kept beside it)")
            checkpoint = found[0].parent
        else:
            raise RunExists(f"{run_dir} holds a run of this config already (status: "
                            f"{status.get('status', 'unknown')}); "
                            f"continue it with `runmodel resume {run_dir}` (or --resume), or "
                            f"start again with --restart (the old run is kept beside it)")
    elif resume:
        raise FileNotFoundError(f"no run to resume at {run_dir}")
    if checkpoint is None:  # a new run: claim the directory, or find it taken
        try:
            run_dir.mkdir(parents=True)
        except FileExistsError:
            raise RunExists(f"{run_dir} exists but holds no run: another run of this config "
                            f"may be starting; if not, remove the empty directory") from None
    return checkpoint


def _move_aside(run_dir: Path) -> Path:
    """Rename a run directory to ``NAME.old-TIME`` (``-2``, ``-3``... if taken)."""
    base = f"{run_dir.name}.old-{time.strftime('%Y%m%d-%H%M%S')}"
    target, n = run_dir.with_name(base), 2
    while target.exists():
        target, n = run_dir.with_name(f"{base}-{n}"), n + 1
    run_dir.rename(target)
    return target


def execute(config: RunConfig, root: str | os.PathLike[str] = "runs", **options: Any
            ) -> tuple[RunResult, Path]:
    """``prepare(config, root, **options).run()``; returns the result and the directory."""
    prepared = prepare(config, root, **options)
    return prepared.run(), prepared.directory


def resume_dir(directory: str | os.PathLike[str], engine: Engine | None = None, *,
               epochs: int | None = None, steps: int | None = None,
               **options: Any) -> PreparedRun:
    """Prepare the run in ``directory`` to continue from its newest checkpoint; with
    ``epochs``/``steps``, to that length (more than it has: an extension, recorded in
    its status and run log; its config and folder stay those it was started with)."""
    directory = Path(directory)
    config, base = load_run_config(directory)
    prepared = prepare(config, directory=directory, resume=True, base=base, engine=engine,
                       **options)
    prepared.epochs, prepared.steps = epochs, steps
    if epochs is None and steps is None:  # the length it has now (after an extension)
        status = read_status(directory)
        prepared.epochs = status.get("epochs", config.epochs)
        prepared.steps = status.get("steps", config.steps)
    return prepared



"""Model-source runs: ``runmodel run model.py`` (a train run) lands in a run folder derived
from its source, as a config run's is derived from its config (``config_run.py``), and is
an engine run in that folder (``engine.run(..., run_dir=RunFolder)``):

    runs/digits-Digits-hidden256_3f9a2c1b40/
        run.json       kind "source": the source (its file resolved), the model class, the
                       init and setup options given, the device, the seed, the backend
                       (under torchrun), and what every run folder records
        status.json, metrics.json, run.log, model.pt
        checkpoint/    every epoch, the newest 2 (the packs every config run has)
        tensorboard/   event files

The folder's name is the source's file (or module) and class, its first options, and a
short hash of what makes the run (``IDENTITY``): the same command always resolves to the
same folder, and running it again there continues or restarts only when asked
(``--resume``, ``--restart``), never silently. ``runmodel resume RUN_DIR`` continues it,
and ``runmodel runs``, ``plot``, ``eval``, ``infer`` and ``export`` treat it as they treat
a config run. Under torchrun every process builds the run and rank 0 alone claims the
folder (``torchrun.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..backends.distributed import env
from ..config.registry import Spec, make_pack
from ..config.runconfig import sanitize
from ..core import Pack, RunResult
from ..engine import Engine
from .config_run import DEFAULT_PACKS, claim_folder, tell_launcher
from .folder import RunFolder

__all__ = [
    "IDENTITY",
    "SourceRun",
    "default_packs",
    "prepare",
    "resolved_source",
    "run_dir_for",
    "source_record",
]

#: What makes a model source's run, hashed into its folder's name (as a config's canonical
#: form is): a run of the same source with other options, seed or length is another run.
IDENTITY = (
    "source",
    "model",
    "init_options",
    "setup_options",
    "device",
    "seed",
    "backend",
    "epochs",
    "steps",
)


def resolved_source(source: str) -> str:
    """``source`` with its file made absolute (``path/file.py[:Class]``); a module's
    name (``package.module:Class``) as it is."""
    location, sep, name = source.partition(":")
    if location.endswith(".py") or "/" in location or "\\" in location:
        location = str(Path(location).resolve())
    return location + sep + name


def source_record(
    source: str,
    model: type,
    *,
    init: dict[str, Any],
    setup: dict[str, Any],
    device: str | None,
    seed: int,
    backend: str | None,
    epochs: int | None,
    steps: int | None,
) -> dict[str, Any]:
    """How a model source's run is started, as its ``run.json`` records it: what a
    ``runmodel resume`` needs to make the same model again."""
    return {
        "kind": "source",
        "source": resolved_source(source),
        "model": model.__qualname__,
        "init_options": dict(init),
        "setup_options": dict(setup),
        "device": device,
        "seed": seed,
        "backend": backend,
        "epochs": epochs,
        "steps": steps,
        "cwd": os.getcwd(),
    }


def _digest(record: dict[str, Any]) -> str:
    canonical = json.dumps(
        {key: record.get(key) for key in IDENTITY},
        sort_keys=True,
        separators=(",", ":"),
        default=repr,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()[:10]


def run_dir_for(record: dict[str, Any], root: str | os.PathLike[str] = "runs") -> Path:
    """The folder of the run ``record`` describes, under ``root``: readable (the file or
    module, the class unless it is the file's name, the first two options) and unique
    (the hash of its ``IDENTITY``)."""
    location = str(record["source"]).partition(":")[0]
    stem = Path(location).stem if location.endswith(".py") else location.rpartition(".")[2]
    parts = [stem] if record["model"].lower() == stem.lower() else [stem, record["model"]]
    options = {**record.get("init_options", {}), **record.get("setup_options", {})}
    parts += [
        f"{key}{value}"
        for key, value in sorted(options.items())[:2]
        if isinstance(value, (int, float, str, bool))
    ]
    name = "-".join(sanitize(part) for part in parts)[:100]
    return Path(root) / f"{name}_{_digest(record)}"


def default_packs(run_dir: Path, progress: bool = True) -> list[Pack]:
    """The packs every config run has by default (``config_run.DEFAULT_PACKS``: a
    checkpoint every epoch, the newest 2; TensorBoard events; progress, unless
    ``progress`` is False), in ``run_dir``."""
    return [
        make_pack(Spec(name), directory=run_dir / name)
        for name in DEFAULT_PACKS
        if progress or name != "progress"
    ]


@dataclass
class SourceRun:
    """A model source's run, its folder claimed: ``run()`` starts (or continues) it."""

    folder: RunFolder
    engine: Engine
    model: Any
    #: the checkpoint to continue from (None: from step 0)
    checkpoint: Path | None
    setup_options: dict[str, Any] | None
    backend: str | None
    epochs: int | None
    steps: int | None

    @property
    def directory(self) -> Path:
        return self.folder.directory

    def run(self, preempt_signals: Iterable[int | str] = ()) -> RunResult:
        """An engine run in its folder (``RunFolder``), stopped by Ctrl-C and
        ``preempt_signals`` as every run is (``runs/interrupt.py``)."""
        if env.rank() == 0:
            tell_launcher(self.directory)
        return self.engine.run(
            self.model,
            "train",
            steps=self.steps,
            epochs=self.epochs,
            setup_options=self.setup_options,
            backend=self.backend,
            resume=self.checkpoint,
            run_dir=self.folder,
            preempt_signals=preempt_signals,
        )


def prepare(
    engine: Engine,
    model: Any,
    record: dict[str, Any],
    run_dir: Path,
    *,
    setup_options: dict[str, Any] | None,
    epochs: int | None,
    steps: int | None,
    resume: bool = False,
    restart: bool = False,
) -> SourceRun:
    """Claim ``run_dir`` for the run ``record`` describes (rank 0 alone under torchrun,
    the others told): a new run creates it; where it holds a run, ``resume`` continues
    that from its newest checkpoint and ``restart`` moves it aside (``NAME.old-TIME``);
    otherwise ``RunExists`` says what to do. ``engine`` has the run's packs attached."""
    status = {}
    if env.launched():  # what `runmodel resume` relaunches with (1 process too)
        status = {**env.launch_world(), "backend": record.get("backend")}
    folder = RunFolder(run_dir, record, status=status, claimed=True)
    checkpoint = claim_folder(
        folder, resume=resume, restart=restart, take_over=False, same="source and options"
    )
    return SourceRun(
        folder, engine, model, checkpoint, setup_options, record.get("backend"), epochs, steps
    )

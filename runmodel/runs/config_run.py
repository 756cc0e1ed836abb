"""Config runs: a config's run lands in a folder derived from its config, prepared as
every run in a derived folder is (``folder_run.py``, which names the folder:
``config/runconfig.py``'s ``run_folder_name``); this module supplies what is a config's
own (``ConfigKind``): its record, its canonical form (the identity hashed into the name),
its readable name, its packs, and how its model and backend are built.

    runs/digits-hidden128_adam-lr0.005_3f9a2c1b40/
        config.json      the canonical config (its hash is in the folder's name)
        run.json         its kind, id, digest, the folder its imports are found from
        ...              the files of every run folder (``session/folder.py``)

The same config always resolves to the same folder; running it again there resumes or
restarts only when asked, and never overwrites a run silently.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from .._io import read_json
from ..config.registry import (
    check_setup_args,
    known_model_args,
    make_backend,
    make_interface,
    make_model,
    make_pack,
    optimizer_factory,
)
from ..config.runconfig import RunConfig
from ..core import Pack, RunResult
from ..models import load_source
from ..models.seeding import seed
from ..session.folder import CONFIG, RECORD, read_status
from . import torchrun
from .folder_run import Built, FolderRun, prepare_in_folder
from .table import flatten

__all__ = [
    "ConfigKind",
    "build",
    "build_config",
    "execute",
    "import_sources",
    "load_run_config",
    "prepare",
    "resume_dir",
]


def import_sources(config: RunConfig, base: Path) -> tuple[ModuleType, ...]:
    """Load the files and modules ``config.imports`` names (a relative ``.py`` from
    ``base``), which register what the config names; returns them, in that order: a
    config run calls the ``configure(engine)`` of each that defines one, and no other
    (not that of a file they import in turn, such as the model's own)."""
    modules = []
    for item in config.imports:
        path = base / item if item.endswith(".py") and not os.path.isabs(item) else item
        modules.append(load_source(str(path))[0])
    return tuple(modules)


@dataclass(frozen=True)
class ConfigKind:
    """A config's run (``folder_run.RunKind``). ``base`` is where its relative
    ``imports`` are found; ``length``, where given, the ``(epochs, steps, iterations)``
    to run to instead of the config's (``runmodel resume --epochs``, ``--iterations``)."""

    config: RunConfig
    base: Path = Path(".")
    length: tuple[int | None, int | None, int | None] | None = None

    @property
    def kind(self) -> str:
        return "config"

    @property
    def mode(self) -> str:
        return self.config.mode

    @property
    def epochs(self) -> int | None:
        return self.config.epochs if self.length is None else self.length[0]

    @property
    def steps(self) -> int | None:
        return self.config.steps if self.length is None else self.length[1]

    @property
    def iterations(self) -> int | None:
        """The length in iterations asked for, else the config's unless one in steps
        replaced it."""
        if self.length is not None and self.length[2] is not None:
            return self.length[2]
        return self.config.iterations if self.steps is None else None

    def under_torchrun(self, backend: str | None) -> ConfigKind:
        return dataclasses.replace(self, config=torchrun.with_backend(self.config, backend))

    def build(self) -> tuple[ConfigKind, Built]:
        config, model, backend, imported = build_config(self.config, self.base)
        built = Built(model, backend, dict(config.setup) or None, imported)
        return dataclasses.replace(self, config=config), built

    def record(self) -> dict[str, Any]:
        return {
            "kind": "config",
            "digest": self.config.digest(),
            "base": str(self.base.resolve()),
            "cwd": os.getcwd(),
        }

    def identity(self) -> Any:
        return self.config.identity()

    def readable_name(self) -> str:
        return self.config.readable_name()

    def params(self) -> dict[str, Any]:
        return flatten(self.config.to_dict())

    def files(self) -> dict[str, dict[str, Any]]:
        return {CONFIG: self.config.to_dict()}

    def backend_name(self) -> str | None:
        return None if self.config.backend is None else self.config.backend.type_

    def packs(self, run_dir: Path) -> list[Pack]:
        return [make_pack(spec, directory=run_dir / spec.type_) for spec in self.config.packs]


def build(
    config: RunConfig, base: str | os.PathLike[str] = ".", *, backend: bool = True
) -> tuple[RunConfig, Any, Any]:
    """The config as a run records it, and the model and the backend it names, seeded
    (``base``: where relative ``imports`` are found). ``backend=False``: the model alone
    (None for the backend), to evaluate a run's weights in this one process, whatever
    backend (ddp, fsdp) trained it."""
    return build_config(config, base, backend=backend)[:3]


def build_config(
    config: RunConfig, base: str | os.PathLike[str] = ".", *, backend: bool = True
) -> tuple[RunConfig, Any, Any, tuple[ModuleType, ...]]:
    """``build``, and the modules the config imports (``import_sources``): those whose
    ``configure(engine)`` its run calls."""
    seed(config.seed)  # runmodel.seed: before the model is built
    imported = import_sources(config, Path(base))
    # a model option the model does not declare is refused, as on the command line
    known_model_args(config.model)
    model = make_model(config.model, device=config.device)
    check_setup_args(model, config.setup)
    if config.interface is not None:
        model.interface = make_interface(config.interface)
    if not backend:
        return config, model, None, imported
    made = make_backend(config.backend or "plain")
    if config.optimizer is not None:  # a bad name or bad arguments show now
        made.optimizer = optimizer_factory(config.optimizer)
    return config, model, made, imported


def load_run_config(directory: Path) -> tuple[RunConfig, Path]:
    """The config of the config run in ``directory`` and the folder its relative
    ``imports`` are found from."""
    data = read_json(directory / CONFIG)
    if not data:
        raise FileNotFoundError(f"{directory} is not a run directory (no readable config.json)")
    base = read_json(directory / RECORD).get("base") or read_status(directory).get("base")
    return RunConfig.from_dict(data, source=str(directory / CONFIG)), Path(base or ".")


def prepare(
    config: RunConfig,
    root: str | os.PathLike[str] = "runs",
    *,
    base: str | os.PathLike[str] = ".",
    **options: Any,
) -> FolderRun:
    """``config``'s run in its folder (under ``root``), built and claimed: the one
    preparer's (``folder_run.prepare_in_folder``, which takes the same ``options``), with
    ``base`` where the config's relative ``imports`` are found."""
    return prepare_in_folder(ConfigKind(config, Path(base)), root, **options)


def execute(
    config: RunConfig, root: str | os.PathLike[str] = "runs", **options: Any
) -> tuple[RunResult, Path]:
    """``prepare(config, root, **options).run()``; returns the result and the directory."""
    prepared = prepare(config, root, **options)
    return prepared.run(), prepared.directory


def resume_dir(
    directory: str | os.PathLike[str],
    *,
    epochs: int | None = None,
    steps: int | None = None,
    iterations: int | None = None,
    **options: Any,
) -> FolderRun:
    """Prepare the config run in ``directory`` to continue from its newest checkpoint;
    with ``epochs``/``steps``/``iterations``, to that length (more than it has: an
    extension, recorded in its status and run log; its config and folder stay those it
    was started with)."""
    directory = Path(directory)
    config, base = load_run_config(directory)
    if epochs is None and steps is None and iterations is None:  # its length now
        status = read_status(directory)
        epochs, steps = status.get("epochs", config.epochs), status.get("steps", config.steps)
    kind = ConfigKind(config, base, (epochs, steps, iterations))
    return prepare_in_folder(kind, directory=directory, resume=True, **options)

"""Model-source runs: ``runmodel run model.py`` (a train run) lands in a run folder derived
from its source, prepared as every run in a derived folder is (``folder_run.py``); this
module supplies what is a model source's own (``SourceKind``):

    runs/digits-Digits-hidden256_3f9a2c1b40/
        run.json       kind "source": the source (its file resolved), the model class, the
                       init and setup options given, the device, the seed, the backend
                       (under torchrun), and what every run folder records
        ...            the files of every run folder (``session/folder.py``)

The folder's name is the source's file (or module) and class, its first options, and a
short hash of what makes the run (``IDENTITY``): the same command always resolves to the
same folder, and running it again there continues or restarts only when asked
(``--resume``, ``--restart``), never silently. ``runmodel resume RUN_DIR`` continues it,
and ``runmodel runs``, ``plot``, ``eval``, ``infer`` and ``export`` treat it as they treat
a config run.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config.runconfig import sanitize
from ..core import Pack
from .folder_run import Built
from .table import flatten

__all__ = ["IDENTITY", "SourceKind", "resolved_source", "source_record"]

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
    iterations: int | None = None,
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
        # only where given: the folders of runs without it keep their names
        **({"iterations": iterations} if iterations is not None else {}),
        "cwd": os.getcwd(),
    }


@dataclass(frozen=True)
class SourceKind:
    """A model source's train run (``folder_run.RunKind``): ``source_record``'s record
    (as a new run's, or as its folder recorded it), the model made by ``make`` (seeded
    as the record says) with its setup options resolved, and the length to run to
    (``epochs``/``steps``: the record's, or more when a resume extends it; ``iterations``:
    a resume's ``--iterations``, instead of steps)."""

    source_record: dict[str, Any]
    make: Callable[[], tuple[Any, dict[str, Any] | None, type]]
    length: tuple[int | None, int | None, int | None]

    @property
    def epochs(self) -> int | None:
        return self.length[0]

    @property
    def steps(self) -> int | None:
        return self.length[1]

    @property
    def iterations(self) -> int | None:
        """The length in iterations a resume asks for, else the one it was started with
        unless one in steps replaced it."""
        if self.length[2] is not None:
            return self.length[2]
        return self.source_record.get("iterations") if self.steps is None else None

    @property
    def kind(self) -> str:
        return "source"

    @property
    def mode(self) -> str:
        return "train"

    @property
    def config(self) -> None:
        return None

    def under_torchrun(self, backend: str | None) -> SourceKind:
        """As it is: the command chose its backend for torchrun (``--backend``, the
        record's, else ``ddp``: ``runs/target.py``), and its record holds it."""
        return self

    def build(self) -> tuple[SourceKind, Built]:
        model, setup_options, cls = self.make()
        return self, Built(model, self.backend_name(), setup_options, (cls,))

    def record(self) -> dict[str, Any]:
        return dict(self.source_record)

    def identity(self) -> Any:
        identity = {key: self.source_record.get(key) for key in IDENTITY}
        if self.source_record.get("iterations") is not None:  # a length, as steps are
            identity["iterations"] = self.source_record["iterations"]
        return identity

    def readable_name(self) -> str:
        """The file or module, the class unless it is the file's name, the first two
        options."""
        record = self.source_record
        location = str(record["source"]).partition(":")[0]
        stem = Path(location).stem if location.endswith(".py") else location.rpartition(".")[2]
        parts = [stem] if record["model"].lower() == stem.lower() else [stem, record["model"]]
        options = {**record.get("init_options", {}), **record.get("setup_options", {})}
        parts += [
            f"{key}{value}"
            for key, value in sorted(options.items())[:2]
            if isinstance(value, (int, float, str, bool))
        ]
        return "-".join(sanitize(part) for part in parts)

    def params(self) -> dict[str, Any]:
        return flatten(self.identity())

    def files(self) -> dict[str, dict[str, Any]]:
        return {}

    def backend_name(self) -> str | None:
        backend = self.source_record.get("backend")
        return None if backend is None else str(backend)

    def packs(self, run_dir: Path) -> list[Pack]:
        return []  # its file's configure(engine) attaches them

"""A folder that a pack (or a mode) will write to, made and tried at setup: a folder that
cannot be written is found before the first step, not at the first save."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["prepare_folder"]


def prepare_folder(folder: str | os.PathLike[str], owner: str) -> Path:
    """Create ``folder`` (with its parents) and write and remove a file there. A failure is
    one ``OSError`` naming the folder, ``owner`` (``"Checkpoint"``) and the cause, with no
    chained traceback. Returns the folder."""
    path = Path(folder)
    problem: OSError | None = None
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".runmodel-write-check-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        problem = error
    if problem is None:
        return path
    # raised here, outside the except block: one error, no "During handling of ..."
    kind = type(problem) if type(problem).__module__ == "builtins" else OSError
    raise kind(f"{owner} cannot write to its folder {str(path)!r}: {_cause(path, problem)}; "
               f"give {owner} a folder it can create and write to")


def _cause(path: Path, error: OSError) -> str:
    for part in (*reversed(path.parents), path):  # the first thing in the way, from the top
        if part.exists() and not part.is_dir():
            return f"{str(part)!r} is a file, not a folder"
    if isinstance(error, PermissionError):
        return f"no permission to write there ({error.strerror})"
    return error.strerror or str(error)

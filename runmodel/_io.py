"""Files written whole or not at all, what an interrupted write leaves behind, and the
one error a full disk gives.

``atomic_write(path)`` writes to a temporary file beside ``path`` (``.<name>.tmp<random>``),
holding an exclusive ``flock`` on it while it writes, fsyncs it and renames it over
``path``. A writer killed on the way leaves its temporary file, unlocked: the kernel
drops a dead process's locks. ``remove_stale(folder)`` removes those, and never the file
of a live writer, whose lock it cannot take: a lock, not a pid, because pids are reused
in containers and mean nothing on another host sharing the folder. (On NFS, Linux emulates
``flock`` with POSIX locks, which a process does not conflict with itself on: so a process
cleans a folder only while it has no write of its own under way there, as the Checkpoint
pack does, after waiting for its background write.)

``disk_full(error)`` finds an ``ENOSPC``/``EFBIG`` ``OSError`` through the exceptions
that wrap it (torch's writer raises a ``RuntimeError`` whose context is the OS error);
``DiskFullError`` is the one error a run stops with, naming the file.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

try:
    import fcntl
except ImportError:  # not POSIX: no locks, so no stale file is ever removed
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "DiskFullError",
    "atomic_write",
    "disk_full",
    "fsync_folder",
    "hold_lock",
    "is_temporary",
    "naming_disk_full",
    "prepare_folder",
    "raise_if_disk_full",
    "read_json",
    "remove_stale",
    "shared_lock",
    "temporary_name",
    "write_json",
]

#: ``.<name>.tmp<suffix>``: what ``atomic_write`` (and runmodel before it, with a pid
#: as the suffix) names its temporary files.
_TEMPORARY = re.compile(r"^\..+\.tmp[A-Za-z0-9_-]*$")
#: A temporary file that is empty may be one whose writer has made it and not locked it
#: yet; it is removed only once it is this old.
_EMPTY_GRACE_S = 60.0


def _umask() -> int:
    """The process's umask (read without changing it where Linux tells it)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class DiskFullError(OSError):
    """A write ran out of space (``ENOSPC``) or past the file-size limit (``EFBIG``);
    ``filename`` is the file it was writing."""

    def __init__(self, number: int, path: str) -> None:
        super().__init__(
            f"writing {path!r} failed: {os.strerror(number)} ([Errno {number}]); "
            f"free some space (or raise the file-size limit) and resume the run: "
            f"the files written before are intact"
        )
        self.errno, self.filename = number, path

    def __str__(self) -> str:
        return str(self.args[0])


def temporary_name(path: Path) -> str:
    """The prefix of ``path``'s temporary files."""
    return f".{path.name}.tmp"


def is_temporary(name: str) -> bool:
    return bool(_TEMPORARY.match(name))


def hold_lock(fd: int) -> bool:
    """Take the exclusive lock on the open file (or folder) ``fd`` without waiting;
    whether it was free. The lock lasts until ``fd`` is closed."""
    if fcntl is None:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], mode: str = "wb") -> Iterator[IO[Any]]:
    """A file to write ``path``'s new content into: on leaving the block it is flushed,
    fsynced and renamed over ``path`` (then the folder is fsynced), so ``path`` holds the
    old content or the new, never part of one. An error leaves ``path`` as it was and
    removes the temporary file; a full disk raises ``DiskFullError`` naming ``path``."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix=temporary_name(path), dir=path.parent)
    except OSError as error:
        raise_if_disk_full(error, path)
        raise
    try:
        hold_lock(fd)  # a new file with a random name: nobody else holds it
        os.fchmod(fd, 0o666 & ~_umask())  # as open() would make it (mkstemp: 0600)
        with os.fdopen(fd, mode, closefd=False) as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)  # still locked: a cleaner never takes it mid-rename
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise_if_disk_full(error, path)
        raise
    finally:
        os.close(fd)
    fsync_folder(path.parent)


@contextlib.contextmanager
def shared_lock(folder: str | os.PathLike[str]) -> Iterator[None]:
    """Hold a shared lock on ``folder`` (made if missing) while the block runs: the lock
    of one of several writers of a staging folder (each process of a sharded save).
    ``remove_stale`` takes the lock exclusively, so it removes the folder only once no
    writer holds it: every one of them is done or dead (the kernel drops a dead
    process's locks; a pid would say nothing across hosts, or once reused)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


def fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable."""
    with contextlib.suppress(OSError):  # some file systems refuse a folder's fsync
        directory = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def remove_stale(folder: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporary files (and staging folders) in ``folder`` whose writers are
    gone: those whose lock is free. Returns what was removed."""
    if fcntl is None:
        return []
    try:
        entries = list(os.scandir(folder))
    except OSError:  # no folder yet: nothing left behind
        return []
    removed = []
    for entry in entries:
        if is_temporary(entry.name) and _remove_if_dead(Path(entry.path)):
            removed.append(Path(entry.path))
    return removed


def _remove_if_dead(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # gone already (renamed by its writer), or unreadable: leave it
        return False
    try:
        if not hold_lock(fd):
            return False  # its writer is alive
        info = os.fstat(fd)
        if info.st_size == 0 and time.time() - info.st_mtime < _EMPTY_GRACE_S:
            return False  # maybe made a moment ago and not locked yet
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        return True
    finally:
        os.close(fd)


def disk_full(error: BaseException | None) -> OSError | None:
    """The ``ENOSPC``/``EFBIG`` ``OSError`` that ``error`` is, or that caused it
    (through ``__cause__`` and ``__context__``); else None."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EFBIG):
            return error
        error = error.__cause__ or error.__context__
    return None


@contextlib.contextmanager
def naming_disk_full(path: str | os.PathLike[str]) -> Iterator[None]:
    """Around writes to ``path``: a full disk raises one ``DiskFullError`` naming it."""
    try:
        yield
    except BaseException as error:
        raise_if_disk_full(error, path)
        raise


def raise_if_disk_full(error: BaseException, path: str | os.PathLike[str]) -> None:
    """Raise one ``DiskFullError`` naming ``path`` if ``error`` comes from a full disk."""
    if isinstance(error, DiskFullError):
        raise error
    found = disk_full(error)
    if found is not None:
        raise DiskFullError(found.errno or errno.ENOSPC, str(path)) from None


def write_json(path: Path, data: dict[str, Any]) -> None:
    """``data`` as JSON at ``path``, replacing it atomically (locked while written, so a
    dead writer's leftover is told from a live one's); a full disk is one
    ``DiskFullError`` naming the file."""
    with atomic_write(path, "w") as file:
        file.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object at ``path``; ``{}`` where there is none or it does not parse."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


# -- a folder a pack (or a mode) will write to, made and tried at setup: a folder that
# cannot be written is found before the first step, not at the first save
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
    raise kind(
        f"{owner} cannot write to its folder {str(path)!r}: {_cause(path, problem)}; "
        f"give {owner} a folder it can create and write to"
    )


def _cause(path: Path, error: OSError) -> str:
    for part in (*reversed(path.parents), path):  # the first thing in the way, from the top
        if part.exists() and not part.is_dir():
            return f"{str(part)!r} is a file, not a folder"
    if isinstance(error, PermissionError):
        return f"no permission to write there ({error.strerror})"
    return error.strerror or str(error)

"""Why a process of a distributed run failed, written where torchrun reads it and read back
by the launcher (``runmodel run --nproc-per-node``), which reports the first failure: the
one the others followed from; and, in a group torchrun restarted (``--max-restarts``),
which process each restart followed from (``restarts``), for the run's status.

Each process records its failure in ``$TORCHELASTIC_ERROR_FILE`` (as
``torch.distributed.elastic``'s ``@record`` does), with the time to the microsecond;
``first_failure`` reads torchrun's ``ChildFailedError`` and picks the first. The standard
library alone: the launcher reads the records without torch's distributed modules
imported for it.
"""

from __future__ import annotations

import json
import os
import signal
import time
import traceback
from pathlib import Path
from typing import Any

__all__ = ["first_failure", "record_failure", "restarts"]


def record_failure(error: BaseException) -> None:
    """In a process torchrun started: write why it failed where torchrun's launcher reads
    it (``$TORCHELASTIC_ERROR_FILE``), with the time to the microsecond, so that the
    launcher can tell the first failure from those it caused, and with the process's
    rank and its group's size (a restarted group reads them: ``restarts``). The first
    record of a process stands; outside torchrun (no such file asked for) nothing is
    written."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or os.path.exists(path):
        return
    now = time.time()
    data = {
        "message": {
            "message": f"{type(error).__name__}: {error}",
            "extraInfo": {
                "py_callstack": "".join(traceback.format_exception(error)),
                "timestamp": str(int(now)),
                "runmodel_time": now,
                "runmodel_rank": os.environ.get("RANK"),
                "runmodel_world": os.environ.get("WORLD_SIZE"),
            },
        }
    }
    temporary = f"{path}.tmp{os.getpid()}"
    with open(temporary, "w") as file:
        json.dump(data, file)
    os.replace(temporary, path)


def first_failure(failed: Any) -> tuple[int, str]:
    """The first failure of a ``ChildFailedError``: which process, and how it ended, why.
    A process killed by a signal from outside came first; otherwise the records of when
    each process failed, to the microsecond (``record_failure``), decide; torchrun's own
    order goes by the second."""
    # a process killed from outside (SIGKILL, the OOM killer) records nothing, and the
    # others then fail (recording it) on the lost connection: the killed one came first;
    # SIGTERM is how torchrun ends the processes left after a failure
    killed = sorted(
        rank
        for rank, failure in failed.failures.items()
        if failure.exitcode < 0
        and failure.exitcode != -signal.SIGTERM
        and _failed_at(failure) is None
    )
    timed = [
        (at, rank)
        for rank, failure in failed.failures.items()
        if (at := _failed_at(failure)) is not None
    ]
    if killed:
        rank = killed[0]
        first = failed.failures[rank]
    elif timed:
        rank = min(timed)[1]
        first = failed.failures[rank]
    else:
        rank, first = failed.get_first_failure()
    message = first.message
    if isinstance(message, dict):
        message = message.get("message", "")
    recorded = bool(first.error_file) and os.path.isfile(first.error_file)
    why = str(message).strip().splitlines()[0] if message and recorded else ""
    if first.exitcode < 0:
        try:
            ended = f"killed by {signal.Signals(-first.exitcode).name}"
        except ValueError:
            ended = f"killed by signal {-first.exitcode}"
    else:
        ended = f"exit code {first.exitcode}"
    # a process that recorded its error may be ended by torchrun before it exits itself
    return rank, (
        f"process rank {rank} failed: {why}" if why else f"process rank {rank} failed ({ended})"
    )


def _failed_at(failure: Any) -> float | None:
    data = failure.error_file_data
    try:
        return float(data["message"]["extraInfo"]["runmodel_time"])
    except (KeyError, TypeError, ValueError):
        return None


# -- restarts ------------------------------------------------------------------------------


def restarts() -> dict[str, Any]:
    """What a run's status records of torchrun's restarts of its group (``--max-restarts``),
    in a process of a restarted group: how many so far (``restarts``, from
    ``$TORCHELASTIC_RESTART_COUNT``) and, for each, the process whose failure it followed
    (``restarted_after``: ``{"attempt", "rank", "why"}``, ``rank`` ``"unknown"`` where it
    cannot be known). torchrun keeps each attempt's error files side by side, so the
    previous attempts' are read: where the attempt's processes were all on this machine,
    a process that recorded nothing while others recorded their lost connection was
    killed from outside (SIGKILL, the OOM killer) and came first; else the earliest
    record. Where they were on several machines (the records say the group's size), this
    machine sees its own processes' only: ``unknown``. Empty outside a restarted group."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return {}
    try:
        count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    except ValueError:
        return {}
    if count <= 0:
        return {}
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    attempts = Path(error_file).parents[2] if error_file else None
    return {
        "restarts": count,
        "restarted_after": [
            _failed_in(attempts / f"attempt_{attempt}" if attempts else None, attempt)
            for attempt in range(count)
        ],
    }


def _failed_in(folder: Path | None, attempt: int) -> dict[str, Any]:
    """Which process of one attempt failed first, from its error files (its processes'
    local ranks are their ranks when they were all on this machine)."""
    unknown = {
        "attempt": attempt,
        "rank": "unknown",
        "why": "not known on this machine (the processes ran on several)",
    }
    if folder is None:
        return unknown
    try:
        ranks = sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())
    except OSError:
        ranks = []
    if not ranks:
        return unknown
    recorded: dict[int, tuple[float, str]] = {}
    worlds: set[int] = set()
    for rank in ranks:
        record = _read_record(folder / str(rank) / "error.json")
        if record is not None:
            recorded[rank] = record[:2]
            worlds |= {record[2]} if record[2] is not None else set()
    if not worlds and os.environ.get("LOCAL_WORLD_SIZE") == os.environ.get("WORLD_SIZE"):
        worlds = {len(ranks)}  # no record says: this group's size, where it is all here
    if worlds != {len(ranks)}:  # the attempt's processes were not all on this machine
        return unknown
    silent = [rank for rank in ranks if rank not in recorded]
    if recorded and silent:
        return {
            "attempt": attempt,
            "rank": silent[0],
            "why": "ended from outside (killed: "
            "it recorded no error, and the others recorded losing it)",
        }
    if recorded:
        rank = min(recorded, key=lambda r: (recorded[r][0], r))
        return {"attempt": attempt, "rank": rank, "why": recorded[rank][1]}
    return {**unknown, "why": "no process recorded an error"}


def _read_record(path: Path) -> tuple[float, str, int | None] | None:
    """(when, what, the group's size) of an error file ``record_failure`` (or torch's
    ``@record``: no size) wrote."""
    try:
        data = json.loads(path.read_text())
        message = data["message"]
        info = message.get("extraInfo", {}) if isinstance(message, dict) else {}
        at = float(info.get("runmodel_time") or info.get("timestamp") or 0)
        text = message.get("message", "") if isinstance(message, dict) else str(message)
        world = int(info["runmodel_world"]) if info.get("runmodel_world") else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    what = str(text).strip().splitlines()[0][:300] if str(text).strip() else "an error"
    return at, what, world

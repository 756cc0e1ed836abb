"""Why a process of a distributed run failed, written where torchrun reads it and read back
by the launcher (``runmodel run --nproc-per-node``), which reports the first failure: the
one the others followed from.

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
from typing import Any

__all__ = ["first_failure", "record_failure"]


def record_failure(error: BaseException) -> None:
    """In a process torchrun started: write why it failed where torchrun's launcher reads
    it (``$TORCHELASTIC_ERROR_FILE``), with the time to the microsecond, so that the
    launcher can tell the first failure from those it caused. The first record of a
    process stands; outside torchrun (no such file asked for) nothing is written."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or os.path.exists(path):
        return
    now = time.time()
    data = {"message": {"message": f"{type(error).__name__}: {error}", "extraInfo": {
        "py_callstack": "".join(traceback.format_exception(error)),
        "timestamp": str(int(now)), "runmodel_time": now}}}
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
    killed = sorted(rank for rank, failure in failed.failures.items()
                    if failure.exitcode < 0 and failure.exitcode != -signal.SIGTERM
                    and _failed_at(failure) is None)
    timed = [(at, rank) for rank, failure in failed.failures.items()
             if (at := _failed_at(failure)) is not None]
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
    return rank, (f"process rank {rank} failed: {why}" if why else
                  f"process rank {rank} failed ({ended})")


def _failed_at(failure: Any) -> float | None:
    data = failure.error_file_data
    try:
        return float(data["message"]["extraInfo"]["runmodel_time"])
    except (KeyError, TypeError, ValueError):
        return None

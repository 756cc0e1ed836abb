"""That the processes of a distributed run end it together, found without a collective
(``docs/distributed.md``, "How a run ends"): each process leaves marks in the process
group's store as it goes, and reads the others' with a bounded wait. A process that
failed records it there too, so that the others' errors name the one they followed from.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from . import env

__all__ = ["EndAgreement"]

#: Runs in this process that used a process group: each run's marks have keys of their
#: own in the group's store (every process runs the same runs, in the same order).
_run_numbers = itertools.count()


class EndAgreement:
    """That the processes end a run together, found without a collective. Each leaves a
    mark in the process group's store as it goes: ``start``/``end`` of each epoch and,
    at a normal end, ``done`` (with the epoch and step). Two waits, each at most
    ``timeout`` seconds:

    - an epoch cut short (``stop()``, the budget) waits, before its end hooks (which may
      talk to the others: an evaluation), until every process ended it at the same step;
    - a normal end waits until every process is done at the same step.

    A process found further on (in a later epoch) shows a ``stop()`` that the others did
    not reach: that fails at once, as a timeout does. The ranks are in step (every step
    all-reduces), so the waits are short: a rank-0 checkpoint written at the last step or
    epoch end is the longest of them."""

    __slots__ = ("_last", "_prefix", "_store", "timeout")

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._store: Any = None
        self._last: tuple[str, int, int] | None = None  # this process's last mark
        # a restarted group (torchrun's --max-restarts) may meet in the same store: its
        # marks are its own
        self._prefix = f"runmodel/{env.restart_count()}/run{next(_run_numbers)}/at"

    def epoch_start(self, engine: Any) -> None:
        self._mark("start", engine.state.epoch, engine.state.step)

    def epoch_end(self, engine: Any) -> None:
        s = engine.state
        self._mark("end", s.epoch, s.step)
        if not s.epoch_complete:
            self._wait({"end", "done"}, s)

    def agree(self, state: Any) -> None:
        """At a normal end: mark done, wait until every process is done there too."""
        if self._last is None or not env.has_group():
            return  # no epoch began: no step ran that could leave the others behind
        _, epoch, step = self._last
        self._mark("done", epoch, step)
        self._wait({"done"}, state)

    def failed(self, error: BaseException) -> tuple[int, str] | None:
        """Record this process's failure in the store; the failure of another process
        recorded before it, if any, as (rank, what), the one this may follow from. Local
        work and one store call each way: a peer may be gone."""
        try:
            store = self._store or env.group_store()
            rank = env.rank()
            store.set(
                f"{self._prefix}/failed/{rank}",
                f"{time.time()!r} {type(error).__name__}: {str(error).splitlines()[0][:300]}",
            )
            first = None
            for other in range(env.world_size()):
                key = f"{self._prefix}/failed/{other}"
                if other != rank and store.check([key]):
                    at, what = store.get(key).decode().split(" ", 1)
                    if first is None or float(at) < first[0]:
                        first = (float(at), other, what)
        except Exception:  # the store went with a failed process: nothing to learn
            return None
        return None if first is None else (first[1], first[2])

    def _mark(self, kind: str, epoch: int, step: int) -> None:
        if self._store is None:
            self._store = env.group_store()
        self._last = (kind, epoch, step)
        self._store.set(f"{self._prefix}/{env.rank()}", f"{kind} {epoch} {step}")

    def _wait(self, kinds: set[str], state: Any) -> None:
        assert self._last is not None
        step = self._last[2]
        # a training step all-reduces, so the processes end at the same step; an eval or
        # infer run deals the data out with a batch more on some processes, so there they
        # have the epoch in common, not the step
        at = _position if state.kind == "train" else _epoch
        here = at(self._last)
        rank = env.rank()
        others = [r for r in range(env.world_size()) if r != rank]
        deadline = time.monotonic() + self.timeout
        while True:
            marks = {r: self._read(r) for r in others}
            behind = [
                r for r, m in marks.items() if m is None or m[0] not in kinds or at(m) != here
            ]
            if not behind:
                return
            if time.monotonic() >= deadline or any(
                m is not None and at(m) > here for m in marks.values()
            ):
                break
            time.sleep(0.01)
        where = ", ".join(f"rank {r} " + _where(marks[r]) for r in behind)
        raise RuntimeError(
            f"rank {rank} ended its run ({'stopped' if state.ended is None else state.ended}"
            f") at step {step}, and the others did not end with it within {self.timeout:g} s "
            f"({where}): a stop() that some processes reach and others do not; decide to "
            f"stop from values every process has (a reduced metric, the counters), or "
            f"raise end_timeout= (DDP, FSDP) if the others were only slow"
        )

    def _read(self, rank: int) -> tuple[str, int, int] | None:
        key = f"{self._prefix}/{rank}"
        if not self._store.check([key]):
            return None
        kind, epoch, step = self._store.get(key).decode().split()
        return kind, int(epoch), int(step)


def _position(mark: tuple[str, int, int]) -> tuple[int, ...]:
    return mark[1:]


def _epoch(mark: tuple[str, int, int]) -> tuple[int, ...]:
    return mark[1:2]


def _where(mark: tuple[str, int, int] | None) -> str:
    if mark is None:
        return "had not begun an epoch"
    kind, epoch, step = mark
    return {
        "start": f"was in epoch {epoch}, begun at step {step}",
        "end": f"was ending epoch {epoch} at step {step}",
        "done": f"ended at step {step}",
    }[kind]

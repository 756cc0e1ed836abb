"""The processes of a distributed run stop together after a signal (``docs/distributed.md``,
"Preemption: stopping together").

A signal reaches the processes at different moments, and sometimes only some of them (a
scheduler that signals one process, a Ctrl-C that the launcher forwards). The handler
(``session/interrupt.py``) only records it here (``REQUEST``); every ``preempt_check_every``
steps the backend's pack all-reduces a one-element flag (``StopCheck``): the largest
signal number any process recorded, 0 for none. Every process sees the same value after
the same step, and every process then stops there, as a first Ctrl-C stops one process
(``engine.interrupt``), so the run's checkpoint is taken at one step by all of them.

Only distributed runs pay for it: the check is a hook on ``runstep`` with ``every=``, so
the steps between checks cost a comparison, and only the check reads the flag back (a
CPU tensor on a gloo group: no device is synchronised). Torch is imported by the check
alone: the handler records a signal in processes that never import it (the command line's
``runs``, ``plot``).
"""

from __future__ import annotations

import functools
import signal
import time
from typing import Any

__all__ = ["REQUEST", "StopCheck", "StopRequest"]


class StopRequest:
    """What this process was asked: the signal it received (0: none) and when (a
    ``time.monotonic()``), and how many runs of this process have a ``StopCheck`` that
    acts on it (none: the handler stops the run itself, as in one process)."""

    __slots__ = ("at", "checks", "signal")

    def __init__(self) -> None:
        self.signal = 0
        self.at = 0.0
        self.checks = 0

    def record(self, signum: int) -> None:
        self.signal, self.at = int(signum), time.monotonic()

    def since(self) -> float:
        """Seconds since the signal was recorded."""
        return time.monotonic() - self.at

    def reset(self) -> None:
        self.signal, self.at = 0, 0.0


#: This process's request: one process receives one signal at a time, whichever run it is in.
REQUEST = StopRequest()


class StopCheck:
    """The ``runstep`` hook (``every=preempt_check_every``) that stops every process of
    the run at the same step once any of them recorded a signal: an all-reduce (MAX) of
    the signal's number over ``group`` (None: the default group, when it is gloo; else a
    gloo group of its own, so the check never waits on a device). ``fired`` says the run was
    stopped here, on every process: its end is agreed, not a failure."""

    __slots__ = ("fired", "flag", "group", "reduce")

    def __init__(self, group: Any) -> None:
        import torch
        import torch.distributed as dist

        self.group = group
        self.flag = torch.zeros(1, dtype=torch.int32)  # made once: a check allocates nothing
        self.reduce = functools.partial(
            dist.all_reduce, self.flag, op=dist.ReduceOp.MAX, group=group
        )
        self.fired = False

    def __call__(self, engine: Any) -> None:
        flag = self.flag
        flag.fill_(REQUEST.signal)
        self.reduce()
        asked = int(flag.item())
        if asked and not self.fired:
            self.fired = True
            engine.interrupt(signal=None if asked == signal.SIGINT else asked)

"""Ctrl-C in a script: the first one finishes the current step and ends the run with
``Interrupted`` (after a ``Checkpoint`` pack saved that step), a second one stops at once.

Config runs do the same with a handler of their own (``runmodel/config/rundir.py``, which ends the
run by ``stop()`` and reports it in the run folder); a script's run installs this one only
where Python's own Ctrl-C handler is in place, so an outer run, a config run or a handler
the script set keeps its own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["ctrl_c_finishes_the_step"]


@contextlib.contextmanager
def ctrl_c_finishes_the_step(engine: Any) -> Iterator[None]:
    """While ``engine`` runs: the first SIGINT calls ``engine.interrupt()``, the second
    raises ``KeyboardInterrupt`` as Python does.

    A terminal's Ctrl-C reaches every process of its foreground group, the DataLoader
    workers too. Workers forked during the run inherit this handler, and in them it does
    nothing: they keep serving batches until the run ends and shuts them down, so the
    step that is finishing never meets "worker exited unexpectedly"."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
            or int(os.environ.get("WORLD_SIZE", "1")) > 1):  # ddp ranks must stop together
        yield
        return
    owner = os.getpid()

    def first_ctrl_c(signum: int, frame: Any) -> None:
        if os.getpid() != owner:  # a forked DataLoader worker: the run decides
            return
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the next one: at once
        print("runmodel: Ctrl-C: stopping after this step (Ctrl-C again to stop at once)",
              file=sys.stderr, flush=True)
        engine.interrupt()

    signal.signal(signal.SIGINT, first_ctrl_c)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)

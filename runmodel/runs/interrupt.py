"""Ctrl-C in a script: the first one finishes the current step and ends the run with
``Interrupted`` (after a ``Checkpoint`` pack saved that step), a second one stops at once.

Config runs do the same with a handler of their own (``runmodel/runs/config_run.py``, which
ends the run by ``stop()`` and reports it in the run folder); a script's run installs this one only
where Python's own Ctrl-C handler is in place, so an outer run, a config run or a handler
the script set keeps its own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ..backends.distributed import env

__all__ = ["IgnoreCtrlC", "ctrl_c_finishes_the_step"]


@contextlib.contextmanager
def ctrl_c_finishes_the_step(engine: Any) -> Iterator[Callable[[Any], None] | None]:
    """While ``engine`` runs: the first SIGINT calls ``engine.interrupt()``, the second
    raises ``KeyboardInterrupt`` as Python does. Yields what to call with the model once
    ``model.setup()`` made its loaders (None where Ctrl-C keeps Python's handler).

    A terminal's Ctrl-C reaches every process of its foreground group, the DataLoader
    workers too. Workers forked during the run inherit this handler, and in them it does
    nothing; workers started otherwise (``spawn``, ``forkserver``) ignore SIGINT from
    their start, through the model's loaders' ``worker_init_fn``. They keep serving
    batches until the run ends and shuts them down, so the step that is finishing never
    meets "worker exited unexpectedly"."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
            or env.several()):  # the processes of a ddp run must stop together
        yield None
        return
    owner = os.getpid()

    def first_ctrl_c(signum: int, frame: Any) -> None:
        if os.getpid() != owner:  # a forked DataLoader worker: the run decides
            return
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the next one: at once
        if not engine.interrupt():  # before the run began: as Python's own handler
            raise KeyboardInterrupt
        print("runmodel: Ctrl-C: stopping after this step (Ctrl-C again to stop at once)",
              file=sys.stderr, flush=True)

    loaders: list[tuple[Any, Any]] = []  # (loader, its own worker_init_fn)

    def workers_ignore_ctrl_c(model: Any) -> None:  # after model.setup() made the loaders
        for kind in ("train_data", "eval_data", "infer_data"):
            loader: Any = getattr(model, kind, None)
            if getattr(loader, "num_workers", 0) and not isinstance(
                    loader.worker_init_fn, IgnoreCtrlC):
                loaders.append((loader, loader.worker_init_fn))
                loader.worker_init_fn = IgnoreCtrlC(loader.worker_init_fn)

    signal.signal(signal.SIGINT, first_ctrl_c)
    try:
        yield workers_ignore_ctrl_c
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for loader, own in loaders:
            loader.worker_init_fn = own


class IgnoreCtrlC:
    """A DataLoader ``worker_init_fn``: the worker ignores SIGINT (the run's main process
    decides what a Ctrl-C does), then the loader's own ``worker_init_fn`` runs.
    Picklable, for workers that are not forked."""

    def __init__(self, then: Any) -> None:
        self.then = then

    def __call__(self, worker_id: int) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if self.then is not None:
            self.then(worker_id)

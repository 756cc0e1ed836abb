"""The one way a run is interrupted: Ctrl-C, or a preemption signal (SIGTERM from a
scheduler, or a signal the run was told to watch).

The handler only records the signal: it asks the engine to stop once the step under way
is done (``engine.interrupt``), so the run's state is whole. Then, on the run's own path,
a ``Checkpoint`` pack saves that step, the run folder's status says ``interrupted`` (or
``preempted``), and ``engine.run`` raises ``runmodel.Interrupted`` (``runmodel.Preempted``
for a preemption signal). An ``Interrupted`` nobody catches ends the process as the
signal would have (``ends_as_its_signal``): 130 in a shell for Ctrl-C, 143 for SIGTERM.

Nothing on this path writes to the terminal before the state is saved, and nothing it
writes can fail the run: with ``python train.py 2>&1 | tee log`` the same Ctrl-C ends
``tee``, and a write to the closed pipe raises ``BrokenPipeError`` (``say`` drops it).

A second Ctrl-C stops at once, as Python's own handler does. The handlers are installed
only in the main thread and where Python's own are in place (an outer run, or a handler
the script set, keeps its own), and not in a process of several (``WORLD_SIZE`` > 1):
those need to agree on the step they stop at.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any

from ..backends.distributed import env
from ..core import Interrupted

__all__ = ["IgnoreCtrlC", "ends_as_its_signal", "say", "signal_number", "watch_interrupts"]


def say(text: str) -> None:
    """``text`` on stderr, as one line; a closed or broken stderr drops it (the run's
    files, not its last words, are what matters)."""
    with contextlib.suppress(OSError, ValueError, RuntimeError):  # RuntimeError: reentrant
        print(text, file=sys.stderr, flush=True)


def signal_number(value: int | str | signal.Signals) -> signal.Signals:
    """A signal given as a number, a name (``"SIGTERM"``, ``"TERM"``) or a
    ``signal.Signals``; a clear error for anything else."""
    try:
        if isinstance(value, str):
            name = value.upper()
            return signal.Signals[name if name.startswith("SIG") else f"SIG{name}"]
        return signal.Signals(value)
    except (KeyError, ValueError):
        known = ", ".join(s.name for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2))
        raise ValueError(f"{value!r} is not a signal: give a number or a name such as "
                         f"{known}") from None


@contextlib.contextmanager
def watch_interrupts(engine: Any, preempt: Iterable[int | str | signal.Signals] = ()
                     ) -> Iterator[Callable[[Any], None] | None]:
    """While ``engine`` runs: the first SIGINT interrupts the run after its step
    (``engine.interrupt()``), a second raises ``KeyboardInterrupt`` at once; each signal
    of ``preempt`` preempts it the same way (``engine.interrupt(signal=...)``), a second
    one ends the process as that signal does. Yields what to call with the model once
    ``model.setup()`` made its loaders (None where the handlers are not installed).

    A terminal's Ctrl-C reaches every process of its foreground group, the DataLoader
    workers too. Workers forked during the run inherit this handler, and in them it does
    nothing; workers started otherwise (``spawn``, ``forkserver``) ignore SIGINT from
    their start, through the model's loaders' ``worker_init_fn``. They keep serving
    batches until the run ends and shuts them down, so the step that is finishing never
    meets "worker exited unexpectedly"."""
    preempting = [signal_number(s) for s in preempt]
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
            or env.several()):  # the processes of a ddp run must stop together
        yield None
        return
    owner = os.getpid()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, *preempting)}

    def first(signum: int, frame: Any) -> None:
        if os.getpid() != owner:  # a forked DataLoader worker: the run decides
            return
        for sig in previous:  # the next one: at once
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT
                          else _at_once)
        ctrl_c = signum == signal.SIGINT
        if not engine.interrupt(signal=None if ctrl_c else signum):
            _at_once(signum, frame)  # before the run began: as without this handler
        again = "Ctrl-C again" if ctrl_c else f"{signal.Signals(signum).name} again"
        say(f"runmodel: {'Ctrl-C' if ctrl_c else signal.Signals(signum).name}: stopping "
            f"after this step, then saving ({again} to stop at once)")

    loaders: list[tuple[Any, Any]] = []  # (loader, its own worker_init_fn)

    def workers_ignore_ctrl_c(model: Any) -> None:  # after model.setup() made the loaders
        for kind in ("train_data", "eval_data", "infer_data"):
            loader: Any = getattr(model, kind, None)
            if getattr(loader, "num_workers", 0) and not isinstance(
                    loader.worker_init_fn, IgnoreCtrlC):
                loaders.append((loader, loader.worker_init_fn))
                loader.worker_init_fn = IgnoreCtrlC(loader.worker_init_fn)

    for sig in previous:
        signal.signal(sig, first)
    try:
        yield workers_ignore_ctrl_c
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for loader, own in loaders:
            loader.worker_init_fn = own


def _at_once(signum: int, frame: Any) -> None:
    """What the signal does without runmodel: Ctrl-C raises ``KeyboardInterrupt``; another
    signal ends the process with its default action (nothing is saved: the previous
    checkpoint stays as it was)."""
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def ends_as_its_signal(error: BaseException) -> None:
    """Make an ``Interrupted`` that nobody catches end the process as its signal would:
    Python's own message (the traceback), then the signal with its default action, so
    that the parent sees "killed by SIGINT" (130 in a shell) or by SIGTERM (143), as for
    a process that never handled it. (Python does this itself only for a plain
    ``KeyboardInterrupt``.) Installed once, in front of the excepthook in place."""
    hook = sys.excepthook
    if not isinstance(hook, _EndsAsItsSignal):
        sys.excepthook = _EndsAsItsSignal(hook)


class _EndsAsItsSignal:
    """An excepthook: the one in place says what happened; an ``Interrupted`` then ends
    the process by its signal."""

    __slots__ = ("previous",)

    def __init__(self, previous: Callable[..., Any]) -> None:
        self.previous = previous

    def __call__(self, kind: type[BaseException], error: BaseException,
                 traceback: TracebackType | None) -> None:
        self.previous(kind, error, traceback)
        if not isinstance(error, Interrupted):
            return
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
            sys.stderr.flush()
        sig = error.signal
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)


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

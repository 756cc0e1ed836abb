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
``tee``, and a write to the closed pipe raises ``BrokenPipeError`` (``say`` drops it; a
hook's own ``print`` is guarded, below).

An output whose reader goes away with no signal (``python train.py | head -n 5``, a
``tee`` killed on its own) is an interrupt too: a stdout or stderr that is a pipe or a
socket is guarded for the whole run (``_Output``), and its first ``BrokenPipeError`` asks
the run to stop after the step under way (``OUTPUT_CLOSED``), so that step is saved, the
status says ``interrupted`` and the process ends as Ctrl-C does (130): the same end as a
Ctrl-C that also ends ``tee``, whichever of the two the run meets first. A terminal or a
file is never wrapped (a progress bar asks the stream itself whether it is a terminal).

A second Ctrl-C stops at once, as Python's own handler does. A second preemption signal
within ``SAME_SIGNAL_S`` seconds is the same preemption (a wrapper forwarding it, a
scheduler signalling the group); a later one stops the run at once (``StoppedAtOnce``:
its status is written, the checkpoints are left as they were). From the first signal to
the end of the run, a write to a closed stdout or stderr is dropped (``_Output``), so a
``print`` in a hook cannot fail the step that is finishing. The handlers are installed
only in the main thread and where Python's own are in place (an outer run, or a handler
the script set, keeps its own; a Ctrl-C that the process ignores, as a shell's
background job does, stays ignored).

In a process of several (torchrun, ``WORLD_SIZE`` > 1) the processes must stop after the
same step, so the handler only records the signal (``backends/distributed/stopping.py``):
the backend's check, every ``preempt_check_every`` steps, stops them all at once (a run
without one, a script's own group with a plain backend, stops this process alone once
its setup is done). What stays prompt there: a process whose run failed, or that is in
its teardown, ends at once on a signal (torchrun sends SIGTERM to the processes left
after a failure, and to all of them at a restart); a second signal more than
``SAME_SIGNAL_S`` seconds after the first ends the process at once, leaving the
checkpoints as they were; one sooner is the same signal again (a terminal's Ctrl-C that
reaches a process from the terminal and from the launcher).
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any

from ..backends.distributed import env
from ..backends.distributed.failures import record_failure
from ..backends.distributed.stopping import REQUEST
from ..core import Interrupted

__all__ = [
    "OUTPUT_CLOSED",
    "SAME_SIGNAL_S",
    "IgnoreCtrlC",
    "StoppedAtOnce",
    "ends_as_its_signal",
    "preempting",
    "say",
    "signal_number",
    "watch_interrupts",
]

#: A second signal this soon (seconds) after the first is the same one: a terminal's
#: Ctrl-C reaches a process of torchrun's from the terminal and again from the launcher; a
#: preemption signal reaches one process from a wrapper that forwards it and again from a
#: scheduler that signals the group. (A second Ctrl-C of one process stops it at once.)
SAME_SIGNAL_S = 2.0

#: The reason a run gives (``state.stopping``'s message, its status's ``error``) when its
#: stdout or stderr closed: the pipe's reader went away.
OUTPUT_CLOSED = "interrupted: output closed"


class StoppedAtOnce(KeyboardInterrupt):
    """A second preemption signal, ``SAME_SIGNAL_S`` after the first: the run stops at
    once (its status says ``interrupted``, its checkpoints are as they were), and an
    uncaught one ends the process as its signal does. ``signal`` is its number."""

    def __init__(self, signal: int) -> None:
        super().__init__(f"{_name(signal)} again: stopped at once, nothing saved")
        self.signal = signal


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
        raise ValueError(
            f"{value!r} is not a signal: give a number or a name such as {known}"
        ) from None


def preempting(
    signals: Iterable[int | str | signal.Signals] | int | str | signal.Signals,
) -> list[signal.Signals]:
    """The signals of ``preempt_signals=``: one (a number, a name such as ``"SIGTERM"``,
    a ``signal.Signals``) or several; a clear error for one that no process can catch."""
    given = [signals] if isinstance(signals, (int, str)) else list(signals)
    found = [signal_number(s) for s in given]
    for sig in found:
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            raise ValueError(
                f"preempt_signals: {sig.name} cannot be caught: nothing can save before it "
                f"ends the process; give a signal a process can handle, such as SIGTERM "
                f"or SIGUSR1"
            )
    return found


@contextlib.contextmanager
def watch_interrupts(
    engine: Any, preempt: Iterable[int | str | signal.Signals] = ()
) -> Iterator[Callable[[Any], None] | None]:
    """While ``engine`` runs: the first SIGINT interrupts the run after its step
    (``engine.interrupt()``), a second raises ``KeyboardInterrupt`` at once; each signal
    of ``preempt`` preempts it the same way (``engine.interrupt(signal=...)``), a second
    one ends the process as that signal does. In a process of several, the processes
    stop together (the module's docstring). Yields what to call with the model once
    ``model.setup()`` made its loaders and the backend prepared it (None where the
    handlers are not installed).

    A terminal's Ctrl-C reaches every process of its foreground group, the DataLoader
    workers too. Workers forked during the run inherit this handler, and in them it does
    nothing; workers started otherwise (``spawn``, ``forkserver``) ignore SIGINT from
    their start, through the model's loaders' ``worker_init_fn``. They keep serving
    batches until the run ends and shuts them down, so the step that is finishing never
    meets "worker exited unexpectedly"."""
    preempting = [signal_number(s) for s in preempt]
    ctrl_c = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or ctrl_c not in (
        signal.default_int_handler,
        signal.SIG_IGN,
    ):
        yield None  # an outer run's handlers, or the script's own
        return
    owner, several = os.getpid(), env.several()
    set_up = [False]  # model.setup() ran and the backend prepared the model
    first_at = [0.0]  # when the first signal came (time.monotonic())

    def output_closed() -> None:
        """A pipe's reader went away: the run stops after this step, as for Ctrl-C
        (unless it is stopping already: a signal's end, or a hook's ``stop()``, stays)."""
        if os.getpid() != owner:
            return
        if not several:
            if not first_at[0] and engine.state.stopping is None:
                engine.interrupt(OUTPUT_CLOSED)
        elif not REQUEST.signal:  # the processes stop together, at their next check
            REQUEST.record(signal.SIGINT)
            if set_up[0] and not REQUEST.checks:
                _interrupt(engine, signal.SIGINT)

    _guard_pipes(output_closed)
    watched = [signal.SIGINT] if ctrl_c is signal.default_int_handler else []
    watched += [sig for sig in preempting if sig not in watched and sig != signal.SIGINT]
    previous = {sig: signal.getsignal(sig) for sig in watched}

    def first(signum: int, frame: Any) -> None:
        if os.getpid() != owner:  # a forked DataLoader worker: the run decides
            return
        if several:
            _together(engine, signum, frame, alone=set_up[0] and not REQUEST.checks)
            return
        ctrl_c = signum == signal.SIGINT
        for sig in previous:  # the next one: at once (a preemption's: after SAME_SIGNAL_S)
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else again)
        first_at[0] = time.monotonic()
        if not engine.interrupt(signal=None if ctrl_c else signum):
            _at_once(signum, frame)  # before the run began: as without this handler
        _guard_output()
        again_ = "Ctrl-C again" if ctrl_c else f"{signal.Signals(signum).name} again"
        if not ctrl_c:
            again_ += f", {SAME_SIGNAL_S:g} s on,"
        say(
            f"runmodel: {_name(signum)}: stopping after this step, then saving ({again_} to "
            f"stop at once)"
        )

    def again(signum: int, frame: Any) -> None:
        """A second preemption signal: the same preemption within ``SAME_SIGNAL_S`` (a
        wrapper that forwards it, and a scheduler that signals the group); later, the run
        stops at once, its status written, leaving the checkpoints as they were."""
        if os.getpid() != owner or time.monotonic() - first_at[0] <= SAME_SIGNAL_S:
            return
        for sig in previous:  # a third: as without runmodel
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else _at_once)
        raise StoppedAtOnce(signum)

    loaders: list[tuple[Any, Any]] = []  # (loader, its own worker_init_fn)

    def after_setup(model: Any) -> None:  # the model's loaders exist, the backend is there
        for kind in ("train_data", "eval_data", "infer_data"):
            loader: Any = getattr(model, kind, None)
            if getattr(loader, "num_workers", 0) and not isinstance(
                loader.worker_init_fn, IgnoreCtrlC
            ):
                loaders.append((loader, loader.worker_init_fn))
                loader.worker_init_fn = IgnoreCtrlC(loader.worker_init_fn)
        set_up[0] = True
        if several and REQUEST.signal and not REQUEST.checks:  # nobody checks: stop here
            _interrupt(engine, REQUEST.signal)

    if several:
        REQUEST.reset()
    for sig in previous:
        signal.signal(sig, first)
    try:
        yield after_setup
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for loader, own in loaders:
            loader.worker_init_fn = own
        if several:
            REQUEST.reset()
        _unguard_output()


def _together(engine: Any, signum: int, frame: Any, alone: bool) -> None:
    """A signal in a process of several: recorded for the processes' next check (or, with
    no check in this run, ``alone``: the run stops after its step); at once in a run that
    failed or is in its teardown, and for a second signal (unless it is the first again,
    within ``SAME_SIGNAL_S`` seconds)."""
    if REQUEST.signal:
        if REQUEST.since() > SAME_SIGNAL_S:
            _at_once(signum, frame)
        return
    s = engine.state
    failed = s.error is not None and not isinstance(s.error, Interrupted)
    if failed or s.ended is not None:
        # failed, or tearing down: nothing to stop after. torchrun's SIGTERM to the
        # processes left after a failure can come before this one's failure is recorded
        # (the backend's exception hook): record it first, or a restarted group could not
        # tell which process failed first (failures.restarts)
        if failed:
            record_failure(s.error)
        _at_once(signum, frame)
        return
    REQUEST.record(signum)
    _guard_output()
    if alone:
        _interrupt(engine, signum)
    if env.rank() == 0:
        when = (
            "this process stops after this step"
            if alone
            else "the processes stop together after one of the next steps"
        )
        say(
            f"runmodel: {_name(signum)}: {when}, then save ({_name(signum)} again, "
            f"{SAME_SIGNAL_S:g} s on, to stop at once)"
        )


def _interrupt(engine: Any, signum: int) -> None:
    if not engine.interrupt(signal=None if signum == signal.SIGINT else signum):
        _at_once(signum, None)


def _name(signum: int) -> str:
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


def _at_once(signum: int, frame: Any) -> None:
    """What the signal does without runmodel: Ctrl-C raises ``KeyboardInterrupt``; another
    signal ends the process with its default action (nothing is saved: the previous
    checkpoint stays as it was)."""
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


class _Output:
    """``sys.stdout`` or ``sys.stderr``, guarded: a write to a reader that is gone raises
    no ``BrokenPipeError``; the text is dropped, the stream pointed at the null device, and
    ``on_close`` (a run's) is called, once. Once an interrupt is pending (``pending``), a
    write to a closed stream is dropped too, so a ``print`` in a hook cannot fail the step
    that is finishing before it is saved."""

    def __init__(self, stream: Any, on_close: Callable[[], None] | None = None) -> None:
        self.stream, self.on_close, self.pending = stream, on_close, on_close is None

    def write(self, text: str) -> int:
        try:
            return int(self.stream.write(text))
        except (BrokenPipeError, ValueError) as error:
            self._closed(error)
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except (BrokenPipeError, ValueError) as error:
            self._closed(error)

    def _closed(self, error: Exception) -> None:
        if isinstance(error, ValueError) and not self.pending:
            raise error  # a stream the program closed itself, no interrupt pending
        with contextlib.suppress(OSError, ValueError, AttributeError):
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self.stream.fileno())
            os.close(null)
        on_close, self.on_close, self.pending = self.on_close, None, True
        if on_close is not None:
            on_close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _guard_pipes(on_close: Callable[[], None]) -> None:
    """For the run: ``sys.stdout`` and ``sys.stderr`` guarded where they write to a pipe
    or a socket (the outputs whose reader can go away), ``on_close`` called when one
    closes."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _Output) and _to_a_pipe(stream):
            setattr(sys, name, _Output(stream, on_close))


def _to_a_pipe(stream: Any) -> bool:
    try:
        mode = os.fstat(stream.fileno()).st_mode
    except (AttributeError, OSError, ValueError):  # no file descriptor: pytest's capture
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _guard_output() -> None:
    """From the first signal to the end of the run: the output guarded (``_Output``), a
    write to a closed stream dropped."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if isinstance(stream, _Output):
            stream.pending = True
        elif stream is not None:
            setattr(sys, name, _Output(stream))


def _unguard_output() -> None:
    """At the run's end: the streams as they were."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if isinstance(stream, _Output):
            setattr(sys, name, stream.stream)


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

    def __call__(
        self, kind: type[BaseException], error: BaseException, traceback: TracebackType | None
    ) -> None:
        self.previous(kind, error, traceback)
        if not isinstance(error, (Interrupted, StoppedAtOnce)):
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

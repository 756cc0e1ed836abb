"""``every=`` and ``once=`` as functions of the run's counters.

A position is a value of the run's own counters, which count from 0: ``once=2`` on an
epoch phase fires at ``state.epoch == 2`` (the third epoch), on a step phase at
``state.step == 2``; ``once="2ep"`` on a step phase fires at the first step of epoch 2.
``every=N`` fires on the N-th, 2N-th, ... event of the phase's own unit. Both read the
counters, not a count of calls, so a resumed run (or a hook that joins mid-run) fires
exactly where one straight run would.

Durations in another unit than the phase's own: epochs on a step phase mean the first
step of those epochs; steps on ``epoch_end`` mean the steps of the epoch that ends. Where
the counters cannot tell (seconds, steps on ``epoch_start`` or a run phase), they count
from this run's start.

Iterations (``"it"``, ``state.iteration``: optimizer steps, one per window under
``GradAccumulation(k)``): on a step phase ``every="250it"`` fires at the runstep that
completes every 250th iteration (its window's last), ``once="1000it"`` at iteration
1000's first runstep. ``every=N, from_zero=True`` counts positions 0, N, 2N... instead
of N-1, 2N-1...: a script's ``if it % N == 0`` where ``every=N`` is its
``if (it + 1) % N == 0``; with iterations, at each such iteration's first runstep.

Relative to the epoch: ``every="200est"`` on a step phase fires at the 200th, 400th...
step of each epoch (``state.epoch_step`` 199, 399, ...), counting anew in every epoch:
what a script writes as ``if (batch + 1) % 200 == 0``. Only step phases count steps of
an epoch; on another phase it is refused when the hook is registered.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from .options import Duration
from .phases import PHASES

if TYPE_CHECKING:
    from .hooks import Hook
    from .state import State
    from .table import HookTable

__all__ = ["check_unit", "make_filter", "moment_past", "past_once_hooks"]

Filter = Callable[[], bool]


class _Position:
    """True where ``test(position)`` holds, at most once per position (a skipped batch's
    ``step_start`` and the next batch's ask at one position)."""

    __slots__ = ("fired_at", "read", "test")

    def __init__(self, read: Callable[[], int], test: Callable[[int], bool]) -> None:
        self.read, self.test, self.fired_at = read, test, -1

    def __call__(self) -> bool:
        position = self.read()
        if position == self.fired_at or not self.test(position):
            return False
        self.fired_at = position
        return True


class _Crossing:
    """True when ``read()`` crossed a multiple of ``size`` since the last call (``once``:
    the first call at which it reached ``size``), counted from ``read()`` at creation."""

    __slots__ = ("done", "last", "once", "read", "size")

    def __init__(
        self, read: Callable[[], float], size: float, once: bool, from_zero: bool = False
    ) -> None:
        self.read, self.size, self.once = read, size, once
        # from_zero: a multiple reached at the first call counts (0: the first call fires)
        self.last = read() - 1e-9 if from_zero else read()
        # reached before this run (a run starting at it, as a fresh one at 0, reaches it)
        self.done = once and self.last > size

    def __call__(self) -> bool:
        now, last = self.read(), self.last
        self.last = now
        if self.done:
            return False
        crossed = now >= self.size if self.once else now // self.size > last // self.size
        self.done = self.once and crossed
        return crossed


def _counting(n: int, once: bool, shift: int) -> Callable[[int], bool]:
    """``once``: at position ``n``; else on the n-th, 2n-th, ... (positions n-1, 2n-1...;
    ``shift`` 0: positions 0, n, 2n..., ``from_zero``)."""
    return (lambda p: p == n) if once else (lambda p: (p + shift) % n == 0)


def check_unit(phase: str, duration: Duration, option: str) -> None:
    """Refuse a unit that ``phase`` cannot count: steps of the epoch (``"est"``) are
    counted by step phases only."""
    if duration.unit == "est" and PHASES[phase].scope != "step":
        steps = ", ".join(p for p, spec in PHASES.items() if spec.scope == "step")
        raise ValueError(
            f"{option}={duration.text!r} on phase {phase!r}: 'est' counts the "
            f"steps of each epoch, which only a step phase sees ({steps}); hook "
            f"one of those, or count epochs ('1ep') or the run's steps ('500st')"
        )


def make_filter(
    state: State, phase: str, duration: Duration, once: bool, from_zero: bool = False
) -> Filter:
    """The filter for ``every=duration`` (``once=duration`` if ``once``) on ``phase``;
    ``from_zero``: at positions 0, n, 2n... rather than n-1, 2n-1..."""
    scope, unit, n = PHASES[phase].scope, duration.unit, int(duration.amount)
    shift = 0 if from_zero else 1
    if unit == "est":  # the n-th, 2n-th, ... step of each epoch (a step phase: checked)
        return _Position(lambda: state.step, lambda _: (state.epoch_step + shift) % n == 0)
    if unit == "s":
        t0 = time.monotonic()
        return _Crossing(lambda: time.monotonic() - t0, duration.amount, once, from_zero)
    test = _counting(n, once, shift)
    if scope == "step" and unit in ("own", "st"):
        return _Position(lambda: state.step, test)
    if scope == "step" and unit == "it":
        if once:  # the first runstep of iteration n
            return _Position(lambda: state.iteration, test)
        # a window's last runstep (first, from_zero) whose iteration the test takes: in
        # padded runsteps, a multiple of k * n
        return _Position(
            lambda: state.step,
            lambda step: (step + state.window_padding + shift) % (state.accumulation * n) == 0,
        )
    if scope == "epoch" and unit in ("own", "ep"):
        return _Position(lambda: state.epoch, test)
    if scope == "step":  # epochs: the epoch's first step
        return _Position(lambda: state.step, lambda _: state.epoch_step == 0 and test(state.epoch))
    if phase == "epoch_end" and unit == "st":  # the steps of this epoch
        if once:
            return lambda: state.step - state.epoch_step <= n < state.step
        back = 1 - shift  # whether the epoch's steps a, ..., b - 1 hold a position it takes
        return lambda: (state.step - back) // n > (state.step - state.epoch_step - back) // n
    if scope in ("run", "eval") and unit == "own":
        events = [-1]  # the phase's own events in this run

        def count() -> int:
            events[0] += 1
            return events[0]

        return _Position(count, test)
    return _Crossing(_COUNTERS[unit](state), n, once, from_zero)


# what a crossing counts (from the run's start), by unit
_COUNTERS: dict[str, Callable[[State], Callable[[], int]]] = {
    "st": lambda state: lambda: state.step,
    "it": lambda state: lambda: state.iteration,
    "ep": lambda state: lambda: state.epoch,
}


def moment_past(phase: str, duration: Duration, state: State) -> bool:
    """Whether ``once=duration`` on ``phase`` can no longer fire in a run that starts at
    ``state``'s counters (a resumed run): its position lies before them. Mirrors
    ``make_filter``; a time (``"10min"``) and a run phase's own count start with each run
    and are never past."""
    scope, unit, n = PHASES[phase].scope, duration.unit, int(duration.amount)
    if unit == "s" or (scope in ("run", "eval") and unit == "own"):
        return False
    if scope == "step" and unit in ("own", "st"):
        return n < state.step
    if scope == "step" and unit == "it":
        return n < state.iteration
    if scope == "epoch" and unit in ("own", "ep"):
        return n < state.epoch
    if scope == "step":  # the first step of epoch n
        return n < state.epoch or (n == state.epoch and state.epoch_step > 0)
    if phase == "epoch_end" and unit == "st":  # within the epoch that ends
        return n < state.step - state.epoch_step
    # counted from the run's start (_Crossing): reached before this run
    return _COUNTERS[unit](state)() > n


def past_once_hooks(table: HookTable, state: State, phases: Iterable[str]) -> list[Hook]:
    """The ``once=`` hooks and overrides on ``phases`` that apply to a run of
    ``state.mode`` on ``state.rank`` and whose moment is past (``moment_past``)."""
    found = []
    for phase in phases:
        for hook in (*table.hooks[phase], *table.overrides.get(phase, ())):
            o = hook.options
            if (
                o.once is None
                or (o.modes is not None and state.mode not in o.modes)
                or (o.rank is not None and state.rank not in o.rank)
            ):
                continue
            if moment_past(phase, o.once, state):
                found.append(hook)
    return found

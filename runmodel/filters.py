"""Filters that count: ``every=`` and ``once=`` as functions of the run's counters."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["Duration", "make_counter", "parse_duration"]

_UNITS = {"ep": "ep", "epoch": "ep", "epochs": "ep", "st": "st", "step": "st", "steps": "st",
          "s": "s", "sec": "s", "min": "min", "h": "h"}
_SECONDS = {"s": 1.0, "min": 60.0, "h": 3600.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*$")


class Duration:
    """An amount of a unit: epochs (``"ep"``), steps (``"st"``), seconds (``"s"``)."""

    __slots__ = ("amount", "text", "unit")

    def __init__(self, amount: float, unit: str, text: str) -> None:
        self.amount, self.unit, self.text = amount, unit, text

    def __repr__(self) -> str:
        return self.text


def parse_duration(value: int | str, *, option: str, scope: str) -> Duration:
    """``3`` (three of the phase's own events), ``"2ep"``, ``"500st"``, ``"10min"``."""
    own = {"step": "st", "epoch": "ep", "run": "run"}[scope]
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"{option}= takes a positive int or a duration such as '2ep', "
                        f"'500st', '10min'; got {value!r}")
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"{option}= must be at least 1, got {value}")
        return Duration(value, own, str(value))
    match = _DURATION.match(value.lower())
    unit = _UNITS.get(match.group(2)) if match else None
    if unit is None:
        raise ValueError(f"{option}={value!r} is not a duration: write a number and a unit, "
                         f"one of ep, st, s, min, h (as in '2ep', '500st', '10min')")
    amount = float(match.group(1)) * _SECONDS.get(unit, 1.0)
    if unit in _SECONDS:
        unit = "s"
    elif amount != int(amount):
        raise ValueError(f"{option}={value!r}: epochs and steps are whole numbers")
    if amount <= 0:
        raise ValueError(f"{option}={value!r} must be more than zero")
    return Duration(amount, unit, value)


class _Multiple:
    """For a count in the phase's own unit: true at positions that are multiples of
    ``size`` (``once``: at position ``size`` only), at most once per position.

    The position is the 1-based number of the current step or epoch, read off the run's
    counters, so the answer is the same after a resume, or for a hook that joins mid-run,
    as in one straight run. Asking twice at one position (a skipped batch's step_start,
    then the next batch's) fires once.
    """

    __slots__ = ("fired_at", "once", "read", "size")

    def __init__(self, read: Callable[[], int], size: int, once: bool) -> None:
        self.read, self.size, self.once, self.fired_at = read, size, once, -1

    def __call__(self) -> bool:
        position = self.read()
        if position == self.fired_at or (
                position != self.size if self.once else position % self.size):
            return False
        self.fired_at = position
        return True


class _Crossing:
    """For a duration in another unit than the phase's own (``"500st"`` on epoch_end,
    ``"1ep"`` on runstep) or in seconds: true when a multiple of ``size`` was reached
    since this filter's last event; for ``once``, the first time ``size`` is reached."""

    __slots__ = ("last", "once", "read", "size")

    def __init__(self, read: Callable[[], float], size: float, start: float, once: bool) -> None:
        self.read, self.size, self.once = read, size, once
        self.last = start // size
        if once and self.last >= 1:
            self.last = math.inf  # reached before this run (a resume): never again

    def __call__(self) -> bool:
        bucket = self.read() // self.size
        if bucket <= self.last:
            return False
        self.last = math.inf if self.once else bucket
        return True


def make_counter(engine: Engine, scope: str, duration: Duration,
                 once: bool) -> _Multiple | _Crossing:
    """The filter for ``every=``/``once=``, reading the run's counters."""
    state, unit, size = engine.state, duration.unit, duration.amount
    if unit == "s":
        t0 = time.monotonic()
        return _Crossing(lambda: time.monotonic() - t0, size, 0.0, once)
    if unit == "run":
        count = [0]

        def read() -> int:
            count[0] += 1
            return count[0]

        return _Multiple(read, int(size), once)
    if unit == "st":
        if scope == "step":
            return _Multiple(lambda: state.step + 1, int(size), once)
        return _Crossing(lambda: state.step, size, state.step, once)
    if scope == "epoch":
        return _Multiple(lambda: state.epoch + 1, int(size), once)
    inside = 1 if scope == "step" else 0
    return _Crossing(lambda: state.epoch + inside, size, state.epoch, once)

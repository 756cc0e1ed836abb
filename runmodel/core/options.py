"""What a hook registration may say, as one checked, frozen value: ``HookOptions``.

``engine.on``, ``engine.override``, ``@runmodel.hook`` and ``@runmodel.override`` all
build their options with ``HookOptions.of(...)``, so every option is checked in one place,
when it is written (registration, or class definition for a pack), never at step 10,000.
Each error says what was wrong and what would be right.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import CodeType
from typing import TYPE_CHECKING, Any, TypedDict

from .checks import did_you_mean, is_whole_number
from .phases import MODES, PHASES

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "ARGS",
    "Duration",
    "HookArgs",
    "HookOptions",
    "check_phase",
    "check_signature",
    "code_of",
    "describe_fn",
    "metric_names",
    "parse_duration",
    "source_of",
]

#: What a hook (False) and an override (True) are called with.
ARGS = {False: ("engine",), True: ("engine", "default")}


class HookArgs(TypedDict, total=False):
    """The options as written: ``engine.on(phase, fn, **HookArgs)``."""

    priority: float
    before: str | Iterable[str] | None
    after: str | Iterable[str] | None
    every: int | str | None
    from_zero: bool
    once: bool | int | str | None
    when: Callable[[Any], bool] | None
    modes: str | Iterable[str] | None
    rank: int | Iterable[int] | None
    name: str | None
    reads: str | Iterable[str] | None
    writes: str | Iterable[str] | None


@dataclass(frozen=True, slots=True)
class Duration:
    """An amount of a unit. ``"own"`` counts the phase's own events (``every=3``) or is a
    position in the phase's own counter (``once=3``); ``"ep"`` epochs, ``"st"`` steps,
    ``"it"`` iterations (optimizer steps: ``state.iteration``), ``"est"`` steps of each
    epoch (``state.epoch_step``, from 0 again in every epoch), ``"s"`` seconds of
    wall-clock time."""

    amount: float
    unit: str
    text: str

    def __repr__(self) -> str:
        return self.text


@dataclass(frozen=True, slots=True)
class HookOptions:
    """How a hook is ordered and filtered. Make it with ``HookOptions.of(...)``, which
    checks every option and puts it in one form (names as tuples, durations parsed)."""

    priority: float = 0
    before: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    every: Duration | None = None
    # every= counts positions 0, N, 2N... (a script's `if i % N == 0`), not N-1, 2N-1...
    from_zero: bool = False
    once: Duration | None = None
    when: Callable[[Any], bool] | None = None
    modes: frozenset[str] | None = None
    rank: frozenset[int] | None = None
    name: str | None = None
    # the metrics (keys of state.metrics) the hook reads and writes: checked at setup
    # (writes None: not declared; the hook may write any)
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] | None = None

    @classmethod
    def of(cls, **args: Unpack[HookArgs]) -> HookOptions:
        """Check the options as a user writes them; see ``docs/hooks.md``."""
        unknown = [key for key in args if key not in _FIELDS]
        if unknown:
            raise TypeError(
                f"unknown hook option {unknown[0]!r}."
                f"{did_you_mean(unknown[0], _FIELDS)} Options: {', '.join(_FIELDS)}"
            )
        priority = args.get("priority", 0)
        if isinstance(priority, bool) or not isinstance(priority, (int, float)):
            raise TypeError(f"priority= must be a number (higher runs first), got {priority!r}")
        if not math.isfinite(priority):
            raise ValueError(f"priority= must be a finite number, got {priority!r}")
        every, once = args.get("every"), args.get("once")
        if once is False:
            once = None
        if every is not None and once is not None:
            raise ValueError(
                "every= and once= exclude each other: every= fires repeatedly, "
                "once= fires a single time; give one of them"
            )
        from_zero = args.get("from_zero", False)
        if not isinstance(from_zero, bool):
            raise TypeError(f"from_zero= must be True or False, got {from_zero!r}")
        if from_zero and every is None:
            raise ValueError(
                "from_zero=True says where every= counts from (positions 0, N, 2N... "
                "instead of N-1, 2N-1...); give it with every="
            )
        when = args.get("when")
        if when is not None:
            check_signature(when, ("engine",), "when=")
        name = args.get("name")
        if name is not None and (not isinstance(name, str) or not name):
            raise TypeError(f"name= must be a non-empty string, got {name!r}")
        return cls(
            priority=priority,
            before=_names(args.get("before"), "before"),
            after=_names(args.get("after"), "after"),
            every=None if every is None else parse_duration(every, "every"),
            from_zero=from_zero,
            once=None if once is None else parse_duration(once, "once"),
            when=when,
            modes=_modes(args.get("modes")),
            rank=_ranks(args.get("rank")),
            name=name,
            reads=metric_names(args.get("reads"), "reads"),
            writes=None
            if args.get("writes") is None
            else metric_names(args.get("writes"), "writes"),
        )

    def replace(self, **changes: Any) -> HookOptions:
        """A copy with some fields changed (already in their checked form)."""
        return dataclasses.replace(self, **changes)

    def filter_text(self) -> str:
        """The filters, as ``describe()`` shows them."""
        parts = [
            f"every={self.every}" if self.every else "",
            "from_zero" if self.from_zero else "",
            f"once={self.once}" if self.once else "",
            f"when={describe_fn(self.when)}" if self.when else "",
            f"modes={','.join(sorted(self.modes))}" if self.modes else "",
            f"rank={','.join(map(str, sorted(self.rank)))}" if self.rank else "",
        ]
        return " ".join(p for p in parts if p) or "-"


_FIELDS = tuple(f.name for f in dataclasses.fields(HookOptions))

# -- durations ---------------------------------------------------------------------------

_UNITS = {
    "ep": "ep",
    "epoch": "ep",
    "epochs": "ep",
    "st": "st",
    "step": "st",
    "steps": "st",
    "it": "it",
    "iter": "it",
    "iters": "it",
    "iteration": "it",
    "iterations": "it",
    "est": "est",
    "epoch_step": "est",
    "epoch_steps": "est",
    "s": "s",
    "sec": "s",
    "min": "min",
    "h": "h",
}
_SECONDS = {"s": 1.0, "min": 60.0, "h": 3600.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z_]+)\s*$")


def parse_duration(value: bool | int | str | Duration, option: str) -> Duration:
    """``every=``: ``3`` (every third event of the phase), ``"2ep"``, ``"500st"``,
    ``"250it"`` (iterations: optimizer steps), ``"200est"`` (the 200th, 400th... step of
    each epoch), ``"10min"``. ``once=``: a position in the run's own counters, from 0
    like them (``2``: the phase's own counter at 2; ``"2ep"``: at epoch 2; ``True``: the
    first)."""
    if isinstance(value, Duration):
        return value
    position = option == "once"
    if value is True and position:
        return Duration(0, "own", "first")
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"{option}= takes {_FORMS[option]}; got {value!r}")
    least = 0 if position else 1
    if isinstance(value, int):
        if value < least:
            raise ValueError(f"{option}= must be at least {least}, got {value}")
        return Duration(value, "own", str(value))
    match = _DURATION.match(value.lower())
    unit = _UNITS.get(match.group(2)) if match else None
    if match is None or unit is None:
        raise ValueError(
            f"{option}={value!r} is not a duration: write a number and a unit, "
            f"one of ep, st, s, min, h, it for iterations (optimizer steps), or "
            f"est for the steps of each epoch (as in '2ep', '500st', '10min', "
            f"'250it', '200est')"
        )
    if position and unit == "est":
        raise ValueError(
            f"{option}={value!r}: 'est' counts the steps of each epoch anew, so "
            f"it names a moment of every epoch, not one of the run; write "
            f"every={value!r} to fire at every epoch's steps {match.group(1)}, "
            f"{2 * int(match.group(1))}, ..., or a position in the run such as "
            f"once='{match.group(1)}st'"
        )
    amount = float(match.group(1)) * _SECONDS.get(unit, 1.0)
    if unit in _SECONDS:
        unit = "s"
    elif amount != int(amount):
        raise ValueError(
            f"{option}={value!r}: epochs and steps are whole numbers, and so are iterations"
        )
    if amount < least or (unit == "s" and amount <= 0):
        least_text = "at least 0" if position and unit != "s" else "more than zero"
        raise ValueError(f"{option}={value!r} must be {least_text}")
    return Duration(amount, unit, value)


_FORMS = {
    "every": "a positive int or a duration such as '2ep', '500st', '250it', '200est', '10min'",
    "once": "a position such as 2 (the phase's own counter), '2ep', '500st', '1000it', a time "
    "such as '10min', or True (the first)",
}

# -- the other options --------------------------------------------------------------------


def _items(value: object, option: str, wanted: str) -> tuple[Any, ...]:
    if isinstance(value, (str, int)):
        return (value,)
    if isinstance(value, (list, tuple, set, frozenset)):
        return tuple(value)
    raise TypeError(f"{option}= takes {wanted}, got {value!r}")


def _names(value: str | Iterable[str] | None, option: str) -> tuple[str, ...]:
    if value is None:
        return ()
    items = _items(value, option, "a hook name or a list of names")
    if not items or not all(isinstance(v, str) and v for v in items):
        raise TypeError(f"{option}= takes a hook name or a list of names, got {value!r}")
    return items


def metric_names(value: str | Iterable[str] | None, option: str) -> tuple[str, ...]:
    """Metric names as declared (``reads=``/``writes=``): one name or several."""
    if value is None:
        return ()
    items = (
        (value,)
        if isinstance(value, str)
        else (tuple(value) if isinstance(value, (list, tuple, set, frozenset)) else None)
    )
    if items is None or not all(isinstance(v, str) and v for v in items):
        raise TypeError(
            f"{option}= takes a metric name (a key of state.metrics, such as "
            f"'eval_loss') or a list of them, got {value!r}"
        )
    return tuple(dict.fromkeys(items))


def _modes(value: str | Iterable[str] | None) -> frozenset[str] | None:
    if value is None:
        return None
    modes = frozenset(_items(value, "modes", f"a mode or a set of modes ({', '.join(MODES)})"))
    unknown = sorted(m for m in modes if m not in MODES)
    if unknown or not modes:
        raise ValueError(f"modes={value!r}: unknown mode(s) {unknown}; valid: {', '.join(MODES)}")
    return modes


def _ranks(value: int | Iterable[int] | None) -> frozenset[int] | None:
    if value is None:
        return None
    ranks = _items(value, "rank", "a process rank (an int >= 0) or a list of them")
    if not ranks or not all(is_whole_number(r) for r in ranks):
        raise ValueError(f"rank={value!r}: give a process rank (an int >= 0) or a list of them")
    return frozenset(ranks)


# -- phases and functions ------------------------------------------------------------------


def check_phase(phase: object, *, override: bool) -> str:
    """``phase`` if it names a phase (with an action, for an override)."""
    if not isinstance(phase, str) or phase not in PHASES:
        valid = [p for p, spec in PHASES.items() if spec.has_action or not override]
        raise ValueError(
            f"unknown phase {phase!r}.{did_you_mean(phase, valid)} Valid phases: {', '.join(valid)}"
        )
    if override and not PHASES[phase].has_action:
        with_action = [p for p, spec in PHASES.items() if spec.has_action]
        raise ValueError(
            f"phase {phase!r} has no action to override; phases with an "
            f"action: {', '.join(with_action)}. Use engine.on({phase!r}) for a hook"
        )
    return phase


def check_signature(fn: Callable[..., Any], args: tuple[str, ...], what: str) -> None:
    """``fn`` must accept exactly the positional ``args`` it will be called with."""
    if not callable(fn):
        raise TypeError(f"{what} must be callable, got {type(fn).__name__} {fn!r}")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have no signature; trust them
        return
    try:
        sig.bind(*args)
    except TypeError:
        raise TypeError(
            f"{what} {describe_fn(fn)} has signature {sig}, but it is called "
            f"as fn({', '.join(args)})"
        ) from None


def describe_fn(fn: object) -> str:
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    return name.rpartition("<locals>.")[2]  # "main.<locals>.report" reads as "report"


def code_of(fn: object) -> CodeType | None:
    """The code object that runs when ``fn`` is called, where there is one."""
    target = inspect.unwrap(getattr(fn, "__func__", fn))  # type: ignore[arg-type]
    code = getattr(target, "__code__", None)
    if code is None and callable(target):
        code = getattr(type(target).__call__, "__code__", None)
    return code


def source_of(fn: Callable[..., Any]) -> str:
    code = code_of(fn)
    return "?" if code is None else f"{code.co_filename}:{code.co_firstlineno}"

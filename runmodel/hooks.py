"""Hooks: what a registration says, checked at once; the order it resolves to; packs.

Everything a user can get wrong about a hook is rejected here, when it is registered
(or when a pack method is decorated), never at step 10,000. Order and filters are
prepared when hooks change or a run starts, so dispatch is a loop over a tuple.
"""

from __future__ import annotations

import difflib
import heapq
import inspect
import math
import re
import time
from collections.abc import Callable, Iterable, Iterator
from types import CodeType
from typing import TYPE_CHECKING, Any

from .phases import MODES, PHASES

if TYPE_CHECKING:
    from .engine import Engine

__all__ = [
    "Duration",
    "Hook",
    "HookHandle",
    "HookOrderError",
    "Pack",
    "hook",
    "override",
    "parse_duration",
]

HookFn = Callable[["Engine"], Any]
OverrideFn = Callable[["Engine", Callable[["Engine"], Any]], Any]


class HookOrderError(ValueError):
    """The before/after constraints of a phase form a cycle."""


# -- durations -------------------------------------------------------------------------

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


def _counter(engine: Engine, scope: str, duration: Duration, once: bool) -> _Multiple | _Crossing:
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


# -- one registration ------------------------------------------------------------------

def _check_phase(phase: object, *, override: bool) -> str:
    if not isinstance(phase, str) or phase not in PHASES:
        valid = [p for p, spec in PHASES.items() if spec.has_action or not override]
        close = difflib.get_close_matches(str(phase), valid, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown phase {phase!r}.{hint} Valid phases: {', '.join(valid)}")
    if override and not PHASES[phase].has_action:
        with_action = [p for p, spec in PHASES.items() if spec.has_action]
        raise ValueError(f"phase {phase!r} has no action to override; phases with an "
                         f"action: {', '.join(with_action)}. Use engine.on({phase!r}) for a hook")
    return phase


def _check_signature(fn: Callable[..., Any], args: tuple[str, ...], what: str) -> None:
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
        raise TypeError(f"{what} {_describe_fn(fn)} has signature {sig}, but it is called "
                        f"as fn({', '.join(args)})") from None


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
    if not ranks or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0
                            for r in ranks):
        raise ValueError(f"rank={value!r}: give a process rank (an int >= 0) or a list of them")
    return frozenset(ranks)


def _describe_fn(fn: object) -> str:
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    return name.rpartition("<locals>.")[2]  # "main.<locals>.report" reads as "report"


def _code(fn: object) -> CodeType | None:
    """The code object that runs when ``fn`` is called, where there is one."""
    target = inspect.unwrap(getattr(fn, "__func__", fn))
    code = getattr(target, "__code__", None)
    if code is None and callable(target):
        code = getattr(type(target).__call__, "__code__", None)
    return code


def _source(fn: Callable[..., Any]) -> str:
    code = _code(fn)
    return "?" if code is None else f"{code.co_filename}:{code.co_firstlineno}"


_ARGS = {False: ("engine",), True: ("engine", "default")}


class Hook:
    """One checked registration: a function on a phase, with its order and filters."""

    __slots__ = ("after", "before", "compiled", "every", "fn", "modes", "name", "once", "override",
                 "pack", "phase", "priority", "ranks", "seq", "source", "when")

    def __init__(self, fn: Callable[..., Any], phase: str, *, override: bool = False,
                 priority: float = 0, before: str | Iterable[str] | None = None,
                 after: str | Iterable[str] | None = None, every: int | str | None = None,
                 once: bool | int | str | None = None, when: Callable[[Engine], bool] | None = None,
                 modes: str | Iterable[str] | None = None, rank: int | Iterable[int] | None = None,
                 name: str | None = None, pack: Pack | None = None) -> None:
        self.phase = _check_phase(phase, override=override)
        self.override = override
        _check_signature(fn, _ARGS[override], "an override" if override else "a hook")
        if isinstance(priority, bool) or not isinstance(priority, (int, float)):
            raise TypeError(f"priority= must be a number (higher runs first), got {priority!r}")
        if not math.isfinite(priority):
            raise ValueError(f"priority= must be a finite number, got {priority!r}")
        if once is False:
            once = None
        if every is not None and once is not None:
            raise ValueError("every= and once= exclude each other: every= fires repeatedly, "
                             "once= fires a single time; give one of them")
        if when is not None:
            _check_signature(when, ("engine",), "when=")
        if name is not None and (not isinstance(name, str) or not name):
            raise TypeError(f"name= must be a non-empty string, got {name!r}")
        scope = PHASES[phase].scope
        self.fn, self.pack, self.priority, self.when = fn, pack, priority, when
        self.name = name or _describe_fn(fn)
        self.before, self.after = _names(before, "before"), _names(after, "after")
        self.every = None if every is None else parse_duration(every, option="every", scope=scope)
        self.once = None if once is None else parse_duration(
            1 if once is True else once, option="once", scope=scope)
        self.modes, self.ranks = _modes(modes), _ranks(rank)
        self.source = _source(fn)
        self.seq = 0
        self.compiled: Callable[..., Any] | None = None

    def prepare(self, engine: Engine, mode: str, rank: int) -> None:
        """Build what dispatch calls in this run: the bare function when no filter needs
        checking per event, a filtering wrapper when one does, or nothing at all."""
        fn = self.fn
        if (self.modes is not None and mode not in self.modes) or (
                self.ranks is not None and rank not in self.ranks):
            self.compiled = None
            return
        counter = self.every or self.once
        crossing = counter and _counter(engine, PHASES[self.phase].scope, counter,
                                        once=self.once is not None)
        when = self.when
        if not crossing and when is None:
            self.compiled = fn
        elif self.override:
            def filtered_override(engine: Engine, default: Callable[[Engine], Any]) -> Any:
                if (not crossing or crossing()) and (when is None or when(engine)):
                    return fn(engine, default)
                return default(engine)
            self.compiled = filtered_override
        else:
            def filtered(engine: Engine) -> Any:
                if (not crossing or crossing()) and (when is None or when(engine)):
                    return fn(engine)
                return None
            self.compiled = filtered

    def filter_text(self) -> str:
        parts = [f"every={self.every}" if self.every else "",
                 f"once={self.once}" if self.once else "",
                 f"when={_describe_fn(self.when)}" if self.when else "",
                 f"modes={','.join(sorted(self.modes))}" if self.modes else "",
                 f"rank={','.join(map(str, sorted(self.ranks)))}" if self.ranks else ""]
        return " ".join(p for p in parts if p) or "-"


def resolve_order(hooks: list[Hook]) -> list[Hook]:
    """Order one phase's hooks: before/after constraints first, then higher priority,
    then registration order. A constraint naming an absent hook waits for it."""
    by_name: dict[str, list[int]] = {}
    for i, h in enumerate(hooks):
        by_name.setdefault(h.name, []).append(i)
    successors: list[set[int]] = [set() for _ in hooks]
    for i, h in enumerate(hooks):
        for other in h.before:
            successors[i].update(by_name.get(other, ()))
        for other in h.after:
            for j in by_name.get(other, ()):
                successors[j].add(i)
    indegree = [0] * len(hooks)
    for succ in successors:
        for j in succ:
            indegree[j] += 1
    ready = [(-h.priority, h.seq, i) for i, h in enumerate(hooks) if indegree[i] == 0]
    heapq.heapify(ready)
    order: list[Hook] = []
    while ready:
        *_, i = heapq.heappop(ready)
        order.append(hooks[i])
        for j in successors[i]:
            indegree[j] -= 1
            if indegree[j] == 0:
                heapq.heappush(ready, (-hooks[j].priority, hooks[j].seq, j))
    if len(order) < len(hooks):
        raise HookOrderError(_cycle_text(hooks, successors, indegree))
    return order


def _cycle_text(hooks: list[Hook], successors: list[set[int]], indegree: list[int]) -> str:
    # Every hook left has a predecessor that is also left, so walking back finds a cycle.
    left = {i for i, d in enumerate(indegree) if d > 0}
    predecessor = {j: i for i in left for j in successors[i] if j in left}
    path, node = [], next(iter(left))
    while node not in path:
        path.append(node)
        node = predecessor[node]
    cycle = [*path[path.index(node):], node][::-1]
    chain = " -> ".join(repr(hooks[i].name) for i in cycle)
    return (f"hook order on phase {hooks[0].phase!r} has a cycle: {chain} "
            f"(each must run before the next); drop one of these before=/after= constraints")


# -- handles ---------------------------------------------------------------------------

class HookHandle:
    """What registering returns: ``detach()`` removes it again; usable as a context
    manager; a handle for one function can still be called like that function."""

    __slots__ = ("_engine", "fn", "hooks", "packs")

    def __init__(self, engine: Engine, hooks: list[Hook], fn: Callable[..., Any] | None = None,
                 packs: tuple[Pack, ...] = ()) -> None:
        self._engine, self.hooks, self.fn, self.packs = engine, hooks, fn, packs

    @property
    def attached(self) -> bool:
        return self._engine._is_attached(self)

    def detach(self) -> None:
        """Remove these hooks (and packs); detaching twice is harmless."""
        self._engine._detach(self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.fn is None:
            raise TypeError("a handle for attached packs is not callable")
        return self.fn(*args, **kwargs)

    def __enter__(self) -> HookHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def __repr__(self) -> str:
        names = ", ".join(f"{h.phase}:{h.name}" for h in self.hooks)
        return f"<HookHandle {names} {'attached' if self.attached else 'detached'}>"


# -- packs -----------------------------------------------------------------------------

_MARK = "__runmodel_hooks__"


def _mark(phase: str | None, override: bool, options: dict[str, Any]) -> Callable[[Any], Any]:
    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        target = phase or getattr(fn, "__name__", None)
        _check_phase(target, override=override)
        # Check the method and every option now, not when the pack is attached.
        _check_signature(fn, ("self", *_ARGS[override]), "a pack method")
        Hook(lambda *args: None, target, override=override, **options)
        fn.__dict__.setdefault(_MARK, []).append((target, override, options))
        return fn
    return decorate


def hook(phase: str | None = None, **options: Any) -> Callable[[Any], Any]:
    """Set a pack method's hook options (``priority``, ``every``, ``before``, ...).

    A method named after a phase is a hook already; ``phase=`` lets a method of any
    name hook a phase. Decorating twice hooks the method on two phases.
    """
    return _mark(phase, False, options)


def override(phase: str, **options: Any) -> Callable[[Any], Any]:
    """Make a pack method ``(self, engine, default)`` an override of ``phase``'s action."""
    return _mark(phase, True, options)


class Pack:
    """A reusable bundle of hooks with its own state.

    Methods named after phases are hooks; ``@runmodel.hook(...)`` and
    ``@runmodel.override(...)`` mark others or set options. Packs held in attributes
    (directly or in a list or tuple) are attached and detached with their holder.
    ``state_dict``/``load_state_dict`` are collected by ``engine.state_dict()``.
    """

    name: str | None = None

    def hooks(self) -> Iterator[Hook]:
        """This pack's own hooks (not its children's), in definition order."""
        seen: set[str] = set()
        label = self.name or type(self).__name__
        for cls in reversed(type(self).__mro__):
            for attr, value in vars(cls).items():
                if attr in seen or attr.startswith("__"):
                    continue
                marks = getattr(value, _MARK, None)
                if marks is None and attr in PHASES and callable(value):
                    marks = [(attr, False, {})]
                if not marks:
                    continue
                seen.add(attr)
                method = getattr(self, attr)
                for phase, is_override, options in marks:
                    options = {"name": f"{label}.{attr}", **options}
                    yield Hook(method, phase, override=is_override, pack=self, **options)

    def children(self) -> list[Pack]:
        """Packs this one holds: attributes that are packs, or lists/tuples of packs."""
        found: list[Pack] = []
        for value in vars(self).values():
            items = value if isinstance(value, (list, tuple)) else (value,)
            found.extend(v for v in items if isinstance(v, Pack))
        return found

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of this pack; empty unless the pack has state."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""

"""Hooks: what a registration says, checked at once; the order it resolves to; handles.

Everything a user can get wrong about a hook is rejected here, when it is registered
(or when a pack method is decorated), never at step 10,000. Order and filters are
prepared when hooks change or a run starts, so dispatch is a loop over a tuple.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from .filters import make_counter, parse_duration
from .phases import PHASES
from .validate import (
    ARGS,
    check_phase,
    check_signature,
    describe_fn,
    modes_of,
    names_of,
    ranks_of,
    source_of,
)

if TYPE_CHECKING:
    from .engine import Engine
    from .pack import Pack

__all__ = ["Hook", "HookHandle", "HookOrderError", "resolve_order"]

class HookOrderError(ValueError):
    """The before/after constraints of a phase form a cycle."""


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
        self.phase = check_phase(phase, override=override)
        self.override = override
        check_signature(fn, ARGS[override], "an override" if override else "a hook")
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
            check_signature(when, ("engine",), "when=")
        if name is not None and (not isinstance(name, str) or not name):
            raise TypeError(f"name= must be a non-empty string, got {name!r}")
        scope = PHASES[phase].scope
        self.fn, self.pack, self.priority, self.when = fn, pack, priority, when
        self.name = name or describe_fn(fn)
        self.before, self.after = names_of(before, "before"), names_of(after, "after")
        self.every = None if every is None else parse_duration(every, option="every", scope=scope)
        self.once = None if once is None else parse_duration(
            1 if once is True else once, option="once", scope=scope)
        self.modes, self.ranks = modes_of(modes), ranks_of(rank)
        self.source = source_of(fn)
        self.seq = 0
        self.compiled: Callable[..., Any] | None = None

    def prepare(self, engine: Engine, mode: str, rank: int,
                wrap: Callable[[Hook, Callable[..., Any]], Callable[..., Any]] | None = None
                ) -> None:
        """Build what dispatch calls in this run: the bare function when no filter needs
        checking per event, a filtering wrapper when one does, or nothing at all; ``wrap``
        (profile mode's timer) goes around it."""
        self._compile(engine, mode, rank)
        if wrap is not None and self.compiled is not None:
            self.compiled = wrap(self, self.compiled)

    def _compile(self, engine: Engine, mode: str, rank: int) -> None:
        fn = self.fn
        if (self.modes is not None and mode not in self.modes) or (
                self.ranks is not None and rank not in self.ranks):
            self.compiled = None
            return
        counter = self.every or self.once
        crossing = counter and make_counter(engine, PHASES[self.phase].scope, counter,
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
                 f"when={describe_fn(self.when)}" if self.when else "",
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

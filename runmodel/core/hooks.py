"""A registered hook, the order of a phase's hooks, and the handle that detaches them."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .filters import check_unit, make_filter
from .options import ARGS, HookOptions, check_phase, check_signature, describe_fn, source_of

if TYPE_CHECKING:
    from .pack import Pack
    from .state import State

__all__ = ["Hook", "HookHandle", "HookOrderError", "resolve_order"]

_DEFAULT = HookOptions()


class HookOrderError(ValueError):
    """The before/after constraints of a phase form a cycle."""


class Hook:
    """One registration: ``fn`` on ``phase`` (an override of its action if ``override``),
    with its options; ``pack`` is set when a pack is attached. Checked when made."""

    __slots__ = ("fn", "name", "options", "override", "pack", "phase", "seq", "source")

    def __init__(
        self,
        fn: Callable[..., Any],
        phase: str,
        options: HookOptions = _DEFAULT,
        *,
        override: bool = False,
        pack: Pack | None = None,
    ) -> None:
        self.phase = check_phase(phase, override=override)
        check_signature(fn, ARGS[override], "an override" if override else "a hook")
        if options.every is not None:
            check_unit(phase, options.every, "every")
        self.fn, self.options, self.override, self.pack = fn, options, override, pack
        self.name = options.name or describe_fn(fn)
        self.source = source_of(fn)
        self.seq = 0  # registration order, set by the engine

    def compile(self, state: State, mode: str, rank: int) -> Callable[..., Any] | None:
        """What dispatch calls in a run of ``mode`` on process ``rank``: the bare function
        when no filter needs checking per event, a filtering wrapper when one does, or
        ``None`` when the hook does not apply to this run."""
        o, fn = self.options, self.fn
        if (o.modes is not None and mode not in o.modes) or (
            o.rank is not None and rank not in o.rank
        ):
            return None
        counter = o.every or o.once
        crossing = counter and make_filter(
            state, self.phase, counter, once=o.once is not None, from_zero=o.from_zero
        )
        when = o.when
        if not crossing and when is None:
            return fn
        if self.override:

            def filtered_override(engine: Any, default: Callable[[Any], Any]) -> Any:
                if (not crossing or crossing()) and (when is None or when(engine)):
                    return fn(engine, default)
                return default(engine)

            return filtered_override

        def filtered(engine: Any) -> Any:
            if (not crossing or crossing()) and (when is None or when(engine)):
                return fn(engine)
            return None

        return filtered

    def __repr__(self) -> str:
        kind = "override" if self.override else "hook"
        return f"<{kind} {self.name!r} on {self.phase!r}>"


def resolve_order(hooks: list[Hook]) -> list[Hook]:
    """Order one phase's hooks: before/after constraints first, then higher priority,
    then registration order. A constraint naming an absent hook waits for it."""
    by_name: dict[str, list[int]] = {}
    for i, h in enumerate(hooks):
        by_name.setdefault(h.name, []).append(i)
    successors: list[set[int]] = [set() for _ in hooks]
    for i, h in enumerate(hooks):
        for other in h.options.before:
            successors[i].update(by_name.get(other, ()))
        for other in h.options.after:
            for j in by_name.get(other, ()):
                successors[j].add(i)
    indegree = [0] * len(hooks)
    for succ in successors:
        for j in succ:
            indegree[j] += 1
    ready = [(-h.options.priority, h.seq, i) for i, h in enumerate(hooks) if indegree[i] == 0]
    heapq.heapify(ready)
    order: list[Hook] = []
    while ready:
        *_, i = heapq.heappop(ready)
        order.append(hooks[i])
        for j in successors[i]:
            indegree[j] -= 1
            if indegree[j] == 0:
                heapq.heappush(ready, (-hooks[j].options.priority, hooks[j].seq, j))
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
    cycle = [*path[path.index(node) :], node][::-1]
    chain = " -> ".join(repr(hooks[i].name) for i in cycle)
    return (
        f"hook order on phase {hooks[0].phase!r} has a cycle: {chain} "
        f"(each must run before the next); drop one of these before=/after= constraints"
    )


class HookHandle:
    """What registering returns: ``detach()`` removes it again; usable as a context
    manager; a handle for one function can still be called like that function."""

    __slots__ = ("_detach", "_is_attached", "fn", "hooks", "packs")

    def __init__(
        self,
        hooks: list[Hook],
        detach: Callable[[HookHandle], None],
        is_attached: Callable[[HookHandle], bool],
        fn: Callable[..., Any] | None = None,
        packs: tuple[Pack, ...] = (),
    ) -> None:
        self.hooks, self.fn, self.packs = hooks, fn, packs
        self._detach, self._is_attached = detach, is_attached

    @property
    def attached(self) -> bool:
        return self._is_attached(self)

    def detach(self) -> None:
        """Remove these hooks (and packs); detaching twice is harmless."""
        self._detach(self)

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

"""The hook table: every phase's hooks and overrides in their resolved order, and the
dispatch built from them for a run.

Dispatch is what the loop calls: per phase one ``fire(engine)`` callable that runs the
phase's action through its override chain (action phases) and then its hooks. It is
rebuilt whenever hooks change, never per call: a phase with no hooks and no overrides
fires its bare action, a hook phase without hooks is ``None``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .hooks import Hook, HookHandle, resolve_order
from .pack import Pack, attach_site, check_repeats, flatten_packs, pack_hooks
from .phases import ACTION_PHASES, PHASES
from .plan import Action, StepPlan, Wrapper
from .where import Where

if TYPE_CHECKING:
    from .state import State

__all__ = ["Dispatch", "HookTable"]


class Dispatch:
    """Per phase, ``fire(engine)``: the phase's action chain, then its hooks; ``None``
    for a phase with nothing to do. ``hooks`` holds each phase's hooks alone (teardown
    calls each even if one raises)."""

    __slots__ = (*PHASES, "hooks")
    setup: Action | None
    epoch_start: Action | None
    step_start: Action | None
    runstep: Action
    forward: Action
    backward: Action
    optimizer_step: Action
    epoch_end: Action | None
    eval_start: Action | None
    eval_end: Action | None
    exception: Action | None
    teardown: Action | None

    def __init__(self) -> None:
        for phase in PHASES:
            setattr(self, phase, None)
        self.hooks: dict[str, tuple[Action, ...]] = {p: () for p in PHASES}


@dataclass
class _Run:
    state: State
    plan: StepPlan


class HookTable:
    """Hooks and overrides per phase, kept in their resolved order; the packs attached;
    while a run is on, its dispatch."""

    def __init__(self) -> None:
        self.hooks: dict[str, list[Hook]] = {p: [] for p in PHASES}
        self.overrides: dict[str, list[Hook]] = {p: [] for p in ACTION_PHASES}
        self.packs: dict[str, Pack] = {}
        self.attached_at: dict[int, str] = {}  # id(pack): file:line of its attach
        self.dispatch = Dispatch()
        self.where = Where()
        self.wrappers: list[Wrapper] = []  # engine.instrument(): around hooks and phases
        self._seq = itertools.count()
        self._run: _Run | None = None
        self._compiled: dict[Hook, Callable[..., Any] | None] = {}

    def _list(self, hook: Hook) -> list[Hook]:
        return (self.overrides if hook.override else self.hooks)[hook.phase]

    def add(
        self, hooks: list[Hook], fn: Callable[..., Any] | None = None, packs: tuple[Pack, ...] = ()
    ) -> HookHandle:
        """Register ``hooks``; a cycle in their order leaves the table as it was."""
        for h in hooks:
            h.seq = next(self._seq)
            self._list(h).append(h)
        try:
            self._reorder(hooks)
        except Exception:
            for h in hooks:
                self._list(h).remove(h)
            raise
        return HookHandle(hooks, self._detach, self._holds, fn, packs)

    def attach(self, packs: Iterable[Pack]) -> HookHandle:
        """Register packs and the packs they hold, as one unit."""
        flat = flatten_packs(packs, taken=set(self.packs))
        seen = {id(p): k for k, p in self.packs.items()}
        for key, pack in flat:
            if id(pack) in seen:
                raise ValueError(
                    f"this {type(pack).__name__} pack is attached already, as "
                    f"{seen[id(pack)]!r}; make a new instance to use a pack twice"
                )
            seen[id(pack)] = key
        site = attach_site()
        check_repeats(flat, self.packs, self.attached_at, site)
        handle = self.add(
            [h for _, p in flat for h in pack_hooks(p)], packs=tuple(p for _, p in flat)
        )
        self.packs.update(flat)
        self.attached_at.update((id(p), site) for _, p in flat)
        return handle

    def _detach(self, handle: HookHandle) -> None:
        hooks = [h for h in handle.hooks if h in self._list(h)]
        for h in hooks:
            self._list(h).remove(h)
            self._compiled.pop(h, None)
        self._reorder(hooks)
        for key in [k for k, p in self.packs.items() if p in handle.packs]:
            self.attached_at.pop(id(self.packs.pop(key)), None)

    def _holds(self, handle: HookHandle) -> bool:
        return any(h in self._list(h) for h in handle.hooks)

    def _reorder(self, changed: list[Hook]) -> None:
        for phase, is_override in {(h.phase, h.override) for h in changed}:
            hooks = (self.overrides if is_override else self.hooks)[phase]
            hooks[:] = resolve_order(hooks)
        if self._run is not None:
            self._build()

    # -- runs --------------------------------------------------------------------------

    def start(self, state: State, plan: StepPlan) -> None:
        """Compile every hook for a run of ``state.mode`` on ``state.rank`` (filters start
        counting here) and build dispatch."""
        self._run, self._compiled = _Run(state, plan), {}
        self._build()

    def stop(self) -> None:
        self._run = None

    def _compile(self, hook: Hook) -> Callable[..., Any] | None:
        """``hook`` compiled for this run (once: its filters count from here), wrapped."""
        if hook not in self._compiled:
            assert self._run is not None
            run = self._run
            self._compiled[hook] = hook.compile(run.state, run.state.mode, run.state.rank)
        fn = self._compiled[hook]
        for wrap in self._wrappers():
            fn = fn if fn is None else wrap(hook.phase, hook, fn)
        return fn

    def compiled(self, phase: str, packs: set[int]) -> list[Callable[..., Any]]:
        """``phase``'s hooks that belong to the packs ``packs`` (ids), compiled for the
        run, in order."""
        found = (self._compile(h) for h in self.hooks[phase] if id(h.pack) in packs)
        return [fn for fn in found if fn is not None]

    def _build(self) -> None:
        assert self._run is not None
        plan, d = self._run.plan, self.dispatch
        for phase in PHASES:
            for h in (*self.hooks[phase], *self.overrides.get(phase, ())):
                self.where.add_hook(h, "override" if h.override else "hook")
            compiled = (self._compile(h) for h in self.hooks[phase])
            # the mode's built-ins (metrics, timers) bracket the user's hooks
            hooks = (
                *plan.before.get(phase, ()),
                *(f for f in compiled if f is not None),
                *plan.after.get(phase, ()),
            )
            d.hooks[phase] = hooks
            action = self._chain(phase, plan) if PHASES[phase].has_action else None
            fire = _fire(action, hooks)
            for wrap in self._wrappers():
                fire = fire if fire is None else wrap(phase, None, fire)
            setattr(d, phase, fire)

    def _wrappers(self) -> list[Wrapper]:
        assert self._run is not None
        wrap = self._run.plan.wrap
        return self.wrappers if wrap is None else [wrap, *self.wrappers]

    def instrument(self, wrapper: Wrapper) -> Callable[[], None]:
        """Add ``wrapper`` around every hook and phase; call the result to remove it."""
        self.wrappers.append(wrapper)
        if self._run is not None:
            self._build()

        def remove() -> None:
            if wrapper in self.wrappers:
                self.wrappers.remove(wrapper)
                if self._run is not None:
                    self._build()

        return remove

    def _chain(self, phase: str, plan: StepPlan) -> Action:
        chain = plan.actions.get(phase) or _no_action(
            phase, self._run.state.mode if self._run else ""
        )
        self.where.add(f"phase {phase!r} (built-in action)", chain)
        self.where.add(f"phase {phase!r} (built-in action)", plan.parts.get(phase))
        built_in = chain
        for h in reversed(self.overrides[phase]):
            fn = self._compile(h)
            if fn is not None:
                chain = _link(fn, chain)
        if phase == "runstep" and chain is not built_in:  # an override's result
            chain = _step_result(chain)
        return chain


def _fire(action: Action | None, hooks: tuple[Action, ...]) -> Action | None:
    if not hooks:
        return action

    if action is None:

        def fire(engine: Any) -> None:
            for hook in hooks:
                hook(engine)

        return fire

    if len(hooks) == 1:  # one hook (a mode's built-in, say): no loop to set up each step
        (only,) = hooks

        def fire_one(engine: Any) -> None:
            action(engine)
            only(engine)

        return fire_one

    def fire_action(engine: Any) -> None:
        action(engine)
        for hook in hooks:
            hook(engine)

    return fire_action


def _link(fn: Callable[[Any, Action], Any], default: Action) -> Action:
    def link(engine: Any) -> Any:
        return fn(engine, default)

    return link


def _step_result(chain: Action) -> Action:
    """The outermost ``runstep`` override's return value as the step's result, as the
    built-in step sets it: a loss tensor, or a dict with ``"loss"`` and other outputs.
    ``None`` leaves ``state.loss`` and ``state.output`` to the override."""

    def step(engine: Any) -> None:
        result = chain(engine)
        if result is not None:
            state = engine.state
            if isinstance(result, dict):
                state.output, state.loss = result, result.get("loss")
            elif hasattr(result, "backward"):  # a tensor (torch is not imported here)
                state.output = state.loss = result
            else:
                raise TypeError(
                    f"a runstep override returned {type(result).__name__} "
                    f"{result!r:.60}; return the step's loss tensor, a dict with "
                    f"'loss' and other outputs, or None (it sets state.loss "
                    f"itself)"
                )

    return step


def _no_action(phase: str, mode: str) -> Action:
    def missing(engine: Any) -> Any:
        raise RuntimeError(f"phase {phase!r} has no action in {mode} mode")

    return missing

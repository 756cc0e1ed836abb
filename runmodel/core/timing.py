"""``CallTimes``: the time spent in each phase and each hook of a run, measured by a
``Wrapper`` around what dispatch calls (``engine.instrument``, a mode's ``StepPlan.wrap``).
The ``Timer`` pack and profile mode both time with it."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .hooks import Hook

__all__ = ["CallTimes"]

Label = Callable[[str], contextlib.AbstractContextManager[Any]]


class CallTimes:
    """Calls and host time per phase (``hook`` None) and per hook, keyed by phase and hook
    name. ``wrap`` is the ``Wrapper``; ``phases=False`` leaves the phases unwrapped (only
    hooks are timed); ``label(text)`` is a context each timed call runs in, named
    ``runmodel/PHASE/HOOK`` (profile mode gives ``torch.profiler``'s ``record_function``,
    so the trace shows them). Each timed call costs two clock reads."""

    def __init__(self, phases: bool = True, label: Label | None = None) -> None:
        self.phases, self.label = phases, label
        #: (phase, hook name or None) -> [calls, nanoseconds]
        self.stats: dict[tuple[str, str | None], list[int]] = {}

    def wrap(self, phase: str, hook: Hook | None, fn: Callable[..., Any]) -> Callable[..., Any]:
        if hook is None and not self.phases:
            return fn
        name = None if hook is None else hook.name
        stat = self.stats.setdefault((phase, name), [0, 0])
        clock = time.perf_counter_ns
        label = self.label

        if label is None:

            def timed(*args: Any) -> Any:
                start = clock()
                try:
                    return fn(*args)
                finally:
                    stat[0] += 1
                    stat[1] += clock() - start

            return timed

        text = f"runmodel/{phase}" if name is None else f"runmodel/{phase}/{name}"

        def labelled(*args: Any) -> Any:
            with label(text):
                start = clock()
                try:
                    return fn(*args)
                finally:
                    stat[0] += 1
                    stat[1] += clock() - start

        return labelled

    def listed(self, phase: str, name: str) -> None:
        """Count hook ``name`` of ``phase`` in the rows even if it is never called."""
        self.stats.setdefault((phase, name), [0, 0])

    def rows(self, hooks: bool, called_only: bool = True) -> list[dict[str, Any]]:
        """The hooks' rows (``hooks``) or the phases', slowest first: ``phase``,
        ``hook``, ``calls``, ``total_ms``, ``mean_us``; without the never-called ones
        when ``called_only``."""
        found = [
            _row(phase, name, calls, ns)
            for (phase, name), (calls, ns) in self.stats.items()
            if (name is not None) == hooks and (calls or not called_only)
        ]
        return sorted(found, key=lambda row: -row["total_ms"])


def _row(phase: str, name: str | None, calls: int, ns: int) -> dict[str, Any]:
    return {
        "phase": phase,
        "hook": name,
        "calls": calls,
        "total_ms": ns / 1e6,
        "mean_us": ns / calls / 1e3 if calls else 0.0,
    }

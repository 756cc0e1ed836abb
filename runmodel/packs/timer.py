"""Where a run's time goes: the time spent in each phase and each hook."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..core import Hook, Pack, hook

__all__ = ["Timer"]


class Timer(Pack):
    """Times every phase (its action, overrides and hooks together) and every hook, from
    the ``setup`` hooks on, into ``result.timings["phases"]`` and ``["hooks"]``: rows of
    ``phase``, ``hook``, ``calls``, ``total_ms`` and ``mean_us``, slowest first
    (``runmodel run --json`` prints them; so does the summary).

    The times are host (CPU) time: on a GPU, kernels run asynchronously, so a phase's time
    is the time it took to launch its work unless something in it waited for the device.
    The profile mode measures device time. Each timed call costs two clock reads.
    """

    name = "timer"

    def __init__(self) -> None:
        self._stats: dict[tuple[str, str | None], list[int]] = {}
        self._remove: Callable[[], None] | None = None

    @hook(priority=1e9)  # first, so that the other setup hooks are timed too
    def setup(self, engine: Any) -> None:
        self._stats = {}
        self._remove = engine.instrument(self._wrap)

    def _wrap(self, phase: str, hook: Hook | None, fn: Callable[..., Any]) -> Callable[..., Any]:
        stat = self._stats.setdefault((phase, None if hook is None else hook.name), [0, 0])
        clock = time.perf_counter_ns

        def timed(*args: Any) -> Any:
            start = clock()
            try:
                return fn(*args)
            finally:
                stat[0] += 1
                stat[1] += clock() - start
        return timed

    @hook(priority=-1e9)  # last: every other teardown hook is timed
    def teardown(self, engine: Any) -> None:
        if self._remove is not None:
            self._remove()
            self._remove = None
        phases = [_row(phase, None, calls, ns) for (phase, name), (calls, ns)
                  in self._stats.items() if name is None and calls]
        hooks = [_row(phase, name, calls, ns) for (phase, name), (calls, ns)
                 in self._stats.items() if name is not None and calls]
        engine.state.timings.update(phases=sorted(phases, key=lambda r: -r["total_ms"]),
                                    hooks=sorted(hooks, key=lambda r: -r["total_ms"]))


def _row(phase: str, name: str | None, calls: int, ns: int) -> dict[str, Any]:
    return {"phase": phase, "hook": name, "calls": calls, "total_ms": ns / 1e6,
            "mean_us": ns / calls / 1e3}

"""Where a run's time goes: the time spent in each phase and each hook."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core import Pack, hook
from ..core.timing import CallTimes

__all__ = ["Timer"]


class Timer(Pack):
    """Times every phase (its action, overrides and hooks together) and every hook, from
    the ``setup`` hooks on, into ``result.timings["phases"]`` and ``["hooks"]``: rows of
    ``phase``, ``hook``, ``calls``, ``total_ms`` and ``mean_us``, slowest first
    (``runmodel run --json`` prints them; so does the summary).

    The times are host (CPU) time: on a GPU, kernels run asynchronously, so a phase's time
    is the time it took to launch its work unless something in it waited for the device.
    The profile mode measures device time. Each timed call costs two clock reads
    (``runmodel.core.timing.CallTimes``, which profile mode times its hooks with too; a
    row is a ``runmodel.core.timing.CallTime`` as plain values).
    """

    name = "timer"

    def __init__(self) -> None:
        self._times = CallTimes()
        self._remove: Callable[[], None] | None = None

    @hook(priority=1e9)  # first, so that the other setup hooks are timed too
    def setup(self, engine: Any) -> None:
        self._times = CallTimes()
        self._remove = engine.instrument(self._times.wrap)

    @hook(priority=-1e9)  # last: every other teardown hook is timed
    def teardown(self, engine: Any) -> None:
        if self._remove is not None:
            self._remove()
            self._remove = None
        engine.state.timings.update(
            phases=self._times.rows(hooks=False), hooks=self._times.rows(hooks=True)
        )

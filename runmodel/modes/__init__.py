"""What a run does in each mode, as mode objects carrying their own options.

    Train()                                   forward, backward, optimizer_step
    Eval()                                    forward without grad; metrics into state.metrics
    Infer(collect=True)                       forward without grad; outputs collected
    Benchmark(measure="train", warmup=5)      a train or infer step, timed
    Profile(measure="train", warmup=5, directory=None)
                                              the step under torch.profiler; hooks timed

``engine.run(model, mode)`` takes one of these or a mode's name (with its defaults).
"""

from __future__ import annotations

from .. import core
from .base import Mode
from .eval_infer import Eval, Infer
from .timed import Benchmark, Profile, batch_size
from .train import Train

__all__ = [
    "MODE_TYPES",
    "Benchmark",
    "Eval",
    "Infer",
    "Mode",
    "Profile",
    "Train",
    "as_mode",
    "batch_size",
]

MODE_TYPES: dict[str, type[Mode]] = {m.name: m for m in (Train, Eval, Infer, Benchmark, Profile)}


def as_mode(mode: core.ModeLike | str) -> core.ModeLike:
    """``mode`` if it is a mode object, else the mode of that name with its defaults."""
    if not isinstance(mode, str):
        return mode
    if mode in MODE_TYPES:
        return MODE_TYPES[mode]()
    raise ValueError(
        f"unknown mode {mode!r}; valid modes: {', '.join(MODE_TYPES)}, or a mode "
        f"object such as runmodel.Benchmark(measure='infer')"
    )

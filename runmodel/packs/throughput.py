"""Samples, items (tokens) and model FLOPs per second of a train run, at an interval."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from ..core import Hook, HookHandle, HookOptions, Pack
from ..core.checks import is_number, is_whole_number

__all__ = ["PEAK_FLOPS", "Throughput", "peak_flops_of"]

#: Dense 16-bit (bfloat16/float16) tensor-core peak FLOP/s of some devices, by a pattern
#: of ``torch.cuda.get_device_name()``, first match wins (NVIDIA's data sheets: their
#: figures "with sparsity" halved). A run in float32 or TF32 has a lower peak: pass
#: ``peak_flops=``.
PEAK_FLOPS: tuple[tuple[str, float], ...] = (
    (r"\bH100\b.*\bPCIe\b", 756.5e12),
    (r"\bH100\b", 989.5e12),  # SXM ("NVIDIA H100 80GB HBM3")
    (r"\bG?H200\b", 989.5e12),
    (r"\bA100\b", 312e12),
    (r"\bL40S\b", 362.05e12),
    (r"\bL4\b", 121e12),
    (r"\bV100\b", 125e12),
    (r"\bT4\b", 65e12),
)

#: The clock the windows are timed with (host time; the device is synchronized first).
clock: Callable[[], float] = time.perf_counter

Count = int | Callable[[Any], int]


def peak_flops_of(device: torch.device) -> float | None:
    """The peak FLOP/s of ``device`` from ``PEAK_FLOPS``; None for a CPU or a device the
    table does not know."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for pattern, peak in PEAK_FLOPS if re.search(pattern, name)), None)


class Throughput(Pack):
    """Measure a train run's speed and write it into ``state.metrics`` at every
    ``every`` (a hook filter on the step: ``"50st"``, ``"1ep"``, ``"30s"``):

    * ``samples_per_s``: rows per second (each batch's first tensor's length, or
      ``samples_per_batch=``: a number or a function of the batch);
    * ``items_per_s``: with ``items_per_batch=`` (a number, as ``block_size * batch_size``
      tokens, or a function of the batch), items per second;
    * ``mfu``: the model FLOPs utilization, the model's FLOPs per second over the
      device's peak: ``flops_per_step=`` if given, else counted once, on the run's first
      step, with ``torch.utils.flop_counter.FlopCounterMode`` (the matmuls and
      convolutions the step runs, forward and backward); the peak is ``peak_flops=``, or
      the device's from ``PEAK_FLOPS``. Without a known peak (a CPU), no ``mfu``.

    A window runs from the previous report (the first: from the end of the run's first
    step, which pays for warm-up and the FLOP count) to this one, and leaves out the
    evaluation passes in it. At a report, and only then, the device is synchronized so
    that the window's time includes its queued work; other steps read nothing from it.
    """

    name = "throughput"

    def __init__(
        self,
        every: int | str = "50st",
        *,
        items_per_batch: Count | None = None,
        samples_per_batch: Count | None = None,
        flops_per_step: float | None = None,
        peak_flops: float | None = None,
    ) -> None:
        for option, value in (
            ("items_per_batch", items_per_batch),
            ("samples_per_batch", samples_per_batch),
        ):
            if value is not None and not callable(value):
                _positive(option, value, whole=True)
        for option, number in (("flops_per_step", flops_per_step), ("peak_flops", peak_flops)):
            if number is not None:
                _positive(option, number)
        self.every = every
        self.items_per_batch, self.samples_per_batch = items_per_batch, samples_per_batch
        #: the model's FLOPs per step (runstep): given, or counted on the first step
        self.flops_per_step: float | None = flops_per_step
        self.peak_flops = peak_flops
        self.writes = ("samples_per_s", "mfu") + (
            () if items_per_batch is None else ("items_per_s",)
        )
        # the counts of a batch; read per step only when one depends on the batch (else
        # a window's counts are its steps times the numbers)
        self._samples_of = _counter(samples_per_batch, _rows)
        self._items_of = _counter(items_per_batch, lambda batch: 0)
        self._per_step = not all(
            isinstance(n, int) for n in (samples_per_batch, items_per_batch or 0)
        )
        self._given_flops = flops_per_step
        self._peak: float | None = None  # this run's: given, or the device's
        self._sync: Callable[[], None] | None = None
        self._counter: FlopCounterMode | None = None
        self._first_step: list[HookHandle] = []  # hooks around the run's first step
        # the window: its start (clock, state.step), its samples and items so far, and
        # when an evaluation pass in it began
        self._start: float | None = None
        self._start_step = 0
        self._samples = self._items = 0
        self._eval_began: float | None = None

    def hooks(self) -> Iterator[Hook]:
        yield Hook(self.setup, "setup", HookOptions.of(name="throughput.setup", modes="train"))
        if self._per_step:  # a count that depends on the batch: read after every step
            yield Hook(
                self.count,
                "runstep",
                HookOptions.of(priority=2e9, name="throughput.count", modes="train"),
            )
        yield Hook(
            self.report,
            "runstep",
            HookOptions.of(
                every=self.every, priority=-1e9, name="throughput.report", modes="train"
            ),
        )
        yield Hook(self.eval_start, "eval_start", HookOptions.of(modes="train"))
        yield Hook(self.eval_end, "eval_end", HookOptions.of(modes="train"))
        yield Hook(self.teardown, "teardown", HookOptions.of(modes="train"))

    # -- the run ------------------------------------------------------------------------------

    def setup(self, engine: Any) -> None:
        """Find the device and its peak; count the first step's FLOPs if MFU needs them."""
        device = _device_of(engine.model)
        self._sync = torch.cuda.synchronize if device.type == "cuda" else None
        self._peak = self.peak_flops if self.peak_flops is not None else peak_flops_of(device)
        self.flops_per_step = self._given_flops
        self._start, self._samples, self._items, self._eval_began = None, 0, 0, None
        # around the run's first step only, then detached: a runstep hook right after
        # ``count`` ends the FLOP count (the last step_start hook began it) and opens the
        # window, so that ``count`` leaves the first step out
        self._first_step = [
            engine.on("runstep", self._open, priority=1e9, modes="train", name="throughput.open")
        ]
        if self._peak is not None and self.flops_per_step is None:
            self._first_step.append(
                engine.on(
                    "step_start",
                    self._count_flops,
                    priority=-1e9,
                    modes="train",
                    name="throughput.count_flops",
                )
            )

    def _count_flops(self, engine: Any) -> None:
        if self._counter is None:  # not again after a step another hook skipped
            self._counter = FlopCounterMode(display=False)
            self._counter.__enter__()

    def _open(self, engine: Any) -> None:
        """After the run's first step: the FLOPs it ran; the first window opens."""
        self._end_flop_count()
        self._start, self._start_step = clock(), engine.state.step + 1

    def count(self, engine: Any) -> None:
        """After each step but the run's first: its samples and items."""
        if self._start is None:
            return
        batch = engine.state.batch
        self._samples += self._samples_of(batch)
        self._items += self._items_of(batch)

    def report(self, engine: Any) -> None:
        """Synchronize the device, then write the window's rates into state.metrics."""
        state = engine.state
        steps = state.step + 1 - self._start_step
        if self._start is None or steps <= 0:
            return  # the first step itself: no window yet
        if self._sync is not None:
            self._sync()
        now = clock()
        seconds = now - self._start
        if seconds <= 0:
            return
        if not self._per_step:  # numbers: as many each step
            self._samples = steps * self._samples_of(None)
            self._items = steps * self._items_of(None)
        metrics = state.metrics
        metrics["samples_per_s"] = self._samples / seconds
        if self.items_per_batch is not None:
            metrics["items_per_s"] = self._items / seconds
        if self._peak is not None and self.flops_per_step is not None:
            metrics["mfu"] = self.flops_per_step * steps / seconds / self._peak
        self._start, self._start_step = now, state.step + 1
        self._samples = self._items = 0

    def eval_start(self, engine: Any) -> None:
        self._eval_began = clock()

    def eval_end(self, engine: Any) -> None:
        """Leave the evaluation pass out of the window."""
        if self._eval_began is not None and self._start is not None:
            self._start += clock() - self._eval_began
        self._eval_began = None

    def teardown(self, engine: Any) -> None:
        self._end_flop_count()

    def _end_flop_count(self) -> None:
        for handle in self._first_step:
            handle.detach()
        self._first_step = []
        if self._counter is not None:
            self._counter.__exit__(None, None, None)
            self.flops_per_step = float(self._counter.get_total_flops())
            self._counter = None


def _counter(count: Count | None, default: Callable[[Any], int]) -> Callable[[Any], int]:
    """A batch's count: ``count``'s (a number, or a function of the batch), else
    ``default``'s."""
    if count is None:
        return default
    if isinstance(count, int):
        return lambda batch: count
    return count


def _device_of(model: Any) -> torch.device:
    """The model's device: ``model.device``, else its module's first parameter's."""
    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    module = getattr(model, "module", None)
    parameter = next(module.parameters(), None) if isinstance(module, torch.nn.Module) else None
    return parameter.device if parameter is not None else torch.device("cpu")


def _rows(batch: Any) -> int:
    """The number of samples in ``batch``: its first tensor's length (a tensor, the first
    of a tuple or list, the first value of a mapping, nested), else ``len(batch)``."""
    while True:
        if isinstance(batch, torch.Tensor):
            return batch.shape[0] if batch.dim() else 1
        if isinstance(batch, (tuple, list)) and batch:
            batch = batch[0]
        elif isinstance(batch, Mapping) and batch:
            batch = next(iter(batch.values()))
        else:
            try:
                return len(batch)
            except TypeError:
                raise TypeError(
                    f"Throughput: cannot tell how many samples a batch of "
                    f"{type(batch).__name__} holds; give samples_per_batch= (a number, "
                    f"or a function of the batch)"
                ) from None


def _positive(option: str, value: object, whole: bool = False) -> None:
    if not (is_whole_number(value, least=1) if whole else is_number(value, above=0)):
        what = "a whole number > 0 or a function of the batch" if whole else "a number > 0"
        raise ValueError(f"Throughput {option}= must be {what}, got {value!r}")

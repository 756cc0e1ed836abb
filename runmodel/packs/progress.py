"""Progress of a run: a tqdm bar on a terminal, a line per epoch elsewhere."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import IO, Any

import torch

from ..core import Hook, HookOptions, Pack
from ..core.checks import is_number

__all__ = ["Progress", "interactive"]


def in_jupyter() -> bool:
    """Whether this process is a Jupyter kernel (its output goes to a notebook)."""
    ipython = sys.modules.get("IPython")
    shell = getattr(ipython, "get_ipython", lambda: None)() if ipython is not None else None
    return type(shell).__name__ == "ZMQInteractiveShell"


def interactive(stream: IO[str]) -> bool:
    """Whether a person watches ``stream`` as it is written: a terminal, or the standard
    output or error of a Jupyter kernel (not a file, a pipe, a test's capture or CI)."""
    isatty = getattr(stream, "isatty", None)
    if callable(isatty) and isatty():
        return True
    return stream in (sys.stdout, sys.stderr) and in_jupyter()


class Progress(Pack):
    """Shows how a run goes, on process rank 0 only.

    On a terminal: a tqdm bar per epoch with the epoch, the step, the loss and the rate.
    It counts as people do (``docs/phases.md``): the epoch under way by its ordinal from 1
    (``epoch 1/3`` during the first), steps by how many are done.
    The step's loss is read (one ``.item()``, a device sync on a GPU) only when the bar
    redraws, at most every ``refresh`` seconds, never once per step. Elsewhere (a log
    file, a pipe, CI): one plain line per epoch with the loss, the float metrics and the
    time. At an epoch's end the loss shown is the epoch's mean (``state.metrics["loss"]``,
    which a train run computes because this pack reads it), where the run has one. An
    epoch cut short (Ctrl-C, a preemption) shows only the metrics written during it: not
    the previous epoch's evaluation, which it did not repeat.
    ``file`` is where it writes (default: standard error).
    """

    name = "progress"
    reads = ("loss",)  # a train run puts the epoch's mean loss there for a reader

    def __init__(self, file: IO[str] | None = None, refresh: float = 0.2) -> None:
        if not is_number(refresh, above=0):
            raise ValueError(
                f"refresh= is the seconds between redraws, a number > 0; got {refresh!r}"
            )
        self.file, self.refresh = file, float(refresh)
        self.bar: Any = None
        self.count = 0  # steps of this epoch; the bar catches up when it redraws
        self._shown_at = self._epoch_began = 0.0
        self._metrics_before: dict[str, Any] = {}  # state.metrics as the epoch began

    @property
    def stream(self) -> IO[str]:
        return self.file if self.file is not None else sys.stderr

    def hooks(self) -> Iterator[Hook]:
        on_rank_0 = HookOptions.of(rank=0, priority=-300)  # after hooks that set metrics
        yield Hook(self.epoch_start, "epoch_start", on_rank_0)
        yield Hook(self.epoch_end, "epoch_end", on_rank_0)
        yield Hook(self.teardown, "teardown", on_rank_0)
        if interactive(self.stream):  # a bar: a cheap hook per step; else nothing per step
            yield Hook(self.step, "runstep", on_rank_0)

    def epoch_start(self, engine: Any) -> None:
        self._epoch_began = self._shown_at = time.monotonic()
        self.count = 0
        self._metrics_before = dict(engine.state.metrics)
        if not interactive(self.stream):
            return
        from tqdm.auto import tqdm  # a notebook's widget in Jupyter, else the text bar

        s = engine.state
        total = _epoch_length(engine)
        if s.max_steps is not None:
            total = min(total or s.max_steps, s.max_steps - s.step)
        self.bar = tqdm(
            total=total,
            initial=0,
            file=self.stream,
            leave=True,
            dynamic_ncols=True,
            desc=f"{s.mode} epoch {s.epoch + 1}"
            + (f"/{s.max_epochs}" if s.max_epochs is not None else ""),
            unit="step",
            mininterval=self.refresh,
        )

    def step(self, engine: Any) -> None:
        self.count += 1
        now = time.monotonic()
        if self.bar is None or now - self._shown_at < self.refresh:
            return
        self._shown_at = now  # a redraw: the only time the loss is read
        s = engine.state
        # a runstep hook runs before state.step counts its step: this step is step + 1
        at = f"step {s.step + 1}" + (f" it {s.iteration}" if s.counts_iterations else "")
        self.bar.set_postfix_str(at + _loss_text(s.loss), refresh=False)
        self.bar.update(self.count - self.bar.n)

    def epoch_end(self, engine: Any) -> None:
        s = engine.state
        loss = _loss_text(s.metrics.get("loss", s.loss))  # the epoch's mean, if there is one
        shown = s.metrics
        if not s.epoch_complete:  # cut short (Ctrl-C): what this epoch measured, no older
            before = self._metrics_before
            shown = {k: v for k, v in s.metrics.items() if before.get(k, _UNSET) is not v}
        metrics = "".join(
            f"  {k} {v:.4g}" for k, v in shown.items() if isinstance(v, float) and k != "loss"
        )
        if self.bar is not None:
            self.bar.set_postfix_str(
                f"step {s.step}{_iterations(s)}" + loss + metrics, refresh=False
            )
            self.bar.update(self.count - self.bar.n)
            self.bar.close()
            self.bar = None
            return
        total = f"/{s.max_epochs}" if s.max_epochs is not None else ""
        elapsed = time.monotonic() - self._epoch_began
        # a closed output (`| tee` ended by the Ctrl-C that stops the run) costs this line,
        # never the run: the epoch's end still saves and records its status
        with contextlib.suppress(OSError, ValueError):
            print(
                f"{s.mode} epoch {s.epoch + 1}{total}  step {s.step}{_iterations(s)}{loss}{metrics}"
                f"  ({elapsed:.2f}s)",
                file=self.stream,
                flush=True,
            )

    def teardown(self, engine: Any) -> None:
        if self.bar is not None:  # an error ended the epoch
            self.bar.close()
            self.bar = None


_UNSET = object()


def _epoch_length(engine: Any) -> int | None:
    data_for = getattr(engine.model, "data_for", None)
    try:
        return (
            len(
                data_for(
                    engine.state.mode
                    if engine.state.mode in ("train", "eval", "infer")
                    else "train"
                )
            )
            if data_for is not None
            else None
        )
    except (TypeError, ValueError):
        return None


def _loss_text(loss: Any) -> str:
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        return f"  loss {loss.detach().item():.4g}"
    return f"  loss {loss:.4g}" if isinstance(loss, float) else ""


def _iterations(s: Any) -> str:
    """``" it N"`` (the iterations done) where the run counts them, else nothing."""
    return f" it {s.iteration}" if s.counts_iterations else ""

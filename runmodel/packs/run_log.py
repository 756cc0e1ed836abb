"""A run's log file: a line at its start, at each epoch's end and at its end."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

from .._io import naming_disk_full, prepare_folder
from ..core import Pack, hook

__all__ = ["RunLog"]


class RunLog(Pack):
    """Appends a line to ``path`` at the start, each epoch end (the loss and the float
    metrics) and the end of a run (with the error, if one ended it). Only process rank 0
    writes (the processes of a distributed run would write the same lines).

    It counts as people do (``docs/phases.md``): an epoch by its ordinal from 1 (``epoch 1
    step 4`` ends the first), steps and epochs done by their count (``start train: 1
    epoch, 4 steps done`` resumes after the first epoch), as checkpoint names do."""

    name = "run_log"
    reads = ("loss",)  # a train run puts the epoch's mean loss there for a reader

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def check_setup(self, engine: Any) -> None:
        """The log's folder is made and tried now (on rank 0, which writes)."""
        if engine.state.rank == 0:
            prepare_folder(self.path.parent, "RunLog")
            if self.path.is_dir():
                raise IsADirectoryError(
                    f"RunLog({str(self.path)!r}) appends to a file, and "
                    f"that path is a folder; give a file's path, as in "
                    f"RunLog({str(self.path / 'run.log')!r})"
                )

    def write(self, text: str) -> None:
        with naming_disk_full(self.path), open(self.path, "a") as log:
            log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")

    @hook(rank=0)
    def setup(self, engine: Any) -> None:
        s = engine.state
        self.write(f"start {s.mode}: {_done(s)}")

    @hook(priority=-50, rank=0)  # after hooks that compute metrics
    def epoch_end(self, engine: Any) -> None:
        s = engine.state
        if s.interrupted and not s.epoch_complete:  # a partial epoch is no epoch to log
            return
        mean = s.metrics.get("loss")  # the epoch's mean; else the last step's loss
        loss = (
            f" loss {mean:.6g}"
            if isinstance(mean, float)
            else (
                f" loss {s.loss.detach().item():.6g}"
                if isinstance(s.loss, torch.Tensor) and (s.loss.numel() == 1)
                else ""
            )
        )
        metrics = "".join(
            f" {k} {v:.6g}" for k, v in s.metrics.items() if isinstance(v, float) and k != "loss"
        )
        self.write(f"epoch {s.epoch + 1} step {s.step}{_iterations(s)}{loss}{metrics}")

    @hook(rank=0)
    def teardown(self, engine: Any) -> None:
        error = engine.state.error
        self.write(
            f"end: {_done(engine.state)}"
            + (f": {type(error).__name__}: {error}" if error is not None else "")
        )


def _done(s: Any) -> str:
    epochs, steps = s.epoch, s.step
    its = f", {s.iteration} iterations" if s.counts_iterations else ""
    return (
        f"{epochs} epoch{'' if epochs == 1 else 's'}, {steps} step{'' if steps == 1 else 's'}"
        f"{its} done"
    )


def _iterations(s: Any) -> str:
    """`` iteration N`` (the iterations done) where the run counts them, else nothing."""
    return f" iteration {s.iteration}" if s.counts_iterations else ""

"""Scalars to TensorBoard through ``torch.utils.tensorboard``."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from .._io import naming_disk_full, prepare_folder
from ..core import Hook, HookOptions, Pack
from ..core.checks import is_number, whole_number

__all__ = ["TensorBoard"]


class TensorBoard(Pack):
    """Log to TensorBoard event files in ``directory``: at each epoch end the loss (the
    ``loss`` metric if there is one, else the last step's), every metric in
    ``state.metrics`` and each optimizer group's learning rate, against the
    global step (the iterations done, where the run counts them: gradients accumulated
    or ``iterations=`` given); with ``every_steps=N`` also the loss every N steps (one ``.item()``
    each time, never per step). Only process rank 0 writes (a distributed run's other
    processes add nothing).

    ``hparams`` (a dict of names to numbers, strings or booleans; a run in a derived
    folder, a config's or a model source's, sets what makes it: ``describe_run``) goes to
    TensorBoard's HParams dashboard at the run's end, with the final metrics, in this
    run's own event folder (not a timestamped sub-run as ``SummaryWriter.add_hparams``
    makes), each metric as the last value of its ``MODE/NAME`` curve: ``tensorboard
    --logdir`` over many runs then compares them in one table."""

    name = "tensorboard"
    reads = ("loss",)  # a train run puts the epoch's mean loss there for a reader

    def __init__(self, directory: str | os.PathLike[str], every_steps: int | None = None) -> None:
        whole_number(every_steps, "every_steps=", least=1, none=True)
        self.directory, self.every_steps = Path(directory), every_steps
        self.writer: Any = None
        self.hparams: dict[str, Any] | None = None

    def describe_run(self, name: str, params: Mapping[str, Any]) -> None:
        """What a run in a derived folder tells its trackers: its parameters become the
        HParams (``runs/folder_run.py``)."""
        self.hparams = dict(params)

    def hooks(self) -> Iterator[Hook]:
        yield Hook(self.open, "setup", HookOptions.of(name="tensorboard.open", rank=0))
        yield Hook(
            self.log_epoch,
            "epoch_end",
            HookOptions.of(name="tensorboard.epoch", priority=-100, rank=0),
        )  # after hooks setting metrics
        if self.every_steps:
            yield Hook(
                self.log_step,
                "runstep",
                HookOptions.of(every=self.every_steps, name="tensorboard.step", rank=0),
            )
        yield Hook(self.close, "teardown", HookOptions.of(name="tensorboard.close", rank=0))

    def check_setup(self, engine: Any) -> None:
        """The folder is made and tried now (on rank 0, which writes): one that cannot be
        written stops the run before its first step."""
        if engine.state.rank == 0:
            prepare_folder(self.directory, "TensorBoard")

    def open(self, engine: Any) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(self.directory))

    def _file(self) -> Path:
        """The event file being written (for an error to name), else the folder."""
        writer = getattr(getattr(self.writer, "file_writer", None), "event_writer", None)
        return Path(getattr(writer, "_file_name", self.directory))

    def log_step(self, engine: Any) -> None:
        loss = engine.state.loss
        if loss is not None:
            with naming_disk_full(self._file()):  # its writer thread's error shows here
                s = engine.state  # the x axis: iterations done where the run counts them
                done = s.iteration + 1 if s.counts_iterations else s.step + 1
                self.writer.add_scalar(f"{s.mode}/loss_step", float(loss.detach()), done)

    def log_epoch(self, engine: Any) -> None:
        if engine.state.interrupted and not engine.state.epoch_complete:
            return  # a partial epoch, cut short by an interrupt: no point of the curves
        with naming_disk_full(self._file()):
            self._log_epoch(engine)

    def _log_epoch(self, engine: Any) -> None:
        s = engine.state
        step, mode = (s.iteration if s.counts_iterations else s.step), s.mode
        if "loss" not in s.metrics and isinstance(s.loss, torch.Tensor) and s.loss.numel() == 1:
            self.writer.add_scalar(f"{mode}/loss", s.loss.detach().item(), step)
        for name, value in s.metrics.items():
            if isinstance(value, (int, float)):
                self.writer.add_scalar(f"{mode}/{name}", value, step)
        optimizer = getattr(engine.model, "optimizer", None)
        for i, group in enumerate(
            getattr(optimizer, "param_groups", ()) if mode == "train" else ()
        ):
            self.writer.add_scalar(f"lr/group{i}", group["lr"], step)
        self.writer.flush()

    def log_hparams(self, metrics: dict[str, Any], mode: str) -> None:
        from torch.utils.tensorboard.summary import hparams

        values = {
            k: v for k, v in (self.hparams or {}).items() if isinstance(v, (bool, int, float, str))
        }
        # the dashboard shows each metric's last value under the tag the epoch ends
        # logged it as: no second copy of the curves
        final = {f"{mode}/{k}": float(v) for k, v in metrics.items() if is_number(v)}
        for summary in hparams(values, final):
            self.writer.file_writer.add_summary(summary)

    def close(self, engine: Any) -> None:
        if self.writer is not None:
            with naming_disk_full(self._file()):
                if self.hparams:
                    self.log_hparams(engine.state.metrics, engine.state.mode)
                writer, self.writer = self.writer, None
                writer.close()

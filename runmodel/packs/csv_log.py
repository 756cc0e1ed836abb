"""The run's metrics as CSV files: one row per epoch (and, if asked, one every N steps),
which ``pandas.read_csv`` (or any spreadsheet) reads back. Named ``csv_log`` so that it
does not shadow the standard library's ``csv``."""

from __future__ import annotations

import csv
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from .._io import atomic_write, naming_disk_full, prepare_folder
from ..core import Hook, HookOptions, Pack
from ..core.checks import is_number, whole_number

__all__ = ["CSV"]

#: The columns every epoch row starts with; the metrics follow in the order first seen.
EPOCH_COLUMNS = ("epoch", "step", "loss")
#: The columns of a step row.
STEP_COLUMNS = ("step", "epoch", "loss")


class CSV(Pack):
    """Write the run's metrics to ``path`` as CSV, one row per epoch: ``epoch`` (its
    ordinal from 1), ``step`` (steps done), ``loss`` (the ``loss`` metric if there is
    one, such as the epoch's mean loss, else the last step's), each number in
    ``state.metrics`` (``eval_loss``, ``eval_accuracy``, ...) and each optimizer group's
    learning rate (``lr/group0``, ...). A metric first seen in a later epoch adds a
    column: the file is rewritten with it (earlier rows leave it empty). Each epoch's
    rewrite is atomic, so the file is whole even after a kill.

    ``every_steps=N`` also writes ``step``, ``epoch`` and the step's ``loss`` every N
    steps to ``step_path`` (default: ``NAME_steps.csv`` beside ``path``); reading the
    loss is one ``.item()`` each time, never per step.

    A resumed run keeps the rows up to the step it resumes from and goes on from there,
    so its files are those of one straight run. A run from step 0 finds a file there
    from an earlier run and moves it aside (``NAME.old-TIME.csv``: nothing is lost).
    Only process rank 0 writes; it runs in the modes ``modes`` names (train by default).
    """

    name = "csv"
    #: the epoch's loss: where a pack reads ``loss``, the run computes the epoch's mean
    reads = ("loss",)

    def __init__(
        self,
        path: str | os.PathLike[str] = "metrics.csv",
        every_steps: int | None = None,
        step_path: str | os.PathLike[str] | None = None,
        modes: str | Iterable[str] = "train",
    ) -> None:
        whole_number(
            every_steps,
            "CSV(every_steps=)",
            least=1,
            none=True,
            meaning="a row every that many steps",
        )
        self.path = Path(path)
        if self.path.suffix != ".csv":
            raise ValueError(
                f"CSV(path=) names the .csv file to write, such as 'metrics.csv'; got {str(path)!r}"
            )
        self.every_steps = every_steps
        self.step_path = (
            Path(step_path)
            if step_path is not None
            else self.path.with_name(f"{self.path.stem}_steps.csv")
        )
        self.modes = HookOptions.of(modes=modes).modes
        self.rows: list[dict[str, Any]] = []  # the epoch rows written so far
        self.columns: list[str] = list(EPOCH_COLUMNS)
        self._steps: Any = None  # the step file, open for appending during a run

    @property
    def directory(self) -> Path:
        """The folder the files go in: a relative one lands inside a run's ``run_dir``."""
        return self.path.parent

    @directory.setter
    def directory(self, folder: Path) -> None:
        # engine.run(run_dir=) moves a relative folder inside the run's: both files go
        inside = folder / self.path.name
        if self.step_path.parent == self.path.parent:
            self.step_path = folder / self.step_path.name
        self.path = inside

    def hooks(self) -> Iterator[Hook]:
        yield Hook(self.open, "setup", HookOptions.of(name="csv.open", rank=0, modes=self.modes))
        yield Hook(
            self.log_epoch,
            "epoch_end",
            HookOptions.of(name="csv.epoch", priority=-100, rank=0, modes=self.modes),
        )  # after Evaluate
        if self.every_steps:
            yield Hook(
                self.log_step,
                "runstep",
                HookOptions.of(every=self.every_steps, name="csv.step", rank=0, modes=self.modes),
            )
        yield Hook(
            self.close, "teardown", HookOptions.of(name="csv.close", rank=0, modes=self.modes)
        )

    def check_setup(self, engine: Any) -> None:
        """The folders are made and tried now (on rank 0, which writes)."""
        if engine.state.rank != 0 or (
            self.modes is not None and engine.state.mode not in self.modes
        ):
            return
        for path in {self.path, self.step_path}:
            prepare_folder(path.parent, "CSV")
            if path.is_dir():
                raise IsADirectoryError(
                    f"CSV writes the file {str(path)!r}, and that path is "
                    f"a folder; give a file's path"
                )

    # -- the run ----------------------------------------------------------------------------

    def open(self, engine: Any) -> None:
        """A resumed run keeps the rows up to where it resumes; a new one starts afresh."""
        s = engine.state
        resumed = engine.resumed_from is not None
        self.rows, self.columns = [], list(EPOCH_COLUMNS)
        if resumed:
            self.columns, self.rows = _read(self.path, EPOCH_COLUMNS, s.step)
            _rewrite(self.path, self.columns, self.rows)
        else:
            _move_aside(self.path)
        if self.every_steps:
            if resumed:
                _rewrite(self.step_path, *_read(self.step_path, STEP_COLUMNS, s.step))
            else:
                _move_aside(self.step_path)
            new = not self.step_path.is_file()
            self._steps = open(self.step_path, "a", newline="")  # noqa: SIM115  # closed at teardown
            if new:
                csv.writer(self._steps).writerow(STEP_COLUMNS)

    def log_step(self, engine: Any) -> None:
        s = engine.state
        if isinstance(s.loss, torch.Tensor) and s.loss.numel() == 1 and self._steps is not None:
            with naming_disk_full(self.step_path):
                csv.writer(self._steps).writerow(
                    (s.step + 1, s.epoch + 1, repr(float(s.loss.detach())))
                )

    def log_epoch(self, engine: Any) -> None:
        s = engine.state
        if s.interrupted and not s.epoch_complete:
            return  # a partial epoch, cut short by an interrupt: no row
        row = self.epoch_row(engine)
        self.columns += [name for name in row if name not in self.columns]
        self.rows.append(row)
        _rewrite(self.path, self.columns, self.rows)
        if self._steps is not None:
            with naming_disk_full(self.step_path):
                self._steps.flush()

    def epoch_row(self, engine: Any) -> dict[str, Any]:
        """The row of the epoch that just ended."""
        s = engine.state
        row: dict[str, Any] = {"epoch": s.epoch + 1, "step": s.step}
        loss = s.metrics.get("loss", s.loss)
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            loss = loss.detach().item()
        row["loss"] = loss if _number(loss) else None
        row.update(
            (name, value) for name, value in s.metrics.items() if name != "loss" and _number(value)
        )
        optimizer = getattr(engine.model, "optimizer", None)
        for i, group in enumerate(
            getattr(optimizer, "param_groups", ()) if s.kind == "train" else ()
        ):
            row[f"lr/group{i}"] = group["lr"]
        return row

    def close(self, engine: Any) -> None:
        steps, self._steps = self._steps, None
        if steps is not None:
            with naming_disk_full(self.step_path):
                steps.close()


def _number(value: Any) -> bool:
    return is_number(value)


def _read(
    path: Path, columns: tuple[str, ...], up_to: int
) -> tuple[list[str], list[dict[str, Any]]]:
    """The columns and the rows of ``path`` whose ``step`` is at most ``up_to`` (as
    text: they are written back as they were)."""
    if not path.is_file():
        return list(columns), []
    with open(path, newline="") as file:
        reader = csv.DictReader(file)
        found = list(reader.fieldnames or columns)
        rows = [row for row in reader if _step(row) <= up_to]
    return found, rows


def _step(row: dict[str, Any]) -> float:
    try:
        return float(row.get("step") or "inf")
    except ValueError:
        return float("inf")


def _rewrite(path: Path, columns: list[str], rows: list[dict[str, Any]]) -> None:
    with atomic_write(path, "w") as file:
        writer = csv.DictWriter(file, columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: _text(v) for k, v in row.items()} for row in rows)


def _text(value: Any) -> Any:
    """Floats in full (``repr``: read back as the same float), the rest as csv writes it."""
    return repr(value) if isinstance(value, float) else value


def _move_aside(path: Path) -> None:
    """An earlier run's file goes to ``NAME.old-TIME.csv`` (``-2``, ... if taken)."""
    if not path.is_file():
        return
    base = f"{path.stem}.old-{time.strftime('%Y%m%d-%H%M%S')}"
    target, n = path.with_name(f"{base}.csv"), 2
    while target.exists():
        target, n = path.with_name(f"{base}-{n}.csv"), n + 1
    path.rename(target)

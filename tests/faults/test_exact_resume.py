"""Exact resume from any step: a run killed with SIGKILL anywhere and resumed from its
newest good checkpoint ends with the parameters of one straight run, bit for bit.

The training (``resume_run.py``): a shuffled DataLoader, dropout, Adam, a checkpoint after
every step. 20 kill points drawn with a fixed seed from every step (mid-epoch), every
epoch's start (boundaries) and every checkpoint write (killed between writing the file
and renaming it), each run with ``num_workers=0`` and with ``num_workers=2``; each killed
and resumed in real processes, forked from a forkserver that imported torch once. The
full matrix is the opt-in soak (``pytest -m soak``); tests/faults/test_kill_matrix.py
runs a seeded few of its points by default.
"""

from __future__ import annotations

import multiprocessing
import random
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

import resume_run
from resume_run import BATCHES, EPOCHS, STEPS

CONTEXT = multiprocessing.get_context("forkserver")
CONTEXT.set_forkserver_preload(["torch", "runmodel", "resume_run"])

_DRAW = random.Random(20261123)
_LAST = [e * BATCHES - 1 for e in (1, 3)]  # the last steps of epochs 0 and 2
POINTS: list[tuple[str, int]] = sorted(
    [("step", k) for k in _DRAW.sample([k for k in range(STEPS - 1) if k not in _LAST], 11)]
    + [("step", k) for k in _LAST]  # after a step
    + [("epoch", e) for e in range(1, EPOCHS)]  # as an epoch starts
    + [("save", k) for k in _DRAW.sample(range(2, STEPS), 4)]
)  # while writing a checkpoint
assert len(set(POINTS)) == len(POINTS) == 20, POINTS


def process(folder: Path | None, workers: int, kill: tuple[str, int] | None, out: Path) -> Any:
    proc = CONTEXT.Process(
        target=resume_run.train, args=(str(folder) if folder else "", workers, kill, str(out))
    )
    proc.start()
    return proc


def finished(proc: Any) -> int:
    proc.join(timeout=300)
    assert proc.exitcode is not None, "the run did not end in 5 minutes"
    return proc.exitcode


def params(path: Path) -> list[torch.Tensor]:
    return torch.load(path, weights_only=True)


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[torch.Tensor]]:
    """The parameters after one straight run, with and without workers."""
    folder = tmp_path_factory.mktemp("straight")
    runs = {workers: process(None, workers, None, folder / f"{workers}.pt") for workers in (0, 2)}
    assert all(finished(proc) == 0 for proc in runs.values())
    return {workers: params(folder / f"{workers}.pt") for workers in runs}


def test_the_kill_points_cover_mid_epoch_boundaries_and_writes() -> None:
    assert {kind for kind, _ in POINTS} == {"step", "epoch", "save"}
    steps = [k for kind, k in POINTS if kind == "step"]
    assert any((k + 1) % BATCHES for k in steps)  # mid-epoch
    assert any((k + 1) % BATCHES == 0 for k in steps)  # the last step of an epoch


@pytest.mark.soak  # tests/faults/test_kill_matrix.py runs a seeded few of these points
@pytest.mark.parametrize("workers", [0, 2])
def test_killed_anywhere_and_resumed_ends_bit_identical(
    straight: dict[int, list[torch.Tensor]], tmp_path: Path, workers: int
) -> None:
    pending = list(POINTS)
    while pending:  # a few at a time: writing checkpoints waits on the disk more than the CPU
        batch, pending = pending[:4], pending[4:]
        folders = {kill: tmp_path / f"{kill[0]}{kill[1]}" for kill in batch}
        killed = {
            kill: process(folders[kill], workers, kill, tmp_path / "never.pt") for kill in batch
        }
        for kill, proc in killed.items():
            assert finished(proc) == -signal.SIGKILL, kill
            assert list(folders[kill].glob("ckpt-*.pt")), kill
        resumed = {
            kill: process(folders[kill], workers, None, folders[kill] / "final.pt")
            for kill in batch
        }
        for kill, proc in resumed.items():
            assert finished(proc) == 0, kill
            final = params(folders[kill] / "final.pt")
            assert all(torch.equal(p, q) for p, q in zip(final, straight[workers], strict=True)), (
                f"{kill} with {workers} workers: parameters differ"
            )


def test_the_comparison_can_fail(straight: dict[int, list[torch.Tensor]], tmp_path: Path) -> None:
    # the control: a mid-epoch checkpoint whose position is dropped, as before exact
    # resume, restarts that epoch's data and ends elsewhere
    folder = tmp_path / "control"
    assert finished(process(folder, 0, ("step", 10), tmp_path / "never.pt")) == -signal.SIGKILL
    for path in folder.glob("ckpt-*.pt"):
        state = torch.load(path, weights_only=True)
        state["position"] = {"batches": 0}
        torch.save(state, path)
    assert finished(process(folder, 0, None, folder / "final.pt")) == 0
    final = params(folder / "final.pt")
    assert not all(torch.equal(p, q) for p, q in zip(final, straight[0], strict=True))

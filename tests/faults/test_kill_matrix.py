"""Faults in real processes: SIGKILL at seeded points (mid-epoch, at an epoch's start,
in the middle of a checkpoint write; without and with worker processes; with the
background writer; with a loader of its own generator), two faults in a row, and a disk
that fills up. Each ends bit-identical to one straight run, with no temporary file left,
or with one clear error and every earlier checkpoint intact.

The training is ``resume_run.py``'s (forked from a forkserver that imported torch once);
the full 20-point matrix of ``tests/faults/test_exact_resume.py`` is the opt-in soak
(``pytest -m soak``).
"""

from __future__ import annotations

import multiprocessing
import random
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

from runmodel import checkpoint

import resume_run
from resume_run import EPOCHS, STEPS

CONTEXT = multiprocessing.get_context("forkserver")
CONTEXT.set_forkserver_preload(["torch", "runmodel", "resume_run"])

_DRAW = random.Random(20261125)
# (kill, workers, options): each variant once, at a seeded point
# (a kill mid-run without workers: test_two_faults_in_a_row's first)
CASES: list[tuple[tuple[str, int], int, dict[str, Any]]] = [
    (("save", _DRAW.randrange(2, STEPS)), 0, {}),  # mid-write
    (("step", _DRAW.randrange(1, STEPS - 1)), 2, {}),  # workers
    (("epoch", _DRAW.randrange(1, EPOCHS)), 2, {}),  # an epoch's start
    (("save", _DRAW.randrange(2, STEPS)), 0, {"async_save": True}),  # a background write
    (("epoch", 3), 2, {"own_generator": True, "every": "1ep"}),  # epoch-end checkpoints,
    (("epoch", 2), 2, {"every": "1ep"}),  # persistent workers
]


def start(
    folder: Path | None,
    workers: int,
    kill: tuple[str, int] | None,
    out: Path,
    options: dict[str, Any],
) -> Any:
    proc = CONTEXT.Process(
        target=resume_run.train,
        args=(str(folder) if folder else "", workers, kill, str(out), options),
    )
    proc.start()
    return proc


def finished(proc: Any) -> int:
    proc.join(timeout=300)
    assert proc.exitcode is not None, "the run did not end in 5 minutes"
    return proc.exitcode


def params(path: Path) -> list[torch.Tensor]:
    return torch.load(path, weights_only=True)


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a, b, strict=True))


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".tmp" in p.name)


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[int, bool], Any]:
    """The parameters after one straight run, per (workers, own generator)."""
    folder = tmp_path_factory.mktemp("straight")
    variants = [(0, False), (2, False), (2, True)]
    runs = {
        v: start(None, v[0], None, folder / f"{v[0]}{v[1]}.pt", {"own_generator": v[1]})
        for v in variants
    }
    assert all(finished(proc) == 0 for proc in runs.values())
    return {v: params(folder / f"{v[0]}{v[1]}.pt") for v in variants}


def test_killed_at_seeded_points_and_resumed_ends_bit_identical(
    straight: dict[tuple[int, bool], Any], tmp_path: Path
) -> None:
    folders = {i: tmp_path / f"case{i}" for i in range(len(CASES))}
    for batch in (range(0, 3), range(3, len(CASES))):  # a few at a time: 2 cores
        killed = {
            i: start(folders[i], CASES[i][1], CASES[i][0], tmp_path / "never.pt", CASES[i][2])
            for i in batch
        }
        for i, proc in killed.items():
            assert finished(proc) == -signal.SIGKILL, CASES[i]
        resumed = {
            i: start(folders[i], CASES[i][1], None, folders[i] / "final.pt", CASES[i][2])
            for i in batch
        }
        for i, proc in resumed.items():
            _, workers, options = CASES[i]
            assert finished(proc) == 0, CASES[i]
            expected = straight[workers, options.get("own_generator", False)]
            assert same(params(folders[i] / "final.pt"), expected), f"{CASES[i]}: differ"
            assert leftovers(folders[i]) == [], CASES[i]


def test_two_faults_in_a_row_resume_bit_identical(
    straight: dict[tuple[int, bool], Any], tmp_path: Path
) -> None:
    # killed mid-epoch, then killed again in the middle of a write of the resumed run
    folder = tmp_path / "double"
    assert finished(start(folder, 0, ("step", 5), tmp_path / "never.pt", {})) == -signal.SIGKILL
    assert finished(start(folder, 0, ("save", 4), tmp_path / "never.pt", {})) == -signal.SIGKILL
    assert leftovers(folder)  # the second one died mid-write
    assert finished(start(folder, 0, None, folder / "final.pt", {})) == 0
    assert same(params(folder / "final.pt"), straight[0, False])
    assert leftovers(folder) == []


@pytest.mark.parametrize("async_save", [False, True])
def test_a_full_disk_stops_the_run_with_one_error_and_resume_goes_on_exactly(
    straight: dict[tuple[int, bool], Any], tmp_path: Path, async_save: bool
) -> None:
    folder, full_at = tmp_path / "full", 11
    options = {"async_save": async_save}
    assert finished(start(folder, 0, ("full", full_at), tmp_path / "out.pt", options)) == 0
    error = (tmp_path / "out.pt.error").read_text()
    # the save after step full_at; in the background, maybe the one before, still being
    # written when the disk filled up (its error comes at the next save)
    failed = full_at + 1 if not async_save or f"{full_at + 1:010d}.pt" in error else full_at
    path = folder / f"ckpt-00001-{failed:010d}.pt"
    assert error.startswith(
        f"DiskFullError: writing {str(path)!r} failed: File too large ([Errno 27])"
    ), error
    assert error.endswith("None True"), "one error: nothing chained to it"
    kept = sorted(p.name for p in folder.iterdir())
    assert kept == [f"ckpt-00001-{k:010d}.pt" for k in (failed - 2, failed - 1)]
    for name in kept:  # intact
        assert checkpoint.read(folder / name)["engine"]["counters"]["step"] == int(name[-13:-3])
    assert finished(start(folder, 0, None, folder / "final.pt", options)) == 0
    assert same(params(folder / "final.pt"), straight[0, False])


@pytest.mark.parametrize(("kind", "file"), [("run_log", "run.log"), ("tensorboard", "tb/")])
def test_a_full_disk_under_a_log_is_one_error_naming_its_file(
    kind: str, file: str, tmp_path: Path
) -> None:
    proc = CONTEXT.Process(target=resume_run.log_until_full, args=(kind, str(tmp_path)))
    proc.start()
    assert finished(proc) == 0
    error = (tmp_path / "error").read_text()
    assert error.startswith(f"DiskFullError: writing {str(tmp_path / file)!r}"[:-1]), error
    assert "failed: File too large ([Errno 27])" in error and error.endswith("None True")


def test_a_full_disk_under_a_status_file_keeps_the_old_one(tmp_path: Path) -> None:
    proc = CONTEXT.Process(target=resume_run.status_until_full, args=(str(tmp_path),))
    proc.start()
    assert finished(proc) == 0
    error = (tmp_path / "error").read_text()
    assert error.startswith(
        f"DiskFullError: writing {str(tmp_path / 'status.json')!r} failed: "
        f"File too large ([Errno 27])"
    ), error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["error", "status.json"]
    assert (tmp_path / "status.json").read_text() == '{\n  "status": "running"\n}\n'

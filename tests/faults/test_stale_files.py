"""Temporary files of writers killed mid-write are removed at the next save and at
resume; a live writer's never is. Liveness is the lock the writer holds on its file
(``runmodel/_io.py``), so the writers here are real processes, killed with SIGKILL."""

from __future__ import annotations

import functools
import os
import signal
import sys
from pathlib import Path

import pytest
import torch

import runmodel
from runmodel import checkpoint
from runmodel._io import remove_stale
from runmodel.packs import Checkpoint

import warm as subprocess

# a writer that stops in the middle of writing: it has written part of the file, says so,
# and waits to be killed
WRITER = """
import os, sys, time
from pathlib import Path
from runmodel._io import atomic_write, shared_lock
if sys.argv[2] == "file":
    with atomic_write(sys.argv[1]) as file:
        file.write(b"x" * 100_000)
        file.flush()
        print("writing", flush=True)
        time.sleep(600)
else:  # a sharded checkpoint's staging folder, as each process of the save holds it
    folder = Path(sys.argv[1]).with_name(f".{Path(sys.argv[1]).name}.tmp-{os.getpid()}")
    with shared_lock(folder):
        (folder / "shard0.pt").write_bytes(b"x" * 100_000)
        print("writing", flush=True)
        time.sleep(600)
"""


def start_writer(path: Path, kind: str = "file") -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), kind],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert proc.stdout is not None and proc.stdout.readline() == "writing\n"
    return proc


def temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".tmp" in p.name)


def killed(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_a_live_writers_file_stays_and_a_dead_ones_goes(tmp_path: Path, kind: str) -> None:
    dead, alive = start_writer(tmp_path / "a.pt", kind), start_writer(tmp_path / "b.pt", kind)
    try:
        killed(dead)
        left = temporaries(tmp_path)
        assert len(left) == 2 and left[0].startswith(".a.pt.tmp"), left
        assert [p.name for p in remove_stale(tmp_path)] == [left[0]]
        assert temporaries(tmp_path) == [left[1]]  # its writer holds the lock
        assert not (tmp_path / "a.pt").exists()
    finally:
        killed(alive)
    assert remove_stale(tmp_path) and temporaries(tmp_path) == []


def tiny_run(folder: Path, resume: Path | None = None, steps: int = 2) -> runmodel.Engine:
    torch.manual_seed(0)
    x = torch.randn(8, 3)
    model = runmodel.TorchModel.from_parts(
        torch.nn.Linear(3, 1),
        optimizer=functools.partial(torch.optim.SGD, lr=0.1),
        loss_fn=torch.nn.MSELoss(),
        train_data=[(x[i : i + 2], x[i : i + 2].sum(1, keepdim=True)) for i in range(0, 8, 2)],
    )
    engine = runmodel.Engine()
    engine.attach(Checkpoint(folder, every="1st", keep=2))
    engine.run(model, steps=steps, resume=resume)
    return engine


def test_a_killed_save_leaves_nothing_after_the_next_save_or_resume(tmp_path: Path) -> None:
    tiny_run(tmp_path)
    for name in ("ckpt-00000-0000000009.pt", "best-loss=1-00000-0000000009.pt"):
        killed(start_writer(tmp_path / name))
    assert len(temporaries(tmp_path)) == 2
    checkpoint.load(tmp_path)  # what resume reads first
    assert temporaries(tmp_path) == []
    killed(start_writer(tmp_path / "ckpt-00000-0000000009.pt"))
    tiny_run(tmp_path, resume=tmp_path, steps=3)  # one save more
    assert temporaries(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt-00000-0000000002.pt",
        "ckpt-00000-0000000003.pt",
    ]


def test_written_files_get_the_usual_permissions(tmp_path: Path) -> None:
    from runmodel._io import atomic_write, shared_lock

    mask = os.umask(0o022)
    try:
        with atomic_write(tmp_path / "a.pt") as file:
            file.write(b"x")
        with shared_lock(tmp_path / ".shards.tmp-1"):  # a sharded save's staging folder
            (tmp_path / ".shards.tmp-1" / "0.pt").write_bytes(b"x")
        os.replace(tmp_path / ".shards.tmp-1", tmp_path / "shards")
    finally:
        os.umask(mask)
    assert (tmp_path / "a.pt").stat().st_mode & 0o777 == 0o644  # not mkstemp's 0600
    assert (tmp_path / "shards").stat().st_mode & 0o777 == 0o755
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pt", "shards"]

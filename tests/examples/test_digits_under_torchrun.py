"""examples/torchrun_digits.py as its docstring says to run it: torchrun starts 2
processes on the CPU (gloo), each trains on its half of the digits."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import warm as subprocess

ROOT = Path(__file__).resolve().parents[2]


def torchrun_digits(folder: Path, epochs: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("TORCHELASTIC_RUN_ID", None)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(ROOT / "examples" / "torchrun_digits.py"),
            "--epochs",
            str(epochs),
        ],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_torchrun_digits_trains_in_two_processes_and_rank_0_reports(tmp_path: Path) -> None:
    result = torchrun_digits(tmp_path, 3)
    assert result.stderr.count("starting fresh") == 1, result.stderr  # rank 0 alone says it
    # 1,437 training digits: 719 a process, 12 batches of 64 an epoch
    lines = result.stdout.splitlines()
    assert len(lines) == 1, result.stdout  # rank 0 alone prints
    prefix = "completed after 3 epochs, 36 steps in each of 2 processes; test accuracy "
    assert lines[0].startswith(prefix), lines
    assert float(lines[0].removeprefix(prefix).rstrip("%")) > 85
    saved = sorted(p.name for p in (tmp_path / "runs" / "torchrun-digits").iterdir())
    assert saved == ["ckpt-00002-0000000024.pt", "ckpt-00003-0000000036.pt"]

    # run again, as the docstring's second command: it continues (resume="auto")
    again = torchrun_digits(tmp_path, 4)
    assert (
        again.stderr.count("runmodel: resuming from runs/torchrun-digits/ckpt-00003-0000000036.pt")
        == 1
    ), again.stderr
    assert again.stdout.startswith("completed after 4 epochs, 48 steps in each of 2 "), again.stdout

"""Progress: a tqdm bar on a terminal (a real pty here), a line per epoch elsewhere, and
nothing on ranks other than 0."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import struct
import sys
import termios
import textwrap
from pathlib import Path

import pytest

import runmodel
from runmodel.packs.progress import Progress

import warm as subprocess
from helpers import Tiny

ROOT = Path(__file__).resolve().parents[2]


def test_off_a_terminal_one_line_per_epoch_and_no_per_step_hook() -> None:
    out = io.StringIO()
    engine = runmodel.Engine()
    engine.attach(progress := Progress(file=out))
    engine.on("epoch_end", lambda e: e.state.metrics.update(eval_accuracy=0.5))
    engine.run(Tiny(), epochs=3)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("train epoch 1/3  step 4  loss ")
    assert "eval_accuracy 0.5" in lines[2] and lines[2].startswith("train epoch 3/3  step 12")
    assert not any(h.phase == "runstep" for h in progress.hooks())  # idle between epochs


def test_only_rank_0_shows_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    out = io.StringIO()
    engine = runmodel.Engine()
    engine.attach(Progress(file=out))
    engine.run(Tiny(), epochs=2)
    assert out.getvalue() == ""


SCRIPT = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, sys.argv[1])
    import runmodel
    from helpers import Tiny
    from runmodel.packs.progress import Progress

    class Slow(Tiny):
        def compute_output(self, batch):
            time.sleep(0.01)
            return super().compute_output(batch)

    engine = runmodel.Engine()
    engine.attach(Progress(refresh=float(sys.argv[2])))
    engine.run(Slow(batches=30), epochs=2)
""")


def run_on_a_terminal(refresh: float) -> str:
    """The script's standard error, written to a real pseudo-terminal."""
    main, side = pty.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # 120 columns
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(ROOT / "tests"), str(refresh)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=side,
        cwd=ROOT,
    )
    os.close(side)
    chunks = []
    while True:
        try:
            chunk = os.read(main, 4096)
        except OSError:  # the child closed its end
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main)
    assert proc.wait(timeout=120) == 0
    return b"".join(chunks).decode(errors="replace")


def test_on_a_terminal_a_bar_per_epoch_that_redraws_with_the_loss() -> None:
    screen = run_on_a_terminal(refresh=0.05)
    assert "train epoch 1/2" in screen and "train epoch 2/2" in screen  # from 1
    assert "30/30" in screen and "step/s" in screen  # tqdm's count and rate
    redraws = screen.count("loss ")
    assert redraws >= 4, screen  # mid-epoch redraws show the loss, and each epoch's end
    assert "step 60" in screen and "epoch 0/" not in screen and "step 0 " not in screen


def test_the_loss_is_not_read_between_redraws() -> None:
    # with redraws an hour apart, the loss shows only at each epoch's end
    screen = run_on_a_terminal(refresh=3600)
    assert screen.count("loss ") == 2, screen


def test_bad_refresh_is_refused() -> None:
    with pytest.raises(ValueError, match="refresh= is the seconds between redraws"):
        Progress(refresh=0)

"""Starting real processes from a test: torchrun launches, the command line, and waiting
on what they write.

``from launching import ...`` works from every folder under tests/ (tests/conftest.py
puts tests/ on ``sys.path``, as for helpers.py). A child imports this checkout's
runmodel: ``child_env`` puts it first on ``PYTHONPATH``. It gets no ``COLUMNS``: pytest
imports readline, which sets ``COLUMNS=80`` in the environment, and a child's output goes
to a pipe, where a terminal's width means nothing.

Importing torch costs seconds of CPU a process (``launch`` forks a Python command from a
warm interpreter: ``warm.py``), and a torchrun launch of 2 processes costs two more (its
workers start afresh): a test that can share a launch (a module-scoped fixture), or run
several trainings one after another in the processes of one launch, is much faster.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import warm

ROOT = Path(__file__).resolve().parents[1]
#: A launch that hangs fails its test after this many seconds rather than never ending
#: (a 2-process launch takes 5 to 30 s here: 10x that and more, for a busy machine).
LIMIT_S = 300
RUNMODEL = (sys.executable, "-m", "runmodel")


def child_env(*paths: str | os.PathLike[str], **extra: str) -> dict[str, str]:
    """This process's environment for a child: ``paths`` and this checkout first on
    ``PYTHONPATH``, one OpenMP thread a process (2 shared cores), UTF-8 output, no
    ``COLUMNS``, no torchrun run id of an enclosing launch; then ``extra``."""
    path = os.pathsep.join(
        [*map(str, paths), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8", "PYTHONPATH": path}
    for name in ("COLUMNS", "TORCHELASTIC_RUN_ID"):
        env.pop(name, None)
    return {**env, **extra}


def torchrun_args(
    script: str | os.PathLike[str],
    *args: str | os.PathLike[str],
    processes: int = 2,
    options: Sequence[str] = (),
) -> list[str]:
    """The command that starts ``script args`` in ``processes`` processes under torchrun
    (``--standalone``; torchrun's own ``options`` before the script)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(processes),
        *options,
        str(script),
        *map(str, args),
    ]


def launch(
    args: Sequence[str | os.PathLike[str]],
    cwd: str | os.PathLike[str],
    *,
    path: Sequence[str | os.PathLike[str]] = (),
    **env: str,
) -> subprocess.Popen[str]:
    """``args`` started in a session of its own (``finish`` kills the whole group if it
    hangs), its output piped as text; ``path`` goes first on its ``PYTHONPATH``, ``env``
    into its environment."""
    return warm.Popen(
        list(map(str, args)),
        cwd=cwd,
        env=child_env(*path, **env),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def finish(process: subprocess.Popen[str], limit_s: float = LIMIT_S) -> tuple[int, str, str]:
    """Wait for ``process``: its exit code, stdout and stderr. One still running after
    ``limit_s`` is killed with its processes, and the test fails showing its stderr."""
    try:
        out, err = process.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"the launch did not end within {limit_s}s:\n{err[-3000:]}")
    return process.returncode, out, err


def wait_for(
    path: str | os.PathLike[str], process: subprocess.Popen[str], limit_s: float = LIMIT_S
) -> bool:
    """Whether ``path`` exists, polled until it does, ``process`` ended, or ``limit_s``
    passed."""
    deadline = time.monotonic() + limit_s
    while not os.path.exists(path) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return os.path.exists(path)


def status(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """A run folder's ``status.json``."""
    loaded: dict[str, Any] = json.loads((Path(folder) / "status.json").read_text())
    return loaded


def sections(err: str, marker: str = "=== run ") -> dict[str, str]:
    """A launch's stderr that ran several trainings one after another, cut where a line
    starts with ``marker`` followed by a training's name (a child prints
    ``=== run NAME ===`` to stderr before each): each name's part."""
    parts: dict[str, str] = {}
    name = ""
    for line in err.splitlines(keepends=True):
        if line.startswith(marker):
            name = line[len(marker) :].strip().strip("= ")
            parts[name] = ""
        elif name:
            parts[name] += line
    return parts

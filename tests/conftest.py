"""Fixtures shared by the tests: ``engine`` and ``device``. The small models and data that
tests share are in helpers.py."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

# one OpenMP thread a process, this one and its children alike (2 shared cores; the
# children forked by warm.py have the one their zygote read at its torch import)
os.environ["OMP_NUM_THREADS"] = "1"
# a terminal's size, where the process that started pytest had one (pytest-xdist's workers
# inherit it): every test sees no terminal, as under CI
for name in ("COLUMNS", "LINES"):
    os.environ.pop(name, None)
    os.unsetenv(name)  # (readline sets them in the C environment alone)
# the fresh interpreters the tests start (torchrun's workers, sweep trials, ...) compile
# runmodel's modules and the tests' once, into a cache of their own, not at every start
# (where PYTHONDONTWRITEBYTECODE is set, as on CI), and write nothing beside the sources
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
os.environ["PYTHONPYCACHEPREFIX"] = os.path.join(
    tempfile.gettempdir(), f"runmodel-tests-pycache-{os.getuid()}"
)

import runmodel  # noqa: E402  (after the environment above: its children inherit it)

# helpers.py is importable from every test folder, whatever pytest's import mode
TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)


@pytest.fixture
def engine() -> runmodel.Engine:
    return runmodel.Engine()


@pytest.fixture(params=["cpu", "cuda"])
def device(request: pytest.FixtureRequest) -> str:
    """The devices a test means to run on: the CPU, and CUDA where torch has it (the
    ``cuda`` case is skipped elsewhere)."""
    if request.param == "cuda":
        import torch

        if not torch.cuda.is_available():
            pytest.skip("no CUDA device: torch.cuda.is_available() is False")
    return request.param

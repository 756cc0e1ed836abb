"""Fixtures shared by the tests: ``engine`` and ``device``. The small models and data that
tests share are in helpers.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import runmodel

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

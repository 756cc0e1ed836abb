"""The tree stays ruff-clean and ruff-formatted (configuration in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def ruff() -> str:
    """The ruff program: the dev extra installs it, and a tree not checked is no pass."""
    found = shutil.which("ruff")
    assert found is not None, "ruff is not on PATH: pip install -e '.[dev]' (these tests run)"
    return found


def test_ruff_clean() -> None:
    result = subprocess.run(
        [ruff(), "check", "runmodel", "tests", "benchmarks", "examples"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_formatted() -> None:
    result = subprocess.run(
        [ruff(), "format", "--check", "runmodel", "tests", "benchmarks", "examples"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr

"""The examples run as users run them: as scripts, in a fresh process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_quickstart_converges_and_prints_the_table() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "quickstart.py")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "converged after" in result.stdout
    assert "stopped:" in result.stdout
    assert "epoch_end       1  report" in result.stdout

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


def code_lines(path: Path) -> int:
    """Lines that are not blank, not comments and not the module docstring."""
    import ast

    text = path.read_text()
    doc = ast.parse(text).body[0]
    return sum(1 for i, line in enumerate(text.splitlines(), 1)
               if line.strip() and not line.strip().startswith("#")
               and not doc.lineno <= i <= doc.end_lineno)


def test_the_everyday_packs_script_trains_digits_in_25_lines(tmp_path: Path) -> None:
    script = ROOT / "examples" / "digits_packs.py"
    assert code_lines(script) <= 25
    result = subprocess.run([sys.executable, str(script), "--epochs", "4"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    progress = [line for line in result.stderr.splitlines() if line.startswith("train epoch")]
    assert len(progress) == 4 and all("eval_accuracy" in line for line in progress)
    assert result.stdout.startswith("completed after 4 epochs (all epochs ran); test accuracy ")
    accuracy = float(result.stdout.rstrip().rpartition(" ")[2].rstrip("%"))
    assert accuracy > 85
    folder = tmp_path / "runs" / "digits-packs"
    assert sorted(p.name for p in (folder / "checkpoints").glob("ckpt-*.pt")) == [
        "ckpt-00003-0000000069.pt", "ckpt-00004-0000000092.pt"]
    assert len(list((folder / "checkpoints").glob("best-eval_accuracy=*.pt"))) == 1
    assert list((folder / "tensorboard").glob("events.out.tfevents.*"))

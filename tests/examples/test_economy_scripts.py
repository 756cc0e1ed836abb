"""The five experiment scripts of benchmarks/economy: the line counts benchmarks/README.md
claims are the files' (so the claim cannot silently rot) and within the targets; the GAN
script runs as a user runs it."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

import warm as subprocess

ROOT = Path(__file__).resolve().parents[2]
ECONOMY = ROOT / "benchmarks" / "economy"
_spec = importlib.util.spec_from_file_location("economy_count", ECONOMY / "count.py")
assert _spec is not None and _spec.loader is not None
_count = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_count)
SCRIPTS, code_lines = _count.SCRIPTS, _count.code_lines

#: Each script's bound: below the shorter of PyTorch Lightning's and pytorch-ignite's
#: versions (the GAN at most 35), and 140 lines over the five.
BOUNDS = {
    "e1_digits.py": 38,
    "e2_unfreeze.py": 45,
    "e3_gan.py": 35,
    "e4_throughput.py": 18,
    "e5_resume.py": 41,
}


def _claimed() -> dict[str, int]:
    """The runmodel column of benchmarks/README.md's economy table."""
    text = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| E\d \| `(e\d_\w+\.py)`: [^|]+\| (\d+) \|", text, re.MULTILINE)
    total = re.search(r"^\| \| total \| (\d+) \|", text, re.MULTILINE)
    assert total is not None, "benchmarks/README.md lost the economy table's total row"
    return {**{name: int(count) for name, count in rows}, "total": int(total.group(1))}


def test_line_counts_are_the_files_and_within_the_targets() -> None:
    counts = {name: code_lines(ECONOMY / name) for name in SCRIPTS}
    counts["total"] = sum(counts.values())
    assert _claimed() == counts, "update the table in benchmarks/README.md"
    assert all(counts[name] <= bound for name, bound in BOUNDS.items()), counts
    assert counts["total"] <= 140


def test_line_counter_skips_blank_comment_and_docstring_lines(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text(
        '"""Module\ndoc."""\n\nimport os  # counted\n# not counted\n\n'
        'def f(\n    x,\n):\n    """Doc."""\n    return (x\n            + 1)\n'
    )
    assert code_lines(script) == 6


def test_gan_script_runs(tmp_path: Path) -> None:
    """E3 uses most of the short forms: from_parts without optimizer or loss, an override
    whose returned dict is the step's result, a progress display by default (none here:
    the output is not a terminal). ~12 s; the others run alike (benchmarks/README.md)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(ECONOMY / "e3_gan.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.fullmatch(r"d_loss \d\.\d{4}  g_loss \d\.\d{4}\n", done.stdout)
    assert "train epoch" not in done.stderr

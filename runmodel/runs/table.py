"""Run folders as files: what a run folder holds, its status, and the table of runs
that ``runmodel runs`` prints. Config runs (``config_run.py``) and script runs
(``engine.run(..., run_dir=PATH)``) write the same folder."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._io import read_json
from ..checkpoint import checkpoints_in
from .folder import is_run, is_script_run, read_status

__all__ = ["RunInfo", "flatten", "list_runs", "runs_table"]


def described(directory: Path) -> dict[str, Any]:
    """What ``runmodel runs`` compares runs by: a config run's config, with the epochs and
    steps it has now (an extension changes them); a script run's script, arguments and
    length."""
    status = read_status(directory)
    if is_script_run(directory):
        record = read_json(directory / "run.json")
        return {"script": Path(str(record.get("script"))).name,
                "args": " ".join(map(str, record.get("argv") or [])),
                "epochs": record.get("epochs"), "steps": record.get("steps")}
    config = read_json(directory / "config.json")
    for key in ("epochs", "steps"):
        if status.get(key) is not None:
            config[key] = status[key]
    return config


_LOGGED_STEP = re.compile(r" step (\d+)")


def steps_done(directory: Path) -> int | None:
    """The steps a run got to: its result's, else (a killed or interrupted run) the run
    log's last line that names a step, else its newest checkpoint's."""
    result = read_json(directory / "metrics.json")
    status = read_status(directory)
    if result.get("steps") is not None and status.get("status") == "finished":
        return int(result["steps"])
    try:
        lines = (directory / "run.log").read_text().splitlines()
    except OSError:
        lines = []
    for line in reversed(lines):
        if (found := _LOGGED_STEP.search(line)) is not None:
            return int(found.group(1))
    for path in checkpoints_in(directory / "checkpoint"):
        return int(path.stem.rsplit("-", 1)[1])
    return result.get("steps")


@dataclass
class RunInfo:
    """A run directory as ``runmodel runs`` shows it."""

    path: Path
    config: dict[str, Any]
    status: str
    metrics: dict[str, Any]
    steps: int | None
    name: str = ""  # its path under the listed folder


def list_runs(root: str | os.PathLike[str] = "runs") -> list[RunInfo]:
    """Every run folder under ``root`` at any depth (config and script runs), grouped by
    the folder that holds them (a sweep's trials together), by start time. A sweep's
    folder (``sweep.json``) lists its trials by its metric, best first."""
    found = []
    root = Path(root)
    folders = {p.parent for name in ("config.json", "run.json") for p in root.rglob(name)}
    for directory in sorted(d for d in folders if is_run(d)):
        status = read_status(directory)
        result = read_json(directory / "metrics.json")
        found.append(RunInfo(directory, described(directory), status.get("status", "unknown"),
                             result.get("metrics", {}), steps_done(directory)))
    found.sort(key=lambda run: (str(run.path.parent), read_json(
        run.path / "status.json").get("started", 0)))
    sweep = read_json(root / "sweep.json")
    if sweep.get("metric"):
        metric, sign = sweep["metric"], -1 if sweep.get("direction", "max") == "max" else 1
        found.sort(key=lambda run: (not isinstance(run.metrics.get(metric), (int, float)),
                                    sign * (run.metrics.get(metric) or 0)))
    for run in found:
        run.name = str(run.path.relative_to(root))
    return found


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        flat: dict[str, Any] = {}
        for key, value in data.items():
            flat.update(flatten(value, f"{prefix}{key}."))
        return flat
    return {prefix[:-1]: json.dumps(data) if isinstance(data, list) else data}


def runs_table(runs: list[RunInfo]) -> str:
    """A table of runs: name, status, the config values that differ, final metrics."""
    if not runs:
        return "no runs"
    flats = [flatten(run.config) for run in runs]
    keys = sorted({k for flat in flats for k in flat})
    differing = [k for k in keys if len({repr(flat.get(k)) for flat in flats}) > 1]
    metric_names = sorted({m for run in runs for m in run.metrics})
    header = ["run", "status", *differing, "steps", *metric_names]
    rows = [header]
    for run, flat in zip(runs, flats, strict=True):
        rows.append([run.name or run.path.name, run.status,
                     *(str(flat.get(k, "-")) for k in differing),
                     str(run.steps if run.steps is not None else "-"),
                     *(_fmt(run.metrics.get(m)) for m in metric_names)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)

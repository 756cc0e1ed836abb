"""Run folders read back, and the table of runs that ``runmodel runs`` prints.

Config runs (``config_run.py``), model sources' runs (``source_run.py``) and script runs
(``engine.run(..., run_dir=PATH)``) write the same folder; what is read here is JSON and
the run log, never a tensor, so listing runs imports no torch (``runmodel runs`` answers
at once). ``runs/plot.py`` reads run folders through the same readers (``described``,
``flatten``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._io import read_json
from ..checkpoint.names import checkpoints_in, position
from ..core.checks import did_you_mean_aside
from ..session.folder import CONFIG, METRICS, RECORD, STATUS, is_run, is_script_run, read_status

__all__ = [
    "RunInfo",
    "described",
    "flatten",
    "list_runs",
    "runs_table",
    "short_names",
    "terminal_width",
]


def described(directory: Path) -> dict[str, Any]:
    """What runs are compared (and labelled) by: a config run's config, with the epochs
    and steps it has now (an extension changes them); a model source's run's source,
    class, options, seed and length; a script run's script, arguments and length."""
    status = read_status(directory)
    record = read_json(directory / RECORD)
    if record.get("kind") == "source":
        return {
            "source": Path(str(record.get("source")).partition(":")[0]).name,
            "model": record.get("model"),
            "init": record.get("init_options") or {},
            "setup": record.get("setup_options") or {},
            "seed": record.get("seed"),
            "epochs": record.get("epochs"),
            "steps": record.get("steps"),
        }
    if is_script_run(directory):
        return {
            "script": Path(str(record.get("script"))).name,
            "args": " ".join(map(str, record.get("argv") or [])),
            "epochs": record.get("epochs"),
            "steps": record.get("steps"),
        }
    config = read_json(directory / CONFIG)
    for key in ("epochs", "steps"):
        if status.get(key) is not None:
            config[key] = status[key]
    return config


_LOGGED_STEP = re.compile(r" step (\d+)")


def steps_done(directory: Path) -> int | None:
    """The steps a run got to: its result's, else (a killed or interrupted run) the run
    log's last line that names a step, else its newest checkpoint's."""
    result = read_json(directory / METRICS)
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
        return position(path)[1]
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
    #: the iterations its result says it did, where the run counts them
    iterations: int | None = None


def list_runs(root: str | os.PathLike[str] = "runs") -> list[RunInfo]:
    """Every run folder under ``root`` at any depth (config and script runs), grouped by
    the folder that holds them (a sweep's trials together), by start time. A sweep's
    folder (``sweep.json``) lists its trials by its metric, best first."""
    found = []
    root = Path(root)
    folders = {p.parent for name in (CONFIG, RECORD) for p in root.rglob(name)}
    for directory in sorted(d for d in folders if is_run(d)):
        status = read_status(directory)
        result = read_json(directory / METRICS)
        found.append(
            RunInfo(
                directory,
                described(directory),
                status.get("status", "unknown"),
                result.get("metrics", {}),
                steps_done(directory),
                iterations=result.get("iterations"),
            )
        )
    found.sort(
        key=lambda run: (
            str(run.path.parent),
            read_json(run.path / STATUS).get("started", 0),
        )
    )
    sweep = read_json(root / "sweep.json")
    if sweep.get("metric"):
        metric, sign = sweep["metric"], -1 if sweep.get("direction", "max") == "max" else 1
        found.sort(
            key=lambda run: (
                not isinstance(run.metrics.get(metric), (int, float)),
                sign * (run.metrics.get(metric) or 0),
            )
        )
    for run in found:
        run.name = str(run.path.relative_to(root))
    return found


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Nested tables as dotted keys (``optimizer.args.lr``); a list as its JSON text."""
    if isinstance(data, dict):
        flat: dict[str, Any] = {}
        for key, value in data.items():
            flat.update(flatten(value, f"{prefix}{key}."))
        return flat
    return {prefix[:-1]: json.dumps(data) if isinstance(data, list) else data}


def short_names(keys: Sequence[str]) -> dict[str, str]:
    """Each dotted key by its shortest ending that no other key shares
    (``optimizer.args.lr`` -> ``lr``)."""
    names = {}
    for key in keys:
        parts = key.split(".")
        for n in range(1, len(parts) + 1):
            name = ".".join(parts[-n:])
            if not any(
                other != key and (other == name or other.endswith("." + name)) for other in keys
            ):
                break
        names[key] = name
    return names


# -- the table ----------------------------------------------------------------------------------

#: Space between columns, and the narrowest a column is folded to.
GAP, NARROWEST = 2, 8
_BREAK_AFTER = re.compile(r"(?<=[-_./,= ])")


def terminal_width() -> int:
    """The width to fit the table to: ``COLUMNS`` where set, else the terminal's when
    the output is one; 0 (no limit) when it goes to a file or a pipe."""
    given = os.environ.get("COLUMNS", "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    if sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return 0


def runs_table(runs: list[RunInfo], width: int = 0, columns: Sequence[str] | None = None) -> str:
    """A table of runs: name, status, the config values that differ, steps, final
    metrics; or the ``columns`` named (``run``, ``status``, ``steps``, a config key or its
    last parts, a metric), in their order. With ``width``, wide columns are folded (their
    cells over several lines) until the table fits, none narrower than 8 characters."""
    if not runs:
        return "no runs"
    flats = [flatten(run.config) for run in runs]
    available = _columns(runs, flats)
    if columns is None:
        keys = sorted({k for flat in flats for k in flat})
        differing = [k for k in keys if len({repr(flat.get(k)) for flat in flats}) > 1]
        metrics = sorted({m for run in runs for m in run.metrics})
        chosen = ["run", "status", *differing, "steps", *metrics]
    else:
        chosen = [_column_named(name, list(available)) for name in columns]
    header = chosen
    rows = [available[name] for name in chosen]
    cells = [list(column) for column in zip(*rows, strict=True)]
    natural = [max(len(header[i]), *(len(row[i]) for row in cells)) for i in range(len(header))]
    widths = _fitted(natural, width)
    lines = _rows(header, widths)
    lines.append("  ".join("-" * w for w in widths))
    for row in cells:
        lines += _rows(row, widths)
    return "\n".join(lines)


def _columns(runs: list[RunInfo], flats: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Every column the table can show, by name, with a cell per run."""
    made = {
        "run": [run.name or run.path.name for run in runs],
        "status": [run.status for run in runs],
    }
    for key in sorted({k for flat in flats for k in flat}):
        made[key] = [str(flat.get(key, "-")) for flat in flats]
    made["steps"] = [
        str(run.steps if run.steps is not None else "-")
        + (f" ({run.iterations} it)" if run.iterations is not None else "")
        for run in runs
    ]
    for metric in sorted({m for run in runs for m in run.metrics}):
        made[metric] = [_fmt(run.metrics.get(metric)) for run in runs]
    return made


def _column_named(name: str, available: list[str]) -> str:
    """The column ``name`` names: itself, or the one key it is the last parts of
    (``lr``: ``optimizer.args.lr``); anything else is a ``ValueError`` saying what is
    there."""
    if name in available:
        return name
    ending = [key for key in available if key.endswith("." + name)]
    if len(ending) == 1:
        return ending[0]
    if ending:
        raise ValueError(f"--columns: {name!r} is the end of {', '.join(ending)}: name one")
    shown = short_names(available)
    raise ValueError(
        f"--columns: no column {name!r}{did_you_mean_aside(name, shown.values())}; "
        f"the runs have {', '.join(shown[key] for key in available)}"
    )


def _fitted(natural: list[int], width: int) -> list[int]:
    """Column widths that fit ``width`` (0: no limit): the widest columns are narrowed
    first, none below ``NARROWEST`` (or its natural width)."""
    widths = list(natural)
    if width <= 0:
        return widths
    floor = [min(w, NARROWEST) for w in natural]
    while sum(widths) + GAP * (len(widths) - 1) > width:
        widest = max(range(len(widths)), key=lambda i: widths[i] - floor[i])
        if widths[widest] <= floor[widest]:
            break  # as narrow as columns go: the terminal wraps the rest
        widths[widest] -= 1
    return widths


def _rows(cells: Sequence[str], widths: Sequence[int]) -> list[str]:
    """One row of the table, each cell folded to its column's width: as many lines as
    its tallest cell."""
    folded = [fold(cell, width) for cell, width in zip(cells, widths, strict=True)]
    height = max(len(lines) for lines in folded)
    return [
        (" " * GAP)
        .join(
            (lines[i] if i < len(lines) else "").ljust(width)
            for lines, width in zip(folded, widths, strict=True)
        )
        .rstrip()
        for i in range(height)
    ]


def fold(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` characters, broken after a ``-_./,=`` or a
    space where one is near the end of a line, else anywhere."""
    lines = []
    while len(text) > width:
        breaks = [m.start() for m in _BREAK_AFTER.finditer(text, 1, width)]
        cut = breaks[-1] if breaks and breaks[-1] > width // 2 else width
        lines.append(text[:cut].rstrip())
        text = text[cut:].lstrip()
    lines.append(text)
    return lines


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)

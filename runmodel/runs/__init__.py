"""Runs and their folders.

Below the engine, what every run has: its folder and the one writer of its files
(``folder``), and the one way a run is interrupted (``interrupt``). Above the engine,
what runs a config or a script: a config run in the folder derived from its config
(``config_run``), scripts run by the command (``script``), evaluation of a trained run
(``evaluate``), the table of runs (``table``) and their plots (``plot``).

The names below are imported on first use: ``runmodel.runs.folder`` is imported by the
engine, which the config runs import in turn.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    **dict.fromkeys(
        (
            "INTERRUPTED",
            "PreparedRun",
            "RunExists",
            "execute",
            "prepare",
            "resume_dir",
            "run_dir_for",
        ),
        "config_run",
    ),
    **dict.fromkeys(("RunInfo", "list_runs", "runs_table"), "table"),
    "read_status": "folder",
}

__all__ = [
    "INTERRUPTED",
    "PreparedRun",
    "RunExists",
    "RunInfo",
    "execute",
    "list_runs",
    "prepare",
    "read_status",
    "resume_dir",
    "run_dir_for",
    "runs_table",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if TYPE_CHECKING:
    from .config_run import (
        INTERRUPTED,
        PreparedRun,
        RunExists,
        execute,
        prepare,
        resume_dir,
        run_dir_for,
    )
    from .folder import read_status
    from .table import RunInfo, list_runs, runs_table

"""Runs and their folders, above the engine: a config run in the folder derived from its
config (``config_run``), a run folder's files, status and the table of runs
(``folder``). A run started from a script with ``engine.run(..., run_dir=PATH)`` writes
the same folder. ``config/`` keeps registries and configs as data, below the engine."""

from .config_run import (
           INTERRUPTED,
           PreparedRun,
           RunExists,
           execute,
           prepare,
           resume_dir,
           run_dir_for,
)
from .folder import RunInfo, list_runs, read_status, runs_table

__all__ = ["INTERRUPTED", "PreparedRun", "RunExists", "RunInfo", "execute", "list_runs",
           "prepare", "read_status", "resume_dir", "run_dir_for", "runs_table"]

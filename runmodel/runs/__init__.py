"""Runs in folders, above the engine: a config's or a model source's run in the folder
derived from it (``folder_run``: the one preparer; ``config_run`` and ``source_run``:
what each kind supplies), what the ``runmodel`` command runs (``target``: a config, a
model source, a script; ``script``: a script run up to its ``engine.run``), evaluation
with a trained run's weights (``weights``), the table of runs (``table``) and their plots
(``plot``), export (``export``), the learning-rate finder (``lr_find``), the check that a
resume is exact (``check_resume``, with the process it starts: ``check_resume_child``),
and what runs under torchrun (``torchrun``). What every run has, its folder's writer and
the interrupt path, is below the engine, in ``runmodel.session``.

The names below are imported on first use, so that listing runs (``runmodel runs``)
imports no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.exports import lazy_exports

__all__ = [
    "ConfigKind",
    "FolderRun",
    "RunExists",
    "RunInfo",
    "RunKind",
    "SourceKind",
    "execute",
    "list_runs",
    "prepare",
    "prepare_in_folder",
    "read_status",
    "resume_dir",
    "run_dir_for",
    "runs_table",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        **dict.fromkeys(("ConfigKind", "execute", "prepare", "resume_dir"), ".config_run"),
        **dict.fromkeys(
            ("FolderRun", "RunKind", "prepare_in_folder", "run_dir_for"), ".folder_run"
        ),
        "SourceKind": ".source_run",
        **dict.fromkeys(("RunInfo", "list_runs", "runs_table"), ".table"),
        **dict.fromkeys(("RunExists", "read_status"), "runmodel.session.folder"),
    },
    deprecated={"PreparedRun": "runmodel.runs.folder_run.FolderRun"},
)

if TYPE_CHECKING:
    from ..session.folder import RunExists, read_status
    from .config_run import ConfigKind, execute, prepare, resume_dir
    from .folder_run import FolderRun, RunKind, prepare_in_folder, run_dir_for
    from .folder_run import FolderRun as PreparedRun  # noqa: F401  (deprecated)
    from .source_run import SourceKind
    from .table import RunInfo, list_runs, runs_table

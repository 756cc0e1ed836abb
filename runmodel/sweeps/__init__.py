"""``runmodel sweep CONFIG``: many config runs searched, pruned, resumed and compared, on
Optuna (``pip install 'runmodel[sweep]'``).

    runs/<sweep>/                 the sweep's folder, under --runs-dir
        sweep.json                its definition, its counts and its best trial
        study.journal             Optuna's journal storage (safe with several writers)
        trial-0003.log            what trial 3's process printed
        digits-hidden64_..._<h>/  one ordinary config run per trial, named by its values

Every trial is a config run of the sweep's config with the trial's values set, in a
process of its own; the sweep's process asks Optuna for each trial and hands out exactly
the trials asked for (ask and tell). A trial process reports the metric to its trial at
each epoch's end, so the pruner can stop it; it then tells the trial's end itself. Running
the same command again continues the sweep: a trial whose process is gone (Ctrl-C,
SIGKILL) resumes from its own checkpoint; raising ``trials`` extends it.

The modules, by job: ``spec`` (the ``[sweep]`` table, checked), ``study`` (the one
adapter over Optuna's storage), ``probe`` (the metric checked against what a run
records), ``trial`` (a trial's process; ``python -m runmodel.sweeps JOB`` runs it) and
``scheduler`` (the sweep's process: jobs, reaping, heartbeats, owners).
"""

from __future__ import annotations

from .scheduler import FAILURES_IN_A_ROW, SweepFailed, SweepResult, sweep
from .spec import SPACES, SweepError, SweepSpec, distribution, parse_param, read_spec
from .trial import PRUNED, ReportToTrial

__all__ = [
    "FAILURES_IN_A_ROW",
    "PRUNED",
    "SPACES",
    "ReportToTrial",
    "SweepError",
    "SweepFailed",
    "SweepResult",
    "SweepSpec",
    "distribution",
    "parse_param",
    "read_spec",
    "sweep",
]

"""A trial's process (``python -m runmodel.sweeps JOB``): the config run with the trial's
values, reporting the metric to the trial at each epoch's end so that the pruner can stop
it, then telling the study how the trial ended.

The process stops with the sweep that started it: it asks Linux for a SIGINT when its
parent dies (``PR_SET_PDEATHSIG``), which ends the run as Ctrl-C does (the step finished,
a checkpoint saved, the trial left running for the next start to resume).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import signal
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..backends.distributed import env
from ..core import Hook, HookOptions, Pack
from ..runs import prepare, read_status, run_dir_for
from ..session.folder import CONFIG, mark
from .spec import SweepSpec, close_to, trial_config
from .study import SweepStudy

__all__ = ["PRUNED", "ReportToTrial", "main", "process", "stop_with_parent"]

PRUNED = "pruned by the sweep's pruner"
PR_SET_PDEATHSIG = 1  # linux/prctl.h


class ReportToTrial(Pack):
    """Reports the sweep's metric to the Optuna trial at each epoch's end, and stops the
    run when the pruner says the trial has fallen behind. In a run in several processes
    rank 0 reports and asks the pruner, and passes its decision to the others (one
    broadcast an epoch), so that they all stop at the same step."""

    name = "sweep_trial"

    def __init__(self, trial: Any, metric: str) -> None:
        self.trial, self.metric = trial, metric
        self.reads = [metric]  # a name a typo away from a declared one stops it at setup

    def hooks(self) -> Any:
        yield Hook(
            self.report, "epoch_end", HookOptions.of(name="sweep_trial.report", priority=-100)
        )  # after the metrics' hooks

    def report(self, engine: Any) -> None:
        prune = False
        if engine.state.rank == 0:
            value = engine.state.metrics.get(self.metric)
            if value is not None:
                self._report(float(value), engine.state.epoch)
                prune = self.trial.should_prune()
        prune = env.broadcast_from_0(prune)
        if prune:
            engine.stop(PRUNED)

    def _report(self, value: float, epoch: int) -> None:
        from optuna.exceptions import UpdateFinishedTrialError

        try:
            self.trial.report(value, epoch)
        except UpdateFinishedTrialError:  # its values run again elsewhere, from this folder
            raise RuntimeError(
                f"trial {self.trial.number} was failed by another sweep "
                f"process: its heartbeat came late"
            ) from None


def stop_with_parent(parent: int | None) -> None:
    """Have Linux send this process SIGINT when its parent dies, so that a trial never
    trains on beside the trial a restarted sweep starts; if ``parent`` (the pid that
    started it) is gone already, as if it had. Elsewhere than Linux: nothing."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGINT, 0, 0, 0)
    if parent is not None and os.getppid() != parent:  # it died before prctl
        os.kill(os.getpid(), signal.SIGINT)


def process(argv: list[str]) -> int:
    """``python -m runmodel.sweeps [--torchrun N] JOB``: the trial ``JOB`` (JSON) in this
    process, or, with ``--torchrun N``, in N processes that torchrun starts in its
    place (stopped with the sweep as this one would be: the agent passes the SIGINT on)."""
    if argv[0] == "--torchrun":
        nproc, job = argv[1], argv[2]
        stop_with_parent(json.loads(job).get("parent"))
        # --standalone: a port of its own, so that trials run side by side
        os.execv(
            sys.executable,
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node",
                nproc,
                "-m",
                "runmodel.sweeps",
                job,
            ],
        )
    return main(json.loads(argv[0]))


def main(job: Mapping[str, Any]) -> int:
    """One trial, in its own process: the config run with the trial's values, then the
    trial's end told to the study. Returns the process's exit code."""
    import optuna

    # a trial in several processes: torchrun's agent is the ranks' parent (it stops them
    # when it gets the SIGINT)
    stop_with_parent(job.get("parent") if not env.launched() else None)
    spec = SweepSpec.from_job(job["spec"])
    folder = Path(job["folder"])
    number = job["number"]
    # a trial in several processes (torchrun): rank 0 alone tells the study
    lead = env.rank() == 0
    study = SweepStudy.open(spec, folder)
    trial = study.live(number)
    if lead:
        study.set(number, "owner", owner())
    try:
        config = trial_config(spec, trial.params)
        run_dir = run_dir_for(config, folder)
        take_over = _take_over(run_dir, job.get("retries"), lead)
        prepared = prepare(
            config,
            folder,
            resume=False,
            take_over=take_over,
            progress=False,
            packs=[ReportToTrial(trial, spec.metric)],
            base=spec.config.parent,
        )
        if lead:
            print(
                f"trial {number}: {dict(trial.params)} in {prepared.directory}"
                + (f" (resuming from {prepared.checkpoint})" if prepared.checkpoint else ""),
                flush=True,
            )
        result = prepared.run()
    except KeyboardInterrupt:  # Ctrl-C, or the sweep died: the next start resumes it
        return 130
    except Exception as error:
        text = f"{type(error).__name__}: {error}"
        if not lead:
            print(f"trial {number} [rank {env.rank()}] failed: {text}", file=sys.stderr, flush=True)
            return 1
        study.set(number, "error", text)
        study.tell(number, state=optuna.trial.TrialState.FAIL)
        print(f"trial {number} failed: {text}", file=sys.stderr, flush=True)
        return 1
    if not lead:
        return 0
    return tell(study, number, result.reason, result.metrics, spec.metric, prepared.directory)


def _take_over(run_dir: Path, retries: Mapping[str, Any] | None, lead: bool) -> bool:
    """Whether this trial continues the run in ``run_dir`` (from its newest checkpoint,
    else from the start): a run of this trial's values left interrupted or failed, or
    left ``running`` by the process of a trial that Optuna failed for its stopped
    heartbeat (``retries``: that trial's number and owner), on another machine."""
    if not (run_dir / CONFIG).exists():
        if retries is not None and lead:
            print(
                f"retrying trial {retries['number']} of {retries['owner'].get('host')}: "
                f"its run folder is not on this machine (a runs folder that is not shared): "
                f"starting over",
                flush=True,
            )
        return False
    status = read_status(run_dir)
    state = status.get("status")
    if state in ("interrupted", "failed"):
        return True
    held_by = (retries or {}).get("owner") or {}
    if (
        state == "running"
        and status.get("host") != socket.gethostname()
        and (status.get("host"), status.get("pid")) == (held_by.get("host"), held_by.get("pid"))
    ):
        if lead:
            print(
                f"retrying trial {retries['number']} (no heartbeat from "  # type: ignore[index]
                f"{held_by.get('host')}): taking its run folder over",
                flush=True,
            )
        return True
    return False  # running here, or by a living trial elsewhere: the claim refuses it


def tell(
    study: SweepStudy,
    number: int,
    reason: str | None,
    metrics: Mapping[str, Any],
    metric: str,
    run_dir: Path,
) -> int:
    """Tell the study how trial ``number``'s run ended: pruned, complete with the value
    of ``metric`` it recorded, or failed without one. Returns the process's exit code."""
    from optuna.trial import TrialState

    if reason == PRUNED:
        mark(run_dir, "pruned")
        study.tell(number, state=TrialState.PRUNED)
        return 0
    value = metrics.get(metric)
    if not isinstance(value, (int, float)) or math.isnan(value):
        text = (
            f"the run recorded no metric {metric!r}{close_to(metric, list(metrics))}; "
            f"it recorded: {', '.join(metrics) or 'none'}"
            if value is None
            else f"{metric} is {value!r}"
        )
        study.set(number, "error", text)
        study.tell(number, state=TrialState.FAIL)
        print(f"trial {number} failed: {text}", file=sys.stderr, flush=True)
        return 1
    study.tell(number, float(value))
    return 0


def owner() -> dict[str, Any]:
    """Who runs a trial: this host and process, and when the process started."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "since": started(pid)}


def started(pid: int) -> str | None:
    """When process ``pid`` started (Linux's clock ticks since boot), to tell a reused pid
    from the process that held it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def alive(owner: Mapping[str, Any]) -> bool:
    """Whether the process ``owner`` names still runs; one of another host is taken as
    alive (only a database storage's heartbeat tells otherwise)."""
    if owner.get("host") != socket.gethostname():
        return True
    try:
        os.kill(int(owner["pid"]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, KeyError, ValueError, TypeError):
        return True
    return owner.get("since") in (None, started(int(owner["pid"])))

"""The sweep's process: it asks the study for trials and hands out exactly those asked for,
``jobs`` at a time, each in a process of its own (``trial.py``); it reaps them, keeps
their heartbeats, resumes this host's trials whose process is gone, and writes
``sweep.json``."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .._io import read_json, write_json
from ..core.checks import is_whole_number
from ..runs import read_status, run_dir_for
from ..session.folder import CONFIG, METRICS
from .probe import check_metric
from .spec import SweepError, SweepSpec, distribution, read_spec, trial_config
from .study import GRACE, JOURNAL, Heartbeat, SweepStudy, connect
from .trial import alive, owner

__all__ = ["FAILURES_IN_A_ROW", "SweepFailed", "SweepResult", "sweep"]

#: Failed trials in a row after which the sweep stops: a space where every trial fails
#: must not loop for ever.
FAILURES_IN_A_ROW = 3


class SweepFailed(RuntimeError):
    """A sweep stopped because its trials kept failing."""


@dataclasses.dataclass
class SweepResult:
    """A sweep's end: its folder, its counts by state and its best trial."""

    name: str
    directory: Path
    metric: str
    complete: int
    pruned: int
    failed: int
    best: dict[str, Any] | None  # number, value, params, run_dir


def sweep(
    config: str | os.PathLike[str],
    *,
    params: Mapping[str, Any] | None = None,
    trials: int | None = None,
    metric: str | None = None,
    direction: str | None = None,
    sampler: Any = None,
    pruner: Any = None,
    seed: int | None = None,
    storage: str | None = None,
    jobs: int = 1,
    runs_dir: str | os.PathLike[str] = "runs",
    name: str | None = None,
    overrides: Sequence[str] = (),
    echo: bool = True,
    nproc_per_node: int | None = None,
    heartbeat: int | None = None,
) -> SweepResult:
    """Search ``config``'s ``[sweep]`` (with these values over it) in config runs under
    ``runs_dir/<name>``: ``jobs`` trials at a time, until ``trials`` trials have finished
    (complete or pruned). Running it again continues it. Bad input raises ``SweepError``
    before anything is created; ``FAILURES_IN_A_ROW`` failed trials in a row stop it with
    the last error."""
    if not is_whole_number(jobs, least=1):
        raise SweepError(f"jobs is a whole number >= 1, got {jobs!r}")
    spec = read_spec(
        config,
        params=params,
        overrides=overrides,
        trials=trials,
        metric=metric,
        direction=direction,
        sampler=sampler,
        pruner=pruner,
        seed=seed,
        storage=storage,
        name=name,
        nproc_per_node=nproc_per_node,
        heartbeat=heartbeat,
    )
    folder = Path(runs_dir) / spec.name
    if (folder / CONFIG).exists():
        raise SweepError(
            f"{folder} is a run's folder, not a sweep's; name the sweep another way ([sweep] name)"
        )
    # a database, or the journal of a sweep begun: it is reached, and a sweep of this name
    # with another definition refused, before anything is written
    found = (
        None
        if spec.storage is None and not (folder / JOURNAL).exists()
        else (connect(spec, folder))
    )
    if found is not None:
        SweepStudy.existing(spec, folder, found)
    check_metric(spec)
    folder.mkdir(parents=True, exist_ok=True)
    study = SweepStudy.open(spec, folder, found, create=True)
    return _Sweep(spec, folder, study, jobs, echo).run()


@dataclasses.dataclass
class _Running:
    """A trial's process that this sweep started, or one of this host that a sweep that
    died left running (``process`` None: watched by its pid)."""

    number: int
    run_dir: Path | None
    process: subprocess.Popen[bytes] | None
    heartbeat: Heartbeat | None
    owner: Mapping[str, Any] | None = None

    def ended(self) -> bool:
        if self.process is not None:
            return self.process.poll() is not None
        return not alive(self.owner or {})

    def stop_heartbeat(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()
            self.heartbeat = None


class _Sweep:
    def __init__(
        self, spec: SweepSpec, folder: Path, study: SweepStudy, jobs: int, echo: bool
    ) -> None:
        self.spec, self.folder, self.study, self.jobs, self.echo = (spec, folder, study, jobs, echo)
        self.running: list[_Running] = []  # started here, or adopted (left by a dead sweep)
        self.failures: list[str] = []  # failed trials in a row, their errors
        self.distributions = {k: distribution(k, v) for k, v in spec.params.items()}
        self.me = owner()
        self.checked_stale = 0.0

    def say(self, text: str) -> None:
        if self.echo:
            print(f"sweep {self.spec.name}: {text}", flush=True)

    def run(self) -> SweepResult:
        try:
            while True:
                self.reap()
                if len(self.failures) >= FAILURES_IN_A_ROW:
                    self.wait_all()
                    raise SweepFailed(
                        f"{FAILURES_IN_A_ROW} trials failed in a row; the last: {self.failures[-1]}"
                    )
                self.adopt()
                self.fail_stale()
                counts = self.study.counts()
                done = counts["complete"] + counts["pruned"]
                mine = [r for r in self.running if r.process is not None]
                if done >= self.spec.trials and not mine:
                    break
                free = len(self.running) < self.jobs
                if free and (stale := self.stale()) is not None:
                    self.start(stale.number)
                elif free and done + counts["running"] < self.spec.trials:
                    self.start(self.study.ask(self.distributions))
                elif self.running:
                    time.sleep(0.2)
                else:  # running trials of another machine: wait for them
                    time.sleep(min(2, self.spec.heartbeat))
        except KeyboardInterrupt:
            self.say(
                "interrupted; the running trials save and stop: run the same command to continue"
            )
            self.wait_all(timeout=120)
            self.summarize()
            raise
        finally:
            for running in self.running:
                running.stop_heartbeat()
        return self.summarize()

    def stale(self) -> Any:
        """A running trial of this host whose process is gone: it resumes."""
        from optuna.trial import TrialState

        here = {r.number for r in self.running}
        for trial in self.study.trials(TrialState.RUNNING):
            who = trial.user_attrs.get("owner") or trial.user_attrs.get("asked_by")
            if trial.number not in here and who is not None and not alive(who):
                return trial
        return None

    def adopt(self) -> None:
        """Count against ``jobs`` (and keep the heartbeat of) each running trial of this
        host whose process lives on after the sweep that started it died: a restarted
        sweep never trains a trial beside it."""
        from optuna.trial import TrialState

        here = {r.number for r in self.running}
        for trial in self.study.trials(TrialState.RUNNING):
            who, sweep = trial.user_attrs.get("owner"), trial.user_attrs.get("asked_by")
            if (
                trial.number in here
                or who is None
                or who.get("host") != self.me["host"]
                or not alive(who)
                or (sweep is not None and alive(sweep))
            ):
                continue
            self.running.append(
                _Running(trial.number, None, None, self.study.heartbeat(trial.number), who)
            )
            self.say(
                f"trial {trial.number} still runs here (pid {who.get('pid')}), left by "
                f"a sweep that ended: counted against --jobs {self.jobs} until it stops"
            )

    def fail_stale(self) -> None:
        """Fail the trials whose heartbeat stopped (a database storage), once a heartbeat:
        their copies come back from ``ask``."""
        now = time.monotonic()
        if now - self.checked_stale >= self.spec.heartbeat:
            self.checked_stale = now
            for trial in self.study.fail_stale():
                host = (trial.user_attrs.get("owner") or {}).get("host", "?")
                self.say(
                    f"trial {trial.number} failed: no heartbeat for "
                    f"{GRACE * self.spec.heartbeat} s (its machine {host}, or its "
                    f"sweep, died); its values are tried again"
                )

    def start(self, number: int) -> None:
        trial = self.study.trial(number)
        values = dict(trial.params)
        run_dir = run_dir_for(trial_config(self.spec, values), self.folder)
        while any(r.run_dir == run_dir for r in self.running):  # the same values: wait
            time.sleep(0.2)
            self.reap()
        retries = None
        if (failed := trial.system_attrs.get("failed_trial")) is not None:
            retries = {"number": failed, "owner": trial.user_attrs.get("owner") or {}}
        for key, value in (("asked_by", self.me), ("owner", self.me), ("run_dir", str(run_dir))):
            self.study.set(number, key, value)
        heartbeat = self.study.heartbeat(number)
        if self.reuse(number, run_dir):
            if heartbeat is not None:
                heartbeat.stop()
            return
        job = {
            "spec": self.spec.to_job(),
            "folder": str(self.folder),
            "number": number,
            "parent": os.getpid(),
            "retries": retries,
        }
        log = open(self.folder / f"trial-{number:04d}.log", "ab")  # noqa: SIM115
        nproc = self.spec.nproc_per_node
        torchrun = [] if nproc is None else ["--torchrun", str(nproc)]
        process = subprocess.Popen(
            [sys.executable, "-m", "runmodel.sweeps", *torchrun, json.dumps(job)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.running.append(_Running(number, run_dir, process, heartbeat))
        shown = ", ".join(f"{k}={_show(v)}" for k, v in values.items())
        again = "" if retries is None else f" (retrying trial {retries['number']})"
        self.say(f"trial {number} started{again}: {shown}")

    def reuse(self, number: int, run_dir: Path) -> bool:
        """A trial whose values equal a finished trial's takes that result."""
        from optuna.trial import TrialState

        status = read_status(run_dir).get("status")
        if status not in ("finished", "pruned"):
            return False
        value = read_json(run_dir / METRICS).get("metrics", {}).get(self.spec.metric)
        self.study.set(number, "reused", True)
        if status == "pruned" or value is None:
            self.study.tell(number, state=TrialState.PRUNED)
        else:
            self.study.tell(number, float(value))
        self.say(
            f"trial {number}: the same values as a finished trial; its result reused "
            f"({run_dir.name})"
        )
        self.failures.clear()
        return True

    def reap(self) -> None:
        from optuna.trial import TrialState

        for running in [r for r in self.running if r.ended()]:
            self.running.remove(running)
            running.stop_heartbeat()
            if running.process is None:  # adopted: the next turn resumes it
                self.say(f"trial {running.number}'s process (left by a sweep that ended) stopped")
                continue
            trial = self.study.trial(running.number)
            code = running.process.returncode
            if code == 130 or code == -signal.SIGINT:
                raise KeyboardInterrupt
            if trial.state == TrialState.FAIL:
                error = trial.user_attrs.get("error", f"exit code {code}")
                self.failures.append(error)
                self.say(f"trial {trial.number} failed: {error} (trial-{trial.number:04d}.log)")
            elif trial.state == TrialState.RUNNING:  # killed: it resumes when started again
                self.failures.append(f"trial {trial.number}'s process ended by {_ended(code)}")
                self.say(
                    f"trial {trial.number}'s process ended by {_ended(code)}; it "
                    f"resumes from its checkpoint"
                )
            else:
                self.failures.clear()
                value = "" if trial.value is None else f" {self.spec.metric}={trial.value:.4f}"
                self.say(f"trial {trial.number} {trial.state.name.lower()}{value}")
            self.summarize()

    def wait_all(self, timeout: float | None = None) -> None:
        end = None if timeout is None else time.monotonic() + timeout
        for running in self.running:
            running.stop_heartbeat()
            if running.process is None:
                continue
            try:
                running.process.wait(None if end is None else max(0.1, end - time.monotonic()))
            except (subprocess.TimeoutExpired, KeyboardInterrupt):
                running.process.kill()
                running.process.wait()
        self.running.clear()

    def summarize(self) -> SweepResult:
        """Write ``sweep.json`` and return the sweep's state."""
        from optuna.trial import TrialState

        counts = self.study.counts()
        complete = self.study.trials(TrialState.COMPLETE)
        best = None
        if complete:
            pick = max if self.spec.direction == "max" else min
            top = pick(complete, key=lambda t: t.value)
            best = {
                "number": top.number,
                "value": top.value,
                "params": top.params,
                "run_dir": top.user_attrs.get("run_dir"),
            }
        summary = {
            "name": self.spec.name,
            "metric": self.spec.metric,
            "direction": self.spec.direction,
            "trials": self.spec.trials,
            "params": self.spec.params,
            "config": str(self.spec.config),
            **counts,
            "best": best,
        }
        write_json(self.folder / "sweep.json", summary)
        return SweepResult(
            self.spec.name,
            self.folder,
            self.spec.metric,
            counts["complete"],
            counts["pruned"],
            counts["failed"],
            best,
        )


def _show(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _ended(code: int) -> str:
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"

"""``runmodel sweep CONFIG``: many config runs searched, pruned, resumed and compared, on
Optuna (``pip install 'runmodel[sweep]'``).

    runs/<sweep>/                 the sweep's folder, under --runs-dir
        sweep.json                its definition, its counts and its best trial
        study.journal             Optuna's journal storage (safe with several writers)
        trial-0003.log            what trial 3's process printed
        digits-hidden64_..._<h>/  one ordinary config run per trial, named by its values

Every trial is a config run of the sweep's config with the trial's values set, in a
process of its own; the parent asks Optuna for each trial and hands out exactly the
trials asked for (ask and tell). A trial process reports the metric to its trial at each
epoch's end, so the pruner can stop it; it then tells the trial's end itself. Running
the same command again continues the sweep: a trial whose process is gone (Ctrl-C,
SIGKILL) resumes from its own checkpoint; raising ``trials`` extends it.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .._io import read_json, write_json
from ..checkpoint import checkpoints_in
from ..config.registry import Spec, registries
from ..config.runconfig import (
    ConfigError,
    RunConfig,
    apply_overrides,
    load_config,
    read_config_file,
)
from ..core import Hook, HookOptions, Pack, RunResult, hook
from ..extras import require
from ..runs import INTERRUPTED, prepare, read_status, run_dir_for, torchrun
from ..runs.config_run import import_sources
from ..runs.torchrun import with_backend

__all__ = ["SPACES", "ReportToTrial", "SweepError", "SweepFailed", "SweepResult", "SweepSpec",
           "parse_param", "read_spec", "sweep"]

#: The search spaces of ``[sweep.params]``, as Optuna distributions.
SPACES = ("uniform", "log_uniform", "int", "choice")
SAMPLERS = {"tpe": "TPESampler", "random": "RandomSampler"}
PRUNERS = {"median": "MedianPruner", "percentile": "PercentilePruner",
           "hyperband": "HyperbandPruner", "successive_halving": "SuccessiveHalvingPruner",
           "none": "NopPruner"}
_KEYS = ("name", "metric", "direction", "trials", "params", "sampler", "pruner", "seed",
         "storage", "nproc_per_node")
#: Failed trials in a row after which the sweep stops: a space where every trial fails
#: must not loop for ever.
FAILURES_IN_A_ROW = 3
PRUNED = "pruned by the sweep's pruner"
JOURNAL = "study.journal"


class SweepError(ValueError):
    """A sweep that cannot start: bad input, found before anything is created."""


class SweepFailed(RuntimeError):
    """A sweep stopped because its trials kept failing."""


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    """A sweep, checked: the config it varies and how it searches."""

    config: Path
    name: str
    metric: str
    direction: str  # "max" or "min"
    trials: int
    params: dict[str, Any]  # dotted config key -> space, as written
    sampler: Spec
    pruner: Spec
    seed: int
    storage: str | None
    overrides: tuple[str, ...] = ()
    #: each trial a run in this many processes (torchrun, the ddp backend or the
    #: config's own); None: one process
    nproc_per_node: int | None = None

    def definition(self) -> dict[str, Any]:
        """What makes two runs of the command the same sweep (not ``trials``)."""
        return {"config": str(self.config), "metric": self.metric,
                "direction": self.direction, "params": self.params,
                "overrides": list(self.overrides)}


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


# -- reading and checking ------------------------------------------------------------------

def read_spec(config: str | os.PathLike[str], *, params: Mapping[str, Any] | None = None,
              overrides: Sequence[str] = (), **given: Any) -> SweepSpec:
    """The sweep of ``config``'s ``[sweep]`` table with ``given`` values (``trials=``,
    ``metric=``, ...) and ``params`` over it; every mistake is a ``SweepError`` naming
    it, raised before anything is created."""
    path = Path(config)
    try:
        data = read_config_file(path)
    except ConfigError as error:
        raise SweepError(str(error)) from None
    table = data.pop("sweep", None) or {}
    if not isinstance(table, dict):
        raise SweepError(f"{path}: [sweep] must be a table, got {table!r}")
    unknown = [key for key in (*table, *given) if key not in _KEYS]
    if unknown:
        raise SweepError(f"[sweep] has no key {unknown[0]!r}{_close(unknown[0], _KEYS)}; "
                         f"valid keys: {', '.join(_KEYS)}")
    values = {**table, **{k: v for k, v in given.items() if v is not None}}
    spaces = {**(values.get("params") or {}), **(params or {})}
    if not spaces:
        raise SweepError("a sweep needs parameters to search: [sweep.params] in the config "
                         "or --param KEY=SPACE, as in --param 'optimizer.args.lr={log_uniform "
                         "= [1e-4, 1e-1]}'")
    try:
        base = RunConfig.from_dict(apply_overrides(data, overrides), source=str(path))
    except ConfigError as error:
        raise SweepError(str(error)) from None
    metric = values.get("metric")
    if not isinstance(metric, str) or not metric:
        raise SweepError("a sweep needs the metric it optimizes: metric = \"eval_accuracy\" "
                         "in [sweep], or --metric NAME")
    direction = values.get("direction", "max")
    if direction not in ("max", "min"):
        raise SweepError(f"direction is 'max' or 'min', got {direction!r}")
    trials = values.get("trials", 10)
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise SweepError(f"trials is a whole number >= 1 (the finished trials wanted), "
                         f"got {trials!r}")
    seed = values.get("seed", base.seed)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise SweepError(f"seed is a whole number, got {seed!r}")
    sampler = _choice("sampler", values.get("sampler", "tpe"), SAMPLERS)
    pruner = _choice("pruner", values.get("pruner", "median"), PRUNERS)
    for key, space in spaces.items():
        distribution(key, space)
    _check_keys(path, data, base, spaces, overrides)
    name = values.get("name") or path.stem
    if not isinstance(name, str) or not name.strip(".") or "/" in name or "\\" in name:
        raise SweepError(f"name is a folder name, got {name!r}")
    storage = values.get("storage")
    nproc = values.get("nproc_per_node")
    if nproc is not None and (isinstance(nproc, bool) or not isinstance(nproc, int)
                              or nproc < 1):
        raise SweepError(f"nproc_per_node is a whole number >= 1 (each trial's processes), "
                         f"got {nproc!r}")
    if nproc is not None and nproc > 1:
        try:
            with_backend(base, None)
        except ValueError as error:
            raise SweepError(str(error)) from None
    return SweepSpec(path.resolve(), name, metric, direction, trials, spaces, sampler, pruner,
                     seed, storage, tuple(overrides), nproc if nproc != 1 else None)


def _close(word: str, choices: Sequence[str]) -> str:
    found = difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean {found[0]!r}?)" if found else ""


def _choice(kind: str, value: Any, known: Mapping[str, str]) -> Spec:
    try:
        spec = Spec.of(value, kind)
    except (TypeError, ValueError) as error:
        raise SweepError(str(error)) from None
    if spec.type_ not in known:
        raise SweepError(f"unknown {kind} {spec.type_!r}{_close(spec.type_, list(known))}; "
                         f"known: {', '.join(known)}")
    return spec


def distribution(key: str, space: Any) -> Any:
    """The Optuna distribution of ``space`` (``{log_uniform = [1e-4, 1e-1]}``...)."""
    require("optuna", needed_by="runmodel sweep")
    from optuna import distributions as d

    shape = (f"{key}: a space is {{uniform = [LOW, HIGH]}}, {{log_uniform = [LOW, HIGH]}}, "
             f"{{int = [LOW, HIGH]}} or {{choice = [A, B, ...]}}")
    if not isinstance(space, dict) or len(space) != 1 or next(iter(space)) not in SPACES:
        raise SweepError(f"{shape}; got {space!r}")
    kind, bounds = next(iter(space.items()))
    if kind == "choice":
        if not isinstance(bounds, list) or not bounds:
            raise SweepError(f"{key}: choice needs a non-empty list of values, got {bounds!r}")
        if not all(v is None or isinstance(v, (bool, int, float, str)) for v in bounds):
            raise SweepError(f"{key}: choice values are numbers, strings, booleans")
        return d.CategoricalDistribution(bounds)
    numbers = isinstance(bounds, list) and len(bounds) == 2 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in bounds)
    if not numbers or (kind == "int" and not all(isinstance(v, int) for v in bounds)):
        raise SweepError(f"{key}: {kind} needs [LOW, HIGH], two "
                         f"{'whole numbers' if kind == 'int' else 'numbers'}; got {bounds!r}")
    low, high = bounds
    if not low < high:
        raise SweepError(f"{key}: {kind} = [{low}, {high}] is "
                         f"{'empty' if low == high else 'inverted'}: LOW must be below HIGH")
    if kind == "log_uniform" and low <= 0:
        raise SweepError(f"{key}: log_uniform needs LOW > 0, got {low}")
    if kind == "int":
        return d.IntDistribution(low, high)
    return d.FloatDistribution(float(low), float(high), log=kind == "log_uniform")


def _sample(space: dict[str, Any]) -> Any:
    return next(iter(space.values()))[0]


def _check_keys(path: Path, data: dict[str, Any], base: RunConfig,
                spaces: Mapping[str, Any], overrides: Sequence[str]) -> None:
    """Each searched key names a config field, or an option the model or the optimizer
    declares: searching what a run ignores would waste every trial."""
    for key, space in spaces.items():
        try:
            apply_overrides(data, [*overrides, f"{key}={_sample(space)!r}"])
        except ConfigError as error:
            raise SweepError(f"[sweep.params] {key!r}: {error}") from None
        parts = key.split(".")
        if len(parts) != 3 or parts[1] != "args" or parts[0] not in ("model", "optimizer"):
            continue
        declared = _declared(path, base, parts[0])
        if declared and parts[2] not in declared:
            raise SweepError(f"[sweep.params] {key!r}: the {parts[0]} "
                             f"{getattr(base, parts[0]).type_!r} has no option {parts[2]!r}"
                             f"{_close(parts[2], sorted(declared))}; it has: "
                             f"{', '.join(sorted(declared))}")


def _declared(path: Path, base: RunConfig, field: str) -> set[str]:
    """The options the config's model (its ``init_defaults``) or optimizer (its
    constructor's parameters) declares; empty when it declares none."""
    spec = getattr(base, field)
    if spec is None:
        return set()
    import_sources(base, path.parent)
    try:
        factory = registries[field].get(spec.type_)
    except (KeyError, ValueError) as error:
        raise SweepError(str(error).strip("'\"")) from None
    if field == "model":
        return set(getattr(factory, "init_defaults", None) or ())
    try:
        names = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return set()
    return {n for n, p in names.items() if n not in ("params", "self")
            and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}


class _Declared(Pack):
    """Reads, after every other setup hook, the metric names a run declares it writes,
    and stops the run before its first step."""

    name = "sweep_declared"

    def __init__(self) -> None:
        self.found: dict[str, str] = {}

    @hook(priority=-10_000)
    def setup(self, engine: Any) -> None:
        from ..core.metric_names import STEP_WRITES, declared_writes

        mode, model = engine.state.mode, engine.model
        self.found.update(declared_writes(engine.table, mode, 0, STEP_WRITES))
        metrics = getattr(model, "metrics", None)
        # a training config run records its model's metrics on its eval data after it
        # (runs/config_run.py), as eval_<name>; an eval run computes them
        if callable(metrics) and (mode == "eval" or (
                mode == "train" and getattr(model, "eval_data", None) is not None)):
            prefix = "eval_" if mode == "train" else ""
            self.found.update((prefix + name, f"{type(model).__name__}.metrics()")
                              for name in metrics())
        engine.stop("sweep: metric names read")


def check_metric(spec: SweepSpec) -> None:
    """Refuse a metric the base config's run does not produce, before any trial: the
    names its step, packs and hooks declare at setup (``core/metric_names.py``) and, in a
    training run whose model has eval data, the ``eval_`` metrics recorded after it. The
    run is set up in a temporary folder and stopped before its first step."""
    import tempfile

    declared = _Declared()
    # in this one process: the metric names do not depend on the backend (ddp, fsdp)
    config = dataclasses.replace(load_config(spec.config, list(spec.overrides)), backend=None)
    with tempfile.TemporaryDirectory(prefix="runmodel-sweep-") as folder:
        try:
            prepared = prepare(config, directory=Path(folder) / "run", progress=False,
                               packs=[declared], base=spec.config.parent)
            prepared.engine.run(prepared.model, mode=config.mode, epochs=1,
                                backend=prepared.backend)
        except Exception as error:  # the base config itself is broken: every trial would be
            raise SweepError(f"the sweep's config cannot run: {type(error).__name__}: "
                             f"{error}") from None
    found = declared.found
    if spec.metric not in found:
        raise SweepError(
            f"metric {spec.metric!r}: the config's run does not produce it"
            f"{_close(spec.metric, list(found))}; it produces: {', '.join(sorted(found))}. "
            f"If a hook of yours writes it, declare it (engine.on(phase, fn, writes="
            f"[{spec.metric!r}]), or writes = [...] in a pack)")


# -- the study -----------------------------------------------------------------------------

def _storage(spec: SweepSpec, folder: Path) -> Any:
    optuna = require("optuna", needed_by="runmodel sweep")
    if spec.storage is None:
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        return JournalStorage(JournalFileBackend(str(folder / JOURNAL)))
    if spec.storage.startswith(("sqlite", "postgresql", "mysql", "oracle", "mssql")):
        # several machines: a trial whose process died is found by its stale heartbeat
        return optuna.storages.RDBStorage(
            spec.storage, heartbeat_interval=60, grace_period=180,
            failed_trial_callback=optuna.storages.RetryFailedTrialCallback(max_retry=3))
    return optuna.storages.get_storage(spec.storage)


def _made(spec: Spec, kinds: Mapping[str, str], module: Any, **extra: Any) -> Any:
    cls = getattr(module, kinds[spec.type_])
    try:
        return cls(**{**extra, **spec.args}) if extra else cls(**spec.args)
    except TypeError as error:
        raise SweepError(f"{spec.type_}: {error}") from None


def _study(spec: SweepSpec, folder: Path, create: bool) -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = _storage(spec, folder)
    pruner = _made(spec.pruner, PRUNERS, optuna.pruners)  # not stored: a trial's process
    if not create:                                         # decides with it
        return optuna.load_study(study_name=spec.name, storage=storage, pruner=pruner)
    sampler = _made(spec.sampler, SAMPLERS, optuna.samplers, seed=spec.seed)
    study = optuna.create_study(study_name=spec.name, storage=storage, sampler=sampler,
                                pruner=pruner, load_if_exists=True,
                                direction="maximize" if spec.direction == "max" else "minimize")
    if study.trials:  # continued: a sampler seeded as at the start would repeat its values
        study.sampler = _made(spec.sampler, SAMPLERS, optuna.samplers,
                              seed=spec.seed + len(study.trials))
    known = study.user_attrs.get("definition")
    if known is None:
        study.set_user_attr("definition", spec.definition())
    elif known != json.loads(json.dumps(spec.definition())):
        changed = sorted(k for k in known if known[k] != spec.definition().get(k))
        raise SweepError(f"the sweep {spec.name!r} in {folder} was started with other "
                         f"{', '.join(changed)}; give this one another name ([sweep] name, "
                         f"or the config's file name)")
    return study


def _owner() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "since": _started(os.getpid())}


def _started(pid: int) -> str | None:
    """When process ``pid`` started (Linux's clock ticks since boot), to tell a reused pid
    from the process that held it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(owner: Mapping[str, Any]) -> bool:
    if owner.get("host") != socket.gethostname():
        return True  # another machine's: found by the storage's heartbeat, not here
    try:
        os.kill(int(owner["pid"]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, KeyError, ValueError):
        return True
    return owner.get("since") in (None, _started(int(owner["pid"])))


def _trial_config(spec: SweepSpec, values: Mapping[str, Any]) -> RunConfig:
    """The base config (without its ``[sweep]`` table) with the trial's values set (and
    the backend of a run in several processes, as its processes will have it)."""
    config = load_config(spec.config, [*spec.overrides,
                                       *(f"{k}={v!r}" for k, v in values.items())])
    return config if spec.nproc_per_node is None else with_backend(config, None)


# -- a trial's process ---------------------------------------------------------------------

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
        yield Hook(self.report, "epoch_end", HookOptions.of(
            name="sweep_trial.report", priority=-100))  # after the metrics' hooks

    def report(self, engine: Any) -> None:
        prune = False
        if engine.state.rank == 0:
            value = engine.state.metrics.get(self.metric)
            if value is not None:
                self.trial.report(float(value), engine.state.epoch)
                prune = self.trial.should_prune()
        if _several_processes():
            prune = _from_rank_0(prune)
        if prune:
            engine.stop(PRUNED)


def _several_processes() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _from_rank_0(value: bool) -> bool:
    """Rank 0's ``value``, on every process of the run's process group."""
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return bool(box[0])


def _run_trial(job: dict[str, Any]) -> int:
    """One trial, in its own process: the config run with the trial's values, then the
    trial's end told to the study. Returns the process's exit code."""
    import optuna

    spec = SweepSpec(**{**job["spec"], "config": Path(job["spec"]["config"]),
                        "sampler": Spec(*job["spec"]["sampler"]),
                        "pruner": Spec(*job["spec"]["pruner"])})
    folder = Path(job["folder"])
    study = _study(spec, folder, create=False)
    trial = optuna.trial.Trial(study, job["trial_id"])
    # a trial in several processes (torchrun): rank 0 alone tells the study
    lead = torchrun.rank() == 0
    if lead:
        study._storage.set_trial_user_attr(trial._trial_id, "owner", _owner())
    number = trial.number
    try:
        config = _trial_config(spec, trial.params)
        run_dir = run_dir_for(config, folder)
        status = read_status(run_dir).get("status") if (run_dir / "config.json").exists() \
            else None
        resume = status in ("interrupted", "failed") and bool(checkpoints_in(run_dir))
        if status in ("interrupted", "failed") and not resume and lead:
            shutil.rmtree(run_dir)  # nothing to continue: this trial's own start, again
        prepared = prepare(config, folder, resume=resume, progress=False,
                           packs=[ReportToTrial(trial, spec.metric)],
                           base=spec.config.parent)
        if lead:
            print(f"trial {number}: {dict(trial.params)} in {prepared.directory}"
                  + (f" (resuming from {prepared.checkpoint})" if prepared.checkpoint else ""),
                  flush=True)
        result = prepared.run()
    except KeyboardInterrupt:
        return 130
    except Exception as error:
        text = f"{type(error).__name__}: {error}"
        if not lead:
            print(f"trial {number} [rank {torchrun.rank()}] failed: {text}", file=sys.stderr,
                  flush=True)
            return 1
        study._storage.set_trial_user_attr(trial._trial_id, "error", text)
        study.tell(number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
        print(f"trial {number} failed: {text}", file=sys.stderr, flush=True)
        return 1
    if not lead:
        return 0
    return _tell(study, trial._trial_id, number, result, spec.metric, prepared.directory)


def _tell(study: Any, trial_id: int, number: int, result: RunResult, metric: str,
          run_dir: Path) -> int:
    from optuna.trial import TrialState

    if result.reason == INTERRUPTED:
        return 130  # the trial stays running: the next start resumes it
    if result.reason == PRUNED:
        _mark(run_dir, "pruned")
        study.tell(number, state=TrialState.PRUNED, skip_if_finished=True)
        return 0
    value = result.metrics.get(metric)
    if not isinstance(value, (int, float)) or math.isnan(value):
        text = (f"the run produced no metric {metric!r}"
                f"{_close(metric, list(result.metrics))}; it produced: "
                f"{', '.join(result.metrics) or 'none'}" if value is None
                else f"{metric} is {value!r}")
        study._storage.set_trial_user_attr(trial_id, "error", text)
        study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
        print(f"trial {number} failed: {text}", file=sys.stderr, flush=True)
        return 1
    study.tell(number, float(value), skip_if_finished=True)
    return 0


def _mark(run_dir: Path, state: str) -> None:
    """Record ``state`` (``pruned``) as the run folder's status."""
    path = run_dir / "status.json"
    status = read_json(path)
    if status:
        write_json(path, {**status, "status": state})


# -- the parent: asking, handing out, waiting ----------------------------------------------

@dataclasses.dataclass
class _Running:
    number: int
    process: subprocess.Popen[bytes]
    run_dir: Path


def sweep(config: str | os.PathLike[str], *, params: Mapping[str, Any] | None = None,
          trials: int | None = None, metric: str | None = None,
          direction: str | None = None, sampler: Any = None, pruner: Any = None,
          seed: int | None = None, storage: str | None = None, jobs: int = 1,
          runs_dir: str | os.PathLike[str] = "runs", name: str | None = None,
          overrides: Sequence[str] = (), echo: bool = True,
          nproc_per_node: int | None = None) -> SweepResult:
    """Search ``config``'s ``[sweep]`` (with these values over it) in config runs under
    ``runs_dir/<name>``: ``jobs`` trials at a time, until ``trials`` trials have finished
    (complete or pruned). Running it again continues it. Bad input raises ``SweepError``
    before anything is created; ``FAILURES_IN_A_ROW`` failed trials in a row stop it with
    the last error."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise SweepError(f"jobs is a whole number >= 1, got {jobs!r}")
    spec = read_spec(config, params=params, overrides=overrides, trials=trials,
                     metric=metric, direction=direction, sampler=sampler, pruner=pruner,
                     seed=seed, storage=storage, name=name, nproc_per_node=nproc_per_node)
    folder = Path(runs_dir) / spec.name
    check_metric(spec)
    if (folder / "config.json").exists():
        raise SweepError(f"{folder} is a run's folder, not a sweep's; name the sweep "
                         f"another way ([sweep] name)")
    folder.mkdir(parents=True, exist_ok=True)
    study = _study(spec, folder, create=True)
    return _Sweep(spec, folder, study, jobs, echo).run()


class _Sweep:
    def __init__(self, spec: SweepSpec, folder: Path, study: Any, jobs: int,
                 echo: bool) -> None:
        self.spec, self.folder, self.study, self.jobs, self.echo = (
            spec, folder, study, jobs, echo)
        self.running: list[_Running] = []
        self.failures: list[str] = []  # failed trials in a row, their errors
        self.distributions = {k: distribution(k, v) for k, v in spec.params.items()}

    def say(self, text: str) -> None:
        if self.echo:
            print(f"sweep {self.spec.name}: {text}", flush=True)

    def counts(self) -> dict[str, int]:
        from optuna.trial import TrialState

        states = [t.state for t in self.study.get_trials(deepcopy=False)]
        return {"complete": states.count(TrialState.COMPLETE),
                "pruned": states.count(TrialState.PRUNED),
                "failed": states.count(TrialState.FAIL),
                "running": states.count(TrialState.RUNNING)}

    def run(self) -> SweepResult:
        try:
            while True:
                self.reap()
                if len(self.failures) >= FAILURES_IN_A_ROW:
                    self.wait_all()
                    raise SweepFailed(f"{FAILURES_IN_A_ROW} trials failed in a row; the last: "
                                     f"{self.failures[-1]}")
                counts = self.counts()
                done = counts["complete"] + counts["pruned"]
                if done >= self.spec.trials and not self.running:
                    break
                if len(self.running) < self.jobs and done + counts["running"] < self.spec.trials:
                    self.start(self.stale() or self.ask())
                elif len(self.running) < self.jobs and self.stale():
                    self.start(self.stale())
                elif self.running:
                    time.sleep(0.2)
                else:  # running trials of another machine: wait for them
                    time.sleep(2)
        except KeyboardInterrupt:
            self.say("interrupted; the running trials save and stop: run the same command "
                     "to continue")
            self.wait_all(timeout=120)
            self.summarize()
            raise
        return self.summarize()

    def stale(self) -> Any:
        """A running trial of this host whose process is gone: it resumes."""
        from optuna.trial import TrialState

        mine = {r.number for r in self.running}
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            owner = trial.user_attrs.get("owner") or trial.user_attrs.get("asked_by")
            if trial.number not in mine and owner is not None and not _alive(owner):
                return trial
        return None

    def ask(self) -> Any:
        trial = self.study.ask(self.distributions)
        trial.set_user_attr("asked_by", _owner())
        return trial

    def start(self, trial: Any) -> None:
        values = dict(trial.params)
        run_dir = run_dir_for(_trial_config(self.spec, values), self.folder)
        trial_id = trial._trial_id
        if any(r.run_dir == run_dir for r in self.running):
            while any(r.run_dir == run_dir for r in self.running):  # the same values
                time.sleep(0.2)
                self.reap()
        if self.reuse(trial.number, trial_id, run_dir):
            return
        job = {"spec": {**dataclasses.asdict(self.spec), "config": str(self.spec.config),
                        "sampler": [self.spec.sampler.type_, self.spec.sampler.args],
                        "pruner": [self.spec.pruner.type_, self.spec.pruner.args]},
               "folder": str(self.folder), "trial_id": trial_id}
        log = open(self.folder / f"trial-{trial.number:04d}.log", "ab")  # noqa: SIM115
        nproc = self.spec.nproc_per_node
        launcher = [] if nproc is None else [  # a port of its own: trials run side by side
            "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
        process = subprocess.Popen([sys.executable, *launcher, "-m", "runmodel.sweeps",
                                    json.dumps(job)], stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.study._storage.set_trial_user_attr(trial_id, "run_dir", str(run_dir))
        self.running.append(_Running(trial.number, process, run_dir))
        self.say(f"trial {trial.number} started: "
                 + ", ".join(f"{k}={_show(v)}" for k, v in values.items()))

    def reuse(self, number: int, trial_id: int, run_dir: Path) -> bool:
        """A trial whose values equal a finished trial's takes that result."""
        from optuna.trial import TrialState

        status = read_status(run_dir).get("status")
        if status not in ("finished", "pruned"):
            return False
        value = read_json(run_dir / "metrics.json").get("metrics", {}).get(self.spec.metric)
        self.study._storage.set_trial_user_attr(trial_id, "run_dir", str(run_dir))
        self.study._storage.set_trial_user_attr(trial_id, "reused", True)
        if status == "pruned" or value is None:
            self.study.tell(number, state=TrialState.PRUNED, skip_if_finished=True)
        else:
            self.study.tell(number, float(value), skip_if_finished=True)
        self.say(f"trial {number}: the same values as a finished trial; its result reused "
                 f"({run_dir.name})")
        self.failures.clear()
        return True

    def reap(self) -> None:
        from optuna.trial import TrialState

        for running in [r for r in self.running if r.process.poll() is not None]:
            self.running.remove(running)
            trial = self.study.get_trials(deepcopy=False)[running.number]
            code = running.process.returncode
            if code == 130 or code == -signal.SIGINT:
                raise KeyboardInterrupt
            if trial.state == TrialState.FAIL:
                error = trial.user_attrs.get("error", f"exit code {code}")
                self.failures.append(error)
                self.say(f"trial {trial.number} failed: {error} "
                         f"(trial-{trial.number:04d}.log)")
            elif trial.state == TrialState.RUNNING:  # killed: it resumes when started again
                self.failures.append(f"trial {trial.number}'s process ended by "
                                     f"{_ended(code)}")
                self.say(f"trial {trial.number}'s process ended by {_ended(code)}; it "
                         f"resumes from its checkpoint")
            else:
                self.failures.clear()
                value = "" if trial.value is None else f" {self.spec.metric}={trial.value:.4f}"
                self.say(f"trial {trial.number} {trial.state.name.lower()}{value}")
            self.summarize()

    def wait_all(self, timeout: float | None = None) -> None:
        end = None if timeout is None else time.monotonic() + timeout
        for running in self.running:
            try:
                running.process.wait(None if end is None else max(0.1, end - time.monotonic()))
            except (subprocess.TimeoutExpired, KeyboardInterrupt):
                running.process.kill()
                running.process.wait()
        self.running.clear()

    def summarize(self) -> SweepResult:
        """Write ``sweep.json`` and return the sweep's state."""
        from optuna.trial import TrialState

        counts = self.counts()
        complete = [t for t in self.study.get_trials(deepcopy=False)
                    if t.state == TrialState.COMPLETE]
        best = None
        if complete:
            pick = max if self.spec.direction == "max" else min
            top = pick(complete, key=lambda t: t.value)
            best = {"number": top.number, "value": top.value, "params": top.params,
                    "run_dir": top.user_attrs.get("run_dir")}
        summary = {"name": self.spec.name, "metric": self.spec.metric,
                   "direction": self.spec.direction, "trials": self.spec.trials,
                   "params": self.spec.params, "config": str(self.spec.config),
                   **counts, "best": best}
        write_json(self.folder / "sweep.json", summary)
        return SweepResult(self.spec.name, self.folder, self.spec.metric, counts["complete"],
                           counts["pruned"], counts["failed"], best)


def _show(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _ended(code: int) -> str:
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def parse_param(text: str) -> tuple[str, Any]:
    """``--param KEY=SPACE``: SPACE is a TOML inline table (``{choice = [32, 64]}``)."""
    key, sep, space = text.partition("=")
    if not sep or not key.strip():
        raise SweepError(f"--param {text!r}: write KEY=SPACE, as in --param "
                         f"'model.args.hidden={{choice = [32, 64]}}'")
    try:
        value = tomllib.loads(f"space = {space}")["space"]
    except tomllib.TOMLDecodeError as error:
        raise SweepError(f"--param {text!r}: SPACE is a TOML inline table such as "
                         f"{{int = [2, 10]}} ({error})") from None
    return key.strip(), value

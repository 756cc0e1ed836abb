"""A sweep as data: the ``[sweep]`` table of a config (and the command line's values over
it) read and checked, its spaces as Optuna distributions, and each trial's config."""

from __future__ import annotations

import dataclasses
import inspect
import os
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..config.registry import Spec, registries
from ..config.runconfig import (
    ConfigError,
    RunConfig,
    apply_overrides,
    load_config,
    read_config_file,
)
from ..core.checks import closest, did_you_mean_aside, is_whole_number
from ..extras import require
from ..runs.config_run import import_sources
from ..runs.torchrun import with_backend

__all__ = [
    "HEARTBEAT",
    "PRUNERS",
    "SAMPLERS",
    "SPACES",
    "SweepError",
    "SweepSpec",
    "close_to",
    "distribution",
    "parse_param",
    "read_spec",
    "trial_config",
]

#: The search spaces of ``[sweep.params]``, as Optuna distributions.
SPACES = ("uniform", "log_uniform", "int", "choice")
SAMPLERS = {"tpe": "TPESampler", "random": "RandomSampler"}
PRUNERS = {
    "median": "MedianPruner",
    "percentile": "PercentilePruner",
    "hyperband": "HyperbandPruner",
    "successive_halving": "SuccessiveHalvingPruner",
    "none": "NopPruner",
}
KEYS = (
    "name",
    "metric",
    "direction",
    "trials",
    "params",
    "sampler",
    "pruner",
    "seed",
    "storage",
    "nproc_per_node",
    "heartbeat",
)
#: Seconds between two heartbeats of a running trial (a database storage); a trial
#: whose heartbeat is 3 times as old is failed and tried again.
HEARTBEAT = 60


class SweepError(ValueError):
    """A sweep that cannot start: bad input, found before anything is created."""


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
    #: seconds between a running trial's heartbeats in a database storage
    heartbeat: int = HEARTBEAT

    def definition(self) -> dict[str, Any]:
        """What makes two runs of the command the same sweep (not ``trials``)."""
        return {
            "config": str(self.config),
            "metric": self.metric,
            "direction": self.direction,
            "params": self.params,
            "overrides": list(self.overrides),
        }

    def to_job(self) -> dict[str, Any]:
        """This spec as JSON data, for a trial's process (``from_job`` reads it)."""
        return {
            **dataclasses.asdict(self),
            "config": str(self.config),
            "sampler": [self.sampler.type_, self.sampler.args],
            "pruner": [self.pruner.type_, self.pruner.args],
            "overrides": list(self.overrides),
        }

    @classmethod
    def from_job(cls, data: Mapping[str, Any]) -> SweepSpec:
        return cls(
            **{
                **data,
                "config": Path(data["config"]),
                "sampler": Spec(*data["sampler"]),
                "pruner": Spec(*data["pruner"]),
                "overrides": tuple(data["overrides"]),
            }
        )


def read_spec(
    config: str | os.PathLike[str],
    *,
    params: Mapping[str, Any] | None = None,
    overrides: Sequence[str] = (),
    **given: Any,
) -> SweepSpec:
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
    unknown = [key for key in (*table, *given) if key not in KEYS]
    if unknown:
        raise SweepError(
            f"[sweep] has no key {unknown[0]!r}{close_to(unknown[0], KEYS)}; "
            f"valid keys: {', '.join(KEYS)}"
        )
    values = {**table, **{k: v for k, v in given.items() if v is not None}}
    spaces = {**(values.get("params") or {}), **(params or {})}
    if not spaces:
        raise SweepError(
            "a sweep needs parameters to search: [sweep.params] in the config "
            "or --param KEY=SPACE, as in --param 'optimizer.args.lr={log_uniform "
            "= [1e-4, 1e-1]}'"
        )
    try:
        base = RunConfig.from_dict(apply_overrides(data, overrides), source=str(path))
    except ConfigError as error:
        raise SweepError(str(error)) from None
    metric = values.get("metric")
    if not isinstance(metric, str) or not metric:
        raise SweepError(
            'a sweep needs the metric it optimizes: metric = "eval_accuracy" '
            "in [sweep], or --metric NAME"
        )
    direction = values.get("direction", "max")
    if direction not in ("max", "min"):
        raise SweepError(f"direction is 'max' or 'min', got {direction!r}")
    trials = _whole(values.get("trials", 10), "trials", "the finished trials wanted")
    seed = values.get("seed", base.seed)
    if not is_whole_number(seed, least=None):
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
    if storage is not None and (not isinstance(storage, str) or not storage):
        raise SweepError(f"storage is a database URL, got {storage!r}")
    heartbeat = _whole(
        values.get("heartbeat", HEARTBEAT),
        "heartbeat",
        "seconds between a running trial's heartbeats",
    )
    nproc = values.get("nproc_per_node")
    if nproc is not None:
        nproc = _whole(nproc, "nproc_per_node", "each trial's processes")
    if nproc is not None and nproc > 1:
        try:
            with_backend(base, None)
        except ValueError as error:
            raise SweepError(str(error)) from None
    return SweepSpec(
        path.resolve(),
        name,
        metric,
        direction,
        trials,
        spaces,
        sampler,
        pruner,
        seed,
        storage,
        tuple(overrides),
        nproc if nproc != 1 else None,
        heartbeat,
    )


def _whole(value: Any, key: str, what: str) -> int:
    if not is_whole_number(value, least=1):
        raise SweepError(f"{key} is a whole number >= 1 ({what}), got {value!r}")
    return value


#: `` (did you mean 'X'?)`` for the choice nearest a word, or nothing: the config layer's.
close_to = did_you_mean_aside


def _choice(kind: str, value: Any, known: Mapping[str, str]) -> Spec:
    try:
        spec = Spec.of(value, kind)
    except (TypeError, ValueError) as error:
        raise SweepError(str(error)) from None
    if spec.type_ not in known:
        raise SweepError(
            f"unknown {kind} {spec.type_!r}{close_to(spec.type_, list(known))}; "
            f"known: {', '.join(known)}"
        )
    return spec


def distribution(key: str, space: Any) -> Any:
    """The Optuna distribution of ``space`` (``{log_uniform = [1e-4, 1e-1]}``...)."""
    require("optuna", needed_by="runmodel sweep")
    from optuna import distributions as d

    shape = (
        f"{key}: a space is {{uniform = [LOW, HIGH]}}, {{log_uniform = [LOW, HIGH]}}, "
        f"{{int = [LOW, HIGH]}} or {{choice = [A, B, ...]}}"
    )
    if not isinstance(space, dict) or len(space) != 1 or next(iter(space)) not in SPACES:
        raise SweepError(f"{shape}; got {space!r}")
    kind, bounds = next(iter(space.items()))
    if kind == "choice":
        if not isinstance(bounds, list) or not bounds:
            raise SweepError(f"{key}: choice needs a non-empty list of values, got {bounds!r}")
        if not all(v is None or isinstance(v, (bool, int, float, str)) for v in bounds):
            raise SweepError(f"{key}: choice values are numbers, strings, booleans")
        return d.CategoricalDistribution(bounds)
    numbers = (
        isinstance(bounds, list)
        and len(bounds) == 2
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in bounds)
    )
    if not numbers or (kind == "int" and not all(isinstance(v, int) for v in bounds)):
        raise SweepError(
            f"{key}: {kind} needs [LOW, HIGH], two "
            f"{'whole numbers' if kind == 'int' else 'numbers'}; got {bounds!r}"
        )
    low, high = bounds
    if not low < high:
        raise SweepError(
            f"{key}: {kind} = [{low}, {high}] is "
            f"{'empty' if low == high else 'inverted'}: LOW must be below HIGH"
        )
    if kind == "log_uniform" and low <= 0:
        raise SweepError(f"{key}: log_uniform needs LOW > 0, got {low}")
    if kind == "int":
        return d.IntDistribution(low, high)
    return d.FloatDistribution(float(low), float(high), log=kind == "log_uniform")


def _sample(space: dict[str, Any]) -> Any:
    return next(iter(space.values()))[0]


def _check_keys(
    path: Path,
    data: dict[str, Any],
    base: RunConfig,
    spaces: Mapping[str, Any],
    overrides: Sequence[str],
) -> None:
    """Each searched key names a config field, or an option that the spec it is under
    (the model, the optimizer, a pack...) declares: searching what a run ignores would
    waste every trial."""
    for key, space in spaces.items():
        _names_something(path, base, key)
        try:
            RunConfig.from_dict(
                apply_overrides(data, [*overrides, f"{key}={_sample(space)!r}"]), source=str(path)
            )
        except ConfigError as error:
            raise SweepError(f"[sweep.params] {key!r}: {error}") from None
        parts = key.split(".")
        where, option = _spec_option(parts)
        if where is None:
            continue
        spec = _spec_at(base, where)
        declared = _declared(path, base, spec, where[0])
        if declared is not None and option not in declared:
            raise SweepError(
                f"[sweep.params] {key!r}: the {where[0].rstrip('s')} "
                f"{spec.type_!r} has no option {option!r}"
                f"{close_to(option, sorted(declared))}; it has: "
                f"{', '.join(sorted(declared)) or 'none'}"
            )


SPEC_FIELDS = ("model", "optimizer", "interface", "backend")


def _names_something(path: Path, base: RunConfig, key: str) -> None:
    """A key under a spec names a spec the config has, and an option under its ``args``
    (``model.hiden`` is refused with ``model.args.hidden`` offered)."""
    parts = key.split(".")
    if parts[0] in SPEC_FIELDS and len(parts) > 1 and getattr(base, parts[0]) is None:
        raise SweepError(
            f"[sweep.params] {key!r}: the config has no {parts[0]} to set {parts[-1]!r} in"
        )
    if (
        parts[0] == "packs"
        and len(parts) > 1
        and not (parts[1].isdigit() and int(parts[1]) < len(base.packs))
    ):
        raise SweepError(
            f"[sweep.params] {key!r}: the config lists {len(base.packs)} "
            f"pack(s) ([[packs]]), numbered from 0"
        )
    if parts[0] in SPEC_FIELDS and len(parts) == 2 and parts[1] not in ("type", "args"):
        spec = getattr(base, parts[0])
        declared = sorted(_declared(path, base, spec, parts[0]) or ())
        hint = f"{parts[0]}.args.{closest(parts[1], declared) or parts[1]}"
        raise SweepError(
            f"[sweep.params] {key!r}: a {parts[0]}'s options are under its "
            f"args (did you mean {hint!r}?)"
        )


def _spec_option(parts: list[str]) -> tuple[tuple[str, ...] | None, str]:
    """Where the spec of a key ``FIELD.args.NAME`` or ``packs.N.args.NAME`` is, and NAME;
    (None, "") for any other key."""
    if len(parts) == 3 and parts[1] == "args" and parts[0] in SPEC_FIELDS:
        return (parts[0],), parts[2]
    if len(parts) == 4 and parts[0] == "packs" and parts[1].isdigit() and parts[2] == "args":
        return (parts[0], parts[1]), parts[3]
    return None, ""


def _spec_at(base: RunConfig, where: tuple[str, ...]) -> Spec:
    if where[0] == "packs":
        return base.packs[int(where[1])]
    spec = getattr(base, where[0])
    assert spec is not None  # the key's value was set in it above
    return spec


def _declared(path: Path, base: RunConfig, spec: Spec, field: str) -> set[str] | None:
    """The options the spec's factory declares: a model its ``init_defaults``, anything
    else its parameters; None when it declares none (or takes ``**kwargs``)."""
    import_sources(base, path.parent)
    registry = registries["pack" if field == "packs" else field]
    try:
        factory = registry.get(spec.type_)
    except (KeyError, ValueError) as error:
        raise SweepError(str(error).strip("'\"")) from None
    if field == "model":
        return set(getattr(factory, "init_defaults", None) or ()) or None
    try:
        names = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind == p.VAR_KEYWORD for p in names.values()):
        return None
    return {
        n for n, p in names.items() if n not in ("params", "self") and p.kind != p.VAR_POSITIONAL
    }


def trial_config(spec: SweepSpec, values: Mapping[str, Any]) -> RunConfig:
    """The base config (without its ``[sweep]`` table) with the trial's values set (and
    the backend of a run in several processes, as its processes will have it)."""
    config = load_config(spec.config, [*spec.overrides, *(f"{k}={v!r}" for k, v in values.items())])
    return config if spec.nproc_per_node is None else with_backend(config, None)


def parse_param(text: str) -> tuple[str, Any]:
    """``--param KEY=SPACE``: SPACE is a TOML inline table (``{choice = [32, 64]}``)."""
    key, sep, space = text.partition("=")
    if not sep or not key.strip():
        raise SweepError(
            f"--param {text!r}: write KEY=SPACE, as in --param "
            f"'model.args.hidden={{choice = [32, 64]}}'"
        )
    try:
        value = tomllib.loads(f"space = {space}")["space"]
    except tomllib.TOMLDecodeError as error:
        raise SweepError(
            f"--param {text!r}: SPACE is a TOML inline table such as {{int = [2, 10]}} ({error})"
        ) from None
    return key.strip(), value

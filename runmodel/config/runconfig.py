"""A run described as data: ``RunConfig``, read from TOML or JSON.

```toml
imports = ["examples/digits.py"]   # files or modules that register what is named below
epochs = 20
seed = 0
[model]
type = "digits"
args = { hidden = 128 }
[optimizer]
type = "adam"
args = { lr = 0.005 }
[[packs]]
type = "checkpoint"
args = { every = "1ep", keep = 2 }
```

A spec may also be a bare name (``backend = "amp"``). ``--set a.b=c`` overrides any
value, type-checked; an unknown key is an error with a did-you-mean; a malformed file is
an error naming the file and line. The canonical form (every field, sorted) is hashed
into the run's directory name, so equal configs share a directory and different ones
never do.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import re
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core import MODES
from ..core.checks import did_you_mean_aside
from . import CONFIG_SUFFIXES
from .overrides import ConfigError, key_value
from .registry import Spec

__all__ = [
    "ConfigError",
    "RunConfig",
    "apply_overrides",
    "digest",
    "load_config",
    "overridden_model_args",
    "run_folder_name",
    "sanitize",
]


_SPEC_FIELDS = ("model", "optimizer", "interface", "backend")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Everything that makes a run, as data."""

    model: Spec
    optimizer: Spec | None = None
    interface: Spec | None = None
    backend: Spec | None = None
    packs: tuple[Spec, ...] = ()
    epochs: int | None = None
    steps: int | None = None
    seed: int = 0
    device: str | None = None
    mode: str = "train"
    imports: tuple[str, ...] = ()
    #: The model's setup options (``setup_options`` of its ``setup``), a table in a file.
    setup: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: the length in iterations (optimizer steps), instead of ``steps``
    iterations: int | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> RunConfig:
        """Check and build a config from plain data (as read from a file)."""
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: a config is a table/object, got {type(data).__name__}")
        unknown = [key for key in data if key not in _FIELDS]
        if unknown:
            raise ConfigError(
                f"{source}: unknown key {unknown[0]!r}{_did_you_mean(unknown[0])}; "
                f"valid keys: {', '.join(_FIELDS)}"
            )
        if data.get("model") is None:
            raise ConfigError(
                f"{source}: 'model' is required (a registered model's name, or "
                f"{{type = NAME, args = {{...}}}})"
            )
        values: dict[str, Any] = {}
        for key, value in data.items():
            where = f"{source}: {key}"
            try:
                if key in _SPEC_FIELDS:
                    values[key] = None if value is None else Spec.of(value, where)
                elif key == "packs":
                    if not isinstance(value, list):
                        raise ConfigError(f"{where} must be a list of specs, got {value!r}")
                    values[key] = tuple(Spec.of(v, f"{where}[{i}]") for i, v in enumerate(value))
                elif key == "setup":
                    if not isinstance(value, dict):
                        raise ConfigError(
                            f"{where} is a table of the model's setup options, got {value!r}"
                        )
                    values[key] = copy.deepcopy(value)
                elif key == "imports":
                    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                        raise ConfigError(f"{where} must be a list of paths or module names")
                    values[key] = tuple(value)
                else:
                    values[key] = _check_scalar(key, value, where)
            except (TypeError, ValueError) as error:
                raise ConfigError(str(error)) from None
        if values.get("steps") is not None and values.get("iterations") is not None:
            raise ConfigError(
                f"{source}: steps = {values['steps']} and iterations = "
                f"{values['iterations']} exclude each other: both are the run's length, "
                f"iterations in optimizer steps (k steps each under GradAccumulation(k)); "
                f"give one of them"
            )
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """The canonical form: every field, specs as ``{"type", "args"}``."""

        def spec(s: Spec | None) -> dict[str, Any] | None:
            return None if s is None else {"type": s.type_, "args": copy.deepcopy(s.args)}

        return {
            "model": spec(self.model),
            "optimizer": spec(self.optimizer),
            "interface": spec(self.interface),
            "backend": spec(self.backend),
            "packs": [spec(p) for p in self.packs],
            "epochs": self.epochs,
            "steps": self.steps,
            "seed": self.seed,
            "device": self.device,
            "mode": self.mode,
            "imports": list(self.imports),
            # only where given: a config without setup options keeps its hash and folder
            **({"setup": copy.deepcopy(self.setup)} if self.setup else {}),
            "iterations": self.iterations,
        }

    def identity(self) -> dict[str, Any]:
        """What makes the run: the canonical form, without ``iterations`` where it is
        not given (so a config written before it keeps its digest and its folder)."""
        return {k: v for k, v in self.to_dict().items() if k != "iterations" or v is not None}

    def digest(self) -> str:
        """A short hash of the canonical form, the same in every process."""
        return digest(self.identity())

    def with_overrides(self, overrides: Sequence[str], source: str = "config") -> RunConfig:
        """This config with ``a.b=c`` overrides applied (as ``load_config`` applies them
        to a file's values)."""
        if not overrides:
            return self
        return RunConfig.from_dict(apply_overrides(self.to_dict(), overrides), source=source)

    def run_name(self) -> str:
        """Readable and unique: model, optimizer and their first arguments, the hash."""
        return run_folder_name(self.readable_name(), self.identity())

    def readable_name(self) -> str:
        """The readable part of the run's name: model, optimizer and their first two
        arguments (by name), and the mode where it is not ``train``."""
        parts = [_words(self.model)]
        if self.optimizer is not None:
            parts.append(_words(self.optimizer))
        if self.mode != "train":
            parts.append(self.mode)
        return "_".join(p for p in parts if p)


def digest(identity: Any) -> str:
    """A short hash of ``identity``'s canonical JSON form, the same in every process:
    what names a run's folder apart from its readable part."""
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(canonical.encode()).hexdigest()[:10]


def run_folder_name(readable: str, identity: Any) -> str:
    """A run folder's name: ``readable`` (at most 100 characters), then the digest of
    ``identity``: readable, and unique to what makes the run (``docs/config.md``)."""
    return f"{readable[:100]}_{digest(identity)}"


_TYPES: dict[str, tuple[type, ...]] = {
    "epochs": (int,),
    "steps": (int,),
    "iterations": (int,),
    "seed": (int,),
    "device": (str,),
    "mode": (str,),
}
_FIELDS = tuple(f.name for f in dataclasses.fields(RunConfig))


def _check_scalar(key: str, value: Any, where: str) -> Any:
    if value is None and key in ("epochs", "steps", "iterations", "device"):
        return None
    types = _TYPES[key]
    if not isinstance(value, types) or isinstance(value, bool):
        raise ConfigError(
            f"{where} must be {' or '.join(t.__name__ for t in types)}, got {value!r}"
        )
    if isinstance(value, int) and value < 0:  # epochs, steps, iterations, seed
        raise ConfigError(f"{where} must be >= 0, got {value}")
    if key == "mode" and value not in MODES:
        raise ConfigError(f"{where}: unknown mode {value!r}; valid: {', '.join(MODES)}")
    return value


def _did_you_mean(key: str, choices: Sequence[str] = ()) -> str:
    return did_you_mean_aside(key, choices or _FIELDS)


_UNSAFE = re.compile(r"[^A-Za-z0-9.=+-]+")


def sanitize(text: str) -> str:
    """A safe piece of a directory name: letters, digits and ``.=+-``, no leading dots,
    no ``..``, at most 40 characters."""
    text = _UNSAFE.sub("-", text)
    text = re.sub(r"\.{2,}", ".", text).strip(".-")
    return text[:40] or "x"


def _words(spec: Spec) -> str:
    args = [
        f"{k}{v}"
        for k, v in sorted(spec.args.items())[:2]  # sorted: order-free names
        if isinstance(v, (int, float, str, bool))
    ]
    return "-".join(sanitize(p) for p in (spec.type_, *args))


# -- files and overrides ------------------------------------------------------------------


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The raw data of a TOML or JSON config file; malformed files name file and line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"cannot read config {str(path)!r}: {error.strerror}") from None
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"{path}: not UTF-8 text ({error.reason} at byte {error.start})"
        ) from None
    if path.suffix == ".toml":
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            raise ConfigError(f"{path}: malformed TOML: {error}") from None
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ConfigError(
                f"{path}:{error.lineno}:{error.colno}: malformed JSON: {error.msg}"
            ) from None
        return data
    raise ConfigError(f"{path}: a config file ends in {' or '.join(CONFIG_SUFFIXES)}")


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """``data`` with ``a.b=c`` overrides applied; values are Python literals (or strings)
    and must have the type of the value they replace."""
    data = copy.deepcopy(data)
    for item in overrides:
        dotted, value = key_value(item, "optimizer.args.lr=0.01")
        keys = dotted.split(".")
        if keys[0] not in _FIELDS:
            # a dotted key goes into a table: guess among the fields that are tables
            tables = (*_SPEC_FIELDS, "packs") if len(keys) > 1 else _FIELDS
            raise ConfigError(
                f"--set {item!r}: unknown key {keys[0]!r}"
                f"{_did_you_mean(keys[0], tables)}; valid keys: "
                f"{', '.join(_FIELDS)}"
            )
        _set(data, keys, value, item)
    return data


def _set(data: dict[str, Any], keys: list[str], value: Any, item: str) -> None:
    spec_depth = 1 if keys[0] in _SPEC_FIELDS else 2 if keys[0] == "packs" else None
    if spec_depth is None and len(keys) > 1 and keys[0] not in ("imports", "setup"):
        raise ConfigError(f"--set {item!r}: {keys[0]!r} is a plain value, not a table")
    if (
        spec_depth is not None
        and len(keys) > spec_depth
        and (keys[spec_depth] not in ("type", "args"))
    ):
        key = keys[spec_depth]
        raise ConfigError(
            f"--set {item!r}: a spec has 'type' and 'args', not {key!r}"
            f"{_did_you_mean(key, ('type', 'args'))}"
        )
    node: Any = data
    for depth, key in enumerate(keys):
        last = depth == len(keys) - 1
        if isinstance(node, list):
            if not key.isdigit() or int(key) >= len(node):
                raise ConfigError(
                    f"--set {item!r}: {key!r} is not an index of the {len(node)} entries there"
                )
            index: Any = int(key)
        elif isinstance(node, dict):
            index = key
        else:
            raise ConfigError(f"--set {item!r}: {keys[depth - 1]!r} holds {node!r}, not a table")
        if last:
            break
        if depth + 1 == spec_depth and isinstance(_get(node, index), str):
            node[index] = {"type": node[index], "args": {}}  # a bare name grows into a spec
        if isinstance(node, dict) and not isinstance(node.get(index), (dict, list)):
            if node.get(index) is not None:
                raise ConfigError(f"--set {item!r}: {key!r} holds {node[index]!r}, not a table")
            node[index] = {}
        node = node[index]
    old = _get(node, index)
    if old is not None and value is not None:
        if isinstance(old, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)  # 1 over 0.5 is 1.0: the same config, the same hash
        elif not (
            isinstance(value, type(old)) and isinstance(value, bool) == isinstance(old, bool)
        ):
            raise ConfigError(
                f"--set {item!r}: {'.'.join(keys)} is {type(old).__name__} "
                f"({old!r}); {value!r} is {type(value).__name__}"
            )
    node[index] = value


def _get(node: Any, index: Any) -> Any:
    return node[index] if isinstance(node, list) else node.get(index)


def overridden_model_args(overrides: Sequence[str]) -> dict[str, str]:
    """The model options that ``model.args.NAME=VALUE`` overrides set: each name, and the
    override as the command line gave it (``--set 'model.args.hidden=64'``)."""
    found = {}
    for item in overrides:
        keys = item.partition("=")[0].split(".")
        if len(keys) >= 3 and keys[:2] == ["model", "args"]:
            found[keys[2]] = f"--set {item!r}"
    return found


def load_config(path: str | os.PathLike[str], overrides: Sequence[str] = ()) -> RunConfig:
    """Read a TOML or JSON config file, apply ``--set`` overrides, check it. A ``[sweep]``
    table is ``runmodel sweep``'s: the run is the base config, and the table enters
    neither its hash nor its folder's name."""
    data = read_config_file(path)
    if isinstance(data, dict):
        data.pop("sweep", None)
    data = apply_overrides(data, overrides)
    return RunConfig.from_dict(data, source=str(path))

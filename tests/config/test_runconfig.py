"""Run configs: reading TOML and JSON, checking, ``--set`` overrides, the hash and the run
directory's name."""

from __future__ import annotations

import copy
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runmodel import RunConfig, load_config
from runmodel.config.registry import Spec
from runmodel.config.runconfig import ConfigError, apply_overrides
from runmodel.runs import run_dir_for

import warm as subprocess

ROOT = Path(__file__).resolve().parents[2]
FIELDS = (
    "model",
    "optimizer",
    "interface",
    "backend",
    "packs",
    "epochs",
    "steps",
    "seed",
    "device",
    "mode",
    "imports",
    "setup",
    "iterations",
)

FULL_TOML = """\
imports = ["plugins/nets.py", "pkg.models"]
epochs = 3
steps = 120
seed = 7
device = "cpu"
mode = "eval"
backend = "amp"

[model]
type = "digits"
args = { hidden = 64, act = "relu" }

[optimizer]
type = "adam"
args = { lr = 0.005, betas = [0.9, 0.99] }

[interface]
type = "supervised"

[[packs]]
type = "checkpoint"
args = { every = "1ep", keep = 2 }

[[packs]]
type = "tensorboard"
"""

FULL = RunConfig(
    model=Spec("digits", {"hidden": 64, "act": "relu"}),
    optimizer=Spec("adam", {"lr": 0.005, "betas": [0.9, 0.99]}),
    interface=Spec("supervised"),
    backend=Spec("amp"),
    packs=(Spec("checkpoint", {"every": "1ep", "keep": 2}), Spec("tensorboard")),
    epochs=3,
    steps=120,
    seed=7,
    device="cpu",
    mode="eval",
    imports=("plugins/nets.py", "pkg.models"),
)

FULL_DATA: dict[str, Any] = {
    "imports": ["plugins/nets.py", "pkg.models"],
    "epochs": 3,
    "steps": 120,
    "seed": 7,
    "device": "cpu",
    "mode": "eval",
    "backend": "amp",
    "model": {"type": "digits", "args": {"hidden": 64, "act": "relu"}},
    "optimizer": {"type": "adam", "args": {"lr": 0.005, "betas": [0.9, 0.99]}},
    "interface": {"type": "supervised"},
    "packs": [{"type": "checkpoint", "args": {"every": "1ep", "keep": 2}}, {"type": "tensorboard"}],
}


def write(tmp_path: Path, text: str, name: str = "run.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def config_of(tmp_path: Path, text: str, name: str = "run.toml") -> RunConfig:
    return load_config(write(tmp_path, text, name))


# -- reading -------------------------------------------------------------------------------


def test_every_field_from_toml(tmp_path: Path) -> None:
    config = config_of(tmp_path, FULL_TOML)
    assert config == FULL
    assert isinstance(config.packs, tuple) and isinstance(config.imports, tuple)
    assert config.backend == Spec("amp", {})


def test_every_field_from_json(tmp_path: Path) -> None:
    path = write(tmp_path, json.dumps(FULL_DATA, indent=2), "run.json")
    assert load_config(path) == FULL
    assert load_config(str(path)) == FULL


def test_defaults_when_omitted(tmp_path: Path) -> None:
    config = config_of(tmp_path, 'model = "m"\n')
    assert config == RunConfig(model=Spec("m"))
    assert (config.optimizer, config.interface, config.backend) == (None, None, None)
    assert (config.packs, config.epochs, config.steps, config.seed) == ((), None, None, 0)
    assert (config.device, config.mode, config.imports) == (None, "train", ())


def test_specs_may_be_bare_names_anywhere(tmp_path: Path) -> None:
    config = config_of(
        tmp_path,
        'model = "m"\noptimizer = "sgd"\ninterface = "supervised"\n'
        'backend = "compile"\npacks = ["checkpoint", {type = "x"}]\n',
    )
    assert config.model == Spec("m") and config.optimizer == Spec("sgd")
    assert config.interface == Spec("supervised") and config.backend == Spec("compile")
    assert config.packs == (Spec("checkpoint"), Spec("x"))


def test_the_digits_example_config() -> None:
    config = load_config(ROOT / "examples" / "configs" / "digits.toml")
    assert config == RunConfig(
        model=Spec("digits", {"hidden": 128}),
        optimizer=Spec("adam", {"lr": 0.005}),
        packs=(Spec("checkpoint", {"every": "1ep", "keep": 2}), Spec("tensorboard")),
        epochs=20,
        seed=0,
        imports=("../digits.py",),
    )


def test_malformed_toml_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, 'model = "m"\nepochs = 3\nseed = = 4\nmode = "train"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}: malformed TOML")
    assert "line 3" in message


def test_malformed_toml_on_another_line(tmp_path: Path) -> None:
    path = write(tmp_path, '\n\n\n\nmodel = "m"\n[optimizer\ntype = "adam"\n')
    with pytest.raises(ConfigError, match=r"line 6\b"):
        load_config(path)


def test_malformed_json_names_file_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, '{\n  "model": "m",\n  "epochs": 3\n  "seed": 1\n}\n', "run.json")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}:4:3: malformed JSON: Expecting ',' delimiter")


def test_a_json_config_must_be_an_object(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="a config is a table/object, got list"):
        config_of(tmp_path, '["model"]', "run.json")


def test_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    with pytest.raises(ConfigError, match=r"cannot read config .*absent\.toml.*No such file"):
        load_config(path)


def test_a_directory_is_not_a_config(tmp_path: Path) -> None:
    folder = tmp_path / "folder.toml"
    folder.mkdir()
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(folder)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads anything")
def test_an_unreadable_file(tmp_path: Path) -> None:
    path = write(tmp_path, 'model = "m"\n')
    path.chmod(0)
    try:
        with pytest.raises(ConfigError, match="cannot read config"):
            load_config(path)
    finally:
        path.chmod(0o600)


@pytest.mark.parametrize("name", ["run.yaml", "run.txt", "run", "run.toml.bak", "run.JSON5"])
def test_a_wrong_suffix(tmp_path: Path, name: str) -> None:
    path = write(tmp_path, 'model = "m"\n', name)
    with pytest.raises(
        ConfigError, match=re.escape(f"{path}: a config file ends in .toml or .json")
    ):
        load_config(path)


def test_a_file_that_is_not_text(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_bytes(b'model = "m"\n\xff\xfe\x00\x81 binary')
    with pytest.raises(ConfigError, match=re.escape(str(path))):
        load_config(path)


# -- checking ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "close"),
    [
        ("epoch", "epochs"),
        ("optimiser", "optimizer"),
        ("pack", "packs"),
        ("seeds", "seed"),
        ("import", "imports"),
        ("modl", "model"),
        ("step", "steps"),
        ("backends", "backend"),
    ],
)
def test_an_unknown_key_suggests_the_close_one(tmp_path: Path, key: str, close: str) -> None:
    path = write(tmp_path, f'model = "m"\n{key} = 1\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}: unknown key {key!r}")
    assert f"(did you mean {close!r}?)" in message
    assert message.endswith("valid keys: " + ", ".join(FIELDS))


def test_an_unknown_key_without_a_close_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        config_of(tmp_path, 'model = "m"\nzzyzx = 1\n')
    assert "unknown key 'zzyzx'; valid keys: " in str(info.value)
    assert "did you mean" not in str(info.value)


def test_an_unknown_table_is_an_unknown_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'optimiser' \(did you mean 'optimizer'"):
        config_of(tmp_path, 'model = "m"\n[optimiser]\ntype = "adam"\n')


def test_model_is_required(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'model' is required"):
        config_of(tmp_path, "epochs = 3\n")
    with pytest.raises(ConfigError, match="'model' is required"):
        config_of(tmp_path, "{}", "run.json")


def test_a_null_model_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="model"):
        config_of(tmp_path, '{"model": null}', "run.json")


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ('epochs = "ten"', "epochs"),
        ("epochs = 2.5", "epochs"),
        ("epochs = true", "epochs"),
        ("epochs = -1", "epochs"),
        ("steps = -1", "steps"),
        ('steps = "100"', "steps"),
        ("seed = 1.5", "seed"),
        ("seed = false", "seed"),
        ('mode = "fly"', "mode"),
        ("mode = 1", "mode"),
        ("device = 0", "device"),
        ('packs = "x"', "packs"),
        ("packs = [1]", "packs"),
        ('packs = [{type = "x", args = 3}]', "packs"),
        ('imports = "x"', "imports"),
        ("imports = [1]", "imports"),
        ("optimizer = 5", "optimizer"),
        ('optimizer = {type = "adam", lr = 0.1}', "optimizer"),
        ('optimizer = {type = "adam", args = [0.1]}', "optimizer"),
        ("backend = {args = {}}", "backend"),
        ("interface = [1]", "interface"),
    ],
)
def test_wrong_types_name_the_key(tmp_path: Path, line: str, key: str) -> None:
    path = write(tmp_path, f'{line}\nmodel = "m"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: {key}")


def test_a_wrong_model_spec_names_the_key(tmp_path: Path) -> None:
    path = write(tmp_path, "model = 5\n")
    with pytest.raises(ConfigError, match=re.escape(f"{path}: model: give a registered name")):
        load_config(path)


def test_a_bad_pack_names_its_index(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"packs\[1\]: give a registered name"):
        config_of(tmp_path, 'model = "m"\npacks = ["checkpoint", 3]\n')


def test_a_mode_error_lists_the_modes(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match="unknown mode 'fly'; valid: train, eval, infer, benchmark, profile"
    ):
        config_of(tmp_path, 'model = "m"\nmode = "fly"\n')


@pytest.mark.parametrize("mode", ["train", "eval", "infer", "benchmark", "profile"])
def test_every_mode_is_accepted(tmp_path: Path, mode: str) -> None:
    assert config_of(tmp_path, f'model = "m"\nmode = "{mode}"\n').mode == mode


def test_zero_and_nulls_are_accepted(tmp_path: Path) -> None:
    config = config_of(
        tmp_path,
        '{"model": "m", "epochs": 0, "steps": null, "device": null, "optimizer": null}',
        "run.json",
    )
    assert config == RunConfig(model=Spec("m"), epochs=0)


# -- overrides -----------------------------------------------------------------------------

BASE: dict[str, Any] = {
    "epochs": 20,
    "seed": 0,
    "backend": "plain",
    "model": {"type": "digits", "args": {"hidden": 128}},
    "optimizer": {"type": "adam", "args": {"lr": 0.005}},
    "packs": [{"type": "checkpoint", "args": {"every": "1ep", "keep": 2}}, {"type": "tensorboard"}],
    "imports": ["a.py"],
}


def overridden(*items: str) -> dict[str, Any]:
    original = copy.deepcopy(BASE)
    result = apply_overrides(BASE, list(items))
    assert original == BASE  # the input is not mutated
    return result


def test_set_replaces_a_top_level_value() -> None:
    result = overridden("epochs=5")
    assert result == {**BASE, "epochs": 5}
    assert result["model"] is not BASE["model"]  # a deep copy


def test_set_adds_a_value_that_was_left_out() -> None:
    assert overridden("steps=100")["steps"] == 100
    assert overridden("device='cpu'")["device"] == "cpu"
    assert overridden("mode=eval")["mode"] == "eval"


@pytest.mark.parametrize(
    ("item", "value"),
    [
        ("optimizer.args.lr=0.01", 0.01),
        ("optimizer.args.lr=1e-4", 1e-4),
        ("optimizer.args.lr=1", 1.0),
        ("optimizer.args.lr=-2.5", -2.5),  # an int over a float
        # is stored as a float: the same config as lr = 1.0, so the same hash
    ],
)
def test_set_a_float_to_a_float_or_an_int(item: str, value: float) -> None:
    result = overridden(item)
    assert result["optimizer"] == {"type": "adam", "args": {"lr": value}}
    assert type(result["optimizer"]["args"]["lr"]) is type(value)


def test_set_nested_args() -> None:
    assert overridden("model.args.hidden=64")["model"] == {"type": "digits", "args": {"hidden": 64}}
    assert overridden("model.args.depth=3")["model"]["args"] == {"hidden": 128, "depth": 3}
    assert overridden("model.type=other")["model"] == {"type": "other", "args": {"hidden": 128}}


@pytest.mark.parametrize("item", ["packs.0.args.every='2ep'", "packs.0.args.every=2ep"])
def test_set_into_a_list_of_packs(item: str) -> None:
    result = overridden(item)
    assert result["packs"] == [
        {"type": "checkpoint", "args": {"every": "2ep", "keep": 2}},
        {"type": "tensorboard"},
    ]


def test_set_args_of_a_pack_that_had_none() -> None:
    result = overridden("packs.1.args.every_steps=10")
    assert result["packs"][1] == {"type": "tensorboard", "args": {"every_steps": 10}}


def test_a_bare_name_spec_grows_into_a_table() -> None:
    assert overridden("backend.type=amp")["backend"] == {"type": "amp", "args": {}}
    assert overridden("backend.args.dtype='bfloat16'")["backend"] == {
        "type": "plain",
        "args": {"dtype": "bfloat16"},
    }
    assert overridden("backend.args.dtype=bfloat16")["backend"] == {
        "type": "plain",
        "args": {"dtype": "bfloat16"},
    }


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        ("packs.0.args.every='2ep'", {"type": "checkpoint", "args": {"every": "2ep"}}),
        ("packs.0.type=tensorboard", {"type": "tensorboard", "args": {}}),
    ],
)
def test_a_bare_name_pack_grows_into_a_table(item: str, expected: dict[str, Any]) -> None:
    result = apply_overrides({"model": "m", "packs": ["checkpoint"]}, [item])
    assert result["packs"] == [expected]


def test_set_a_list_element() -> None:
    assert overridden("imports.0='b.py'")["imports"] == ["b.py"]


def test_overrides_apply_in_order() -> None:
    assert overridden("epochs=5", "epochs=6")["epochs"] == 6
    assert overridden("backend.type=amp", "backend.args.dtype='float16'")["backend"] == {
        "type": "amp",
        "args": {"dtype": "float16"},
    }


def test_set_none_clears_a_spec() -> None:
    assert overridden("optimizer=None")["optimizer"] is None


@pytest.mark.parametrize(
    ("item", "key", "old", "new"),
    [
        ("epochs='ten'", "epochs", "int (20)", "'ten' is str"),
        ("epochs=ten", "epochs", "int (20)", "'ten' is str"),
        ("epochs=2.5", "epochs", "int (20)", "2.5 is float"),
        ("epochs=True", "epochs", "int (20)", "True is bool"),
        ("optimizer.args.lr='fast'", "optimizer.args.lr", "float (0.005)", "'fast' is str"),
        ("optimizer.args.lr=True", "optimizer.args.lr", "float (0.005)", "True is bool"),
        ("model.args.hidden=1.5", "model.args.hidden", "int (128)", "1.5 is float"),
        ("packs.0.args.keep='2'", "packs.0.args.keep", "int (2)", "'2' is str"),
        ("packs=5", "packs", "list", "5 is int"),
        ("model.type=3", "model.type", "str ('digits')", "3 is int"),
    ],
)
def test_a_type_mismatch_names_key_and_both_types(item: str, key: str, old: str, new: str) -> None:
    with pytest.raises(ConfigError) as info:
        overridden(item)
    message = str(info.value)
    assert message.startswith(f"--set {item!r}: {key} is {old}")
    assert message.endswith(new)


@pytest.mark.parametrize(
    ("item", "close"),
    [
        ("epoch=3", "epochs"),
        ("optimiser.args.lr=0.1", "optimizer"),
        ("seeds=1", "seed"),
    ],
)
def test_an_unknown_top_level_key_suggests_one(item: str, close: str) -> None:
    with pytest.raises(ConfigError) as info:
        overridden(item)
    message = str(info.value)
    assert f"unknown key {item.split('.')[0].split('=')[0]!r}" in message
    assert f"(did you mean {close!r}?)" in message
    assert message.endswith("valid keys: " + ", ".join(FIELDS))


@pytest.mark.parametrize(
    ("item", "bad", "close"),
    [
        ("optimizer.argz.lr=1", "argz", "args"),
        ("optimizer.argz=1", "argz", "args"),
        ("model.tpye=x", "tpye", "type"),
        ("packs.0.arg.every=1", "arg", "args"),
        ("backend.options.dtype=x", "options", None),
    ],
)
def test_a_spec_has_only_type_and_args(item: str, bad: str, close: str | None) -> None:
    with pytest.raises(ConfigError) as info:
        overridden(item)
    message = str(info.value)
    assert f"a spec has 'type' and 'args', not {bad!r}" in message
    if close is None:
        assert "did you mean" not in message
    else:
        assert message.endswith(f"(did you mean {close!r}?)")


@pytest.mark.parametrize("item", ["epochs.x=1", "seed.a.b=1", "mode.x='eval'"])
def test_a_plain_value_is_not_a_table(item: str) -> None:
    with pytest.raises(ConfigError, match=f"{item.split('.')[0]!r} is a plain value"):
        overridden(item)


def test_descending_into_a_value_is_an_error() -> None:
    with pytest.raises(ConfigError, match="'hidden' holds 128, not a table"):
        overridden("model.args.hidden.x=1")
    with pytest.raises(ConfigError, match="'type' holds 'adam', not a table"):
        overridden("optimizer.type.x=1")


@pytest.mark.parametrize("item", ["epochs", "epochs5", "", "=5", "optimizer.args.lr"])
def test_an_override_needs_key_equals_value(item: str) -> None:
    with pytest.raises(ConfigError, match="write KEY=VALUE"):
        overridden(item)


@pytest.mark.parametrize(
    "item",
    ["packs.2.args.every=1", "packs.x.args.every=1", "packs.-1.args.every=1", "packs.10.type=x"],
)
def test_a_bad_list_index_is_an_error(item: str) -> None:
    with pytest.raises(ConfigError, match="is not an index of the 2 entries there"):
        overridden(item)


def test_load_config_applies_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, FULL_TOML)
    config = load_config(
        path,
        [
            "epochs=5",
            "optimizer.args.lr=0.01",
            "model.args.hidden=32",
            "packs.0.args.every='2ep'",
            "backend.args.dtype='bfloat16'",
        ],
    )
    assert config == RunConfig(
        model=Spec("digits", {"hidden": 32, "act": "relu"}),
        optimizer=Spec("adam", {"lr": 0.01, "betas": [0.9, 0.99]}),
        interface=Spec("supervised"),
        backend=Spec("amp", {"dtype": "bfloat16"}),
        packs=(Spec("checkpoint", {"every": "2ep", "keep": 2}), Spec("tensorboard")),
        epochs=5,
        steps=120,
        seed=7,
        device="cpu",
        mode="eval",
        imports=("plugins/nets.py", "pkg.models"),
    )
    assert load_config(path) == FULL  # the file is untouched


def test_load_config_checks_overridden_values(tmp_path: Path) -> None:
    path = write(tmp_path, 'model = "m"\n')
    with pytest.raises(ConfigError, match="epochs must be int, got 'ten'"):
        load_config(path, ["epochs='ten'"])
    with pytest.raises(ConfigError, match="epochs must be >= 0"):
        load_config(path, ["epochs=-3"])
    with pytest.raises(ConfigError, match="did you mean 'epochs'"):
        load_config(path, ["epoch=3"])
    with pytest.raises(ConfigError, match="epochs is int"):
        load_config(write(tmp_path, 'model = "m"\nepochs = 2\n'), ["epochs='ten'"])


# -- the hash and the run's name -------------------------------------------------------------

REORDERED_TOML = """\
packs = [
  { args = { keep = 2, every = "1ep" }, type = "checkpoint" },
  { type = "tensorboard" },
]
mode = "eval"
device = "cpu"
seed = 7
backend = { type = "amp", args = {} }
steps = 120
epochs = 3
imports = ["plugins/nets.py", "pkg.models"]

[optimizer]
args = { betas = [0.9, 0.99], lr = 0.005 }
type = "adam"

[interface]
type = "supervised"

[model]
args = { act = "relu", hidden = 64 }
type = "digits"
"""

DIGEST = re.compile(r"[0-9a-f]{10}")


def test_the_digest_is_short_hex_and_ends_the_name(tmp_path: Path) -> None:
    config = config_of(tmp_path, FULL_TOML)
    assert DIGEST.fullmatch(config.digest())
    assert config.run_name().endswith("_" + config.digest())


def test_the_name_is_readable(tmp_path: Path) -> None:
    config = config_of(tmp_path, FULL_TOML)
    # the first two args by name, so that the order they are written in does not matter
    assert config.run_name() == f"digits-actrelu-hidden64_adam-lr0.005_eval_{config.digest()}"
    train = RunConfig(model=Spec("digits", {"hidden": 128}), optimizer=Spec("adam", {"lr": 0.005}))
    assert train.run_name() == f"digits-hidden128_adam-lr0.005_{train.digest()}"


def test_key_order_does_not_change_the_hash(tmp_path: Path) -> None:
    a = config_of(tmp_path, FULL_TOML, "a.toml")
    b = config_of(tmp_path, REORDERED_TOML, "b.toml")
    shuffled = dict(reversed(list(FULL_DATA.items())))
    shuffled["model"] = {"args": {"act": "relu", "hidden": 64}, "type": "digits"}
    c = config_of(tmp_path, json.dumps(shuffled), "c.json")
    assert a == b == c == FULL
    assert a.digest() == b.digest() == c.digest() == FULL.digest()


ORDER_BUG = (
    "BUG: run_name() takes the readable part from the first two args in insertion "
    "order (_words: list(spec.args.items())[:2]), so the same config with its args "
    "written in another order gets the same digest but a different run_name(), i.e. "
    "another run directory"
)


def test_table_order_does_not_change_the_name(tmp_path: Path) -> None:
    a = config_of(
        tmp_path,
        'model = "m"\nepochs = 2\n[optimizer]\ntype = "sgd"\n[[packs]]\ntype = "checkpoint"\n',
        "a.toml",
    )
    b = load_config(
        write(
            tmp_path,
            'epochs = 2\nmodel = "m"\n[[packs]]\ntype = "checkpoint"\n[optimizer]\ntype = "sgd"\n',
            "b.toml",
        )
    )
    c = config_of(
        tmp_path,
        json.dumps(
            {"packs": ["checkpoint"], "optimizer": {"type": "sgd"}, "epochs": 2, "model": "m"}
        ),
        "c.json",
    )
    assert a == b == c
    assert a.digest() == b.digest() == c.digest()
    assert a.run_name() == b.run_name() == c.run_name()


def test_args_order_does_not_change_the_name(tmp_path: Path) -> None:
    a = config_of(tmp_path, FULL_TOML, "a.toml")
    b = config_of(tmp_path, REORDERED_TOML, "b.toml")
    assert a == b and a.digest() == b.digest()
    assert a.run_name() == b.run_name()


@pytest.mark.parametrize(
    "explicit",
    [
        "seed = 0",
        'mode = "train"',
        "packs = []",
        "imports = []",
        'optimizer = { type = "sgd" }',
        'optimizer = { type = "sgd", args = {} }',
        '[optimizer]\ntype = "sgd"',
    ],
)
def test_an_explicit_default_does_not_change_the_hash(tmp_path: Path, explicit: str) -> None:
    plain = config_of(tmp_path, 'model = "m"\noptimizer = "sgd"\n', "plain.toml")
    text = (
        'model = "m"\n'
        + (explicit if "optimizer" in explicit else f'{explicit}\noptimizer = "sgd"')
        + "\n"
    )
    assert config_of(tmp_path, text, "explicit.toml").digest() == plain.digest()
    assert config_of(tmp_path, text, "explicit.toml").run_name() == plain.run_name()


@pytest.mark.parametrize(
    "item",
    [
        "optimizer.args.lr=0.0051",
        "epochs=21",
        "packs.0.args.keep=3",
        "packs.0.args.every='2ep'",
        "model.args.hidden=65",
        "model.args.act='tanh'",
        "seed=1",
        "steps=121",
        "device='cuda'",
        "mode='infer'",
        "backend.type=plain",
        "backend.args.dtype='float16'",
        "imports=['x.py']",
        "optimizer.type=sgd",
        "interface=None",
        "packs=[{'type': 'tensorboard'}]",
        "model.args.extra=0",
        "optimizer.args.betas=[0.9, 0.999]",
    ],
)
def test_any_changed_value_changes_the_hash(tmp_path: Path, item: str) -> None:
    path = write(tmp_path, FULL_TOML)
    base, changed = load_config(path), load_config(path, [item])
    assert changed != base
    assert changed.digest() != base.digest()
    assert changed.run_name() != base.run_name()


def test_pack_order_changes_the_hash() -> None:
    one = RunConfig(model=Spec("m"), packs=(Spec("checkpoint"), Spec("tensorboard")))
    two = RunConfig(model=Spec("m"), packs=(Spec("tensorboard"), Spec("checkpoint")))
    assert one.digest() != two.digest()


def test_values_of_different_types_hash_differently() -> None:
    digests = {
        RunConfig(model=Spec("m", {"x": value})).digest()
        for value in (1, "1", True, [1], {"a": 1}, None)
    }
    assert len(digests) == 6


def test_an_int_set_over_a_float_hashes_like_the_float(tmp_path: Path) -> None:
    text = 'model = "m"\n[optimizer]\ntype = "sgd"\nargs = {{ lr = {} }}\n'
    overridden_config = load_config(
        write(tmp_path, text.format("0.5"), "a.toml"), ["optimizer.args.lr=1"]
    )
    written = load_config(write(tmp_path, text.format("1.0"), "b.toml"))
    assert overridden_config == written
    assert overridden_config.digest() == written.digest()


HASH_SCRIPT = """\
import sys
from runmodel.config.runconfig import load_config
config = load_config(sys.argv[1], sys.argv[2:])
print(config.digest(), config.run_name())
"""


def test_the_hash_is_the_same_in_other_processes(tmp_path: Path) -> None:
    path = write(tmp_path, FULL_TOML)
    overrides = ["model.args.extra={'b': 1, 'a': [1, 2], 'c': {'z': 1, 'y': 2}}"]
    here = load_config(path, overrides)
    runs = []
    for seed in ("0", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        runs.append(
            subprocess.Popen(
                [sys.executable, "-c", HASH_SCRIPT, str(path), *overrides],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=tmp_path,
            )
        )
    for run in runs:
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
        assert out.split() == [here.digest(), here.run_name()]


# -- safe, distinct directory names ---------------------------------------------------------

SAFE = re.compile(r"[A-Za-z0-9._=+-]+")


def assert_safe(config: RunConfig, root: Path) -> None:
    name = config.run_name()
    assert SAFE.fullmatch(name), name
    assert "/" not in name and "\\" not in name
    assert name not in (".", "..") and not name.startswith(".")
    assert ".." not in name
    assert len(name) <= 111
    assert name.endswith("_" + config.digest())
    assert run_dir_for(config, root).resolve().parent == root.resolve()


@pytest.mark.parametrize(
    "text",
    [
        "../../etc",
        "/abs/path",
        "..",
        ".",
        "...",
        "a b c",
        "naïve ünïcødé ✓",
        "名前",
        "x" * 500,
        "../" * 100,
        "\\..\\windows",
        "a/../../b",
        "-.-",
        "_",
        "",
        "~root",
        "a\nb",
        "$(rm -rf)",
        ".hidden",
        "\x00",
        "..a..b..",
        "a" * 39 + ".b",
    ],
)
def test_run_names_are_safe(tmp_path: Path, text: str) -> None:
    configs = [
        RunConfig(model=Spec(text)),
        RunConfig(model=Spec("m", {"arg": text})),
        RunConfig(model=Spec("m", {text: 1})),
        RunConfig(model=Spec(text, {text: text}), optimizer=Spec(text, {"lr": text})),
        RunConfig(model=Spec("m"), optimizer=Spec(text), mode="infer"),
    ]
    for config in configs:
        assert_safe(config, tmp_path)


def test_long_names_are_capped(tmp_path: Path) -> None:
    config = RunConfig(
        model=Spec("m" * 300, {"a" * 300: "b" * 300, "c": "d" * 300}),
        optimizer=Spec("o" * 300, {"lr": "x" * 300}),
        mode="benchmark",
    )
    assert len(config.run_name()) == 111
    assert_safe(config, tmp_path)


HYPOTHESIS_ROOT = Path(tempfile.gettempdir()) / "runmodel-test-runs"

values = st.one_of(
    st.text(), st.integers(), st.floats(), st.booleans(), st.none(), st.lists(st.text(), max_size=3)
)


@settings(max_examples=300, deadline=None)
@given(
    model=st.text(),
    args=st.dictionaries(st.text(), values, max_size=4),
    optimizer=st.none() | st.text(),
    optimizer_args=st.dictionaries(st.text(), values, max_size=3),
    mode=st.sampled_from(["train", "eval", "infer", "benchmark", "profile"]),
)
def test_any_text_gives_a_safe_name(
    model: str,
    args: dict[str, Any],
    optimizer: str | None,
    optimizer_args: dict[str, Any],
    mode: str,
) -> None:
    config = RunConfig(
        model=Spec(model, args),
        mode=mode,
        optimizer=None if optimizer is None else Spec(optimizer, optimizer_args),
    )
    assert_safe(config, HYPOTHESIS_ROOT)


def test_different_configs_get_different_directories(tmp_path: Path) -> None:
    base = RunConfig(model=Spec("m", {"hidden": 64}), optimizer=Spec("adam", {"lr": 0.1}))
    variations = [
        base,
        RunConfig(model=Spec("m", {"hidden": 65}), optimizer=Spec("adam", {"lr": 0.1})),
        RunConfig(model=Spec("m", {"hidden": 64}), optimizer=Spec("adam", {"lr": 0.2})),
        RunConfig(model=Spec("m", {"hidden": 64}), optimizer=Spec("sgd", {"lr": 0.1})),
        RunConfig(model=Spec("m", {"hidden": 64})),
        RunConfig(model=Spec("m", {"hidden": 64}), optimizer=Spec("adam", {"lr": 0.1}), seed=1),
        RunConfig(model=Spec("m", {"hidden": 64}), optimizer=Spec("adam", {"lr": 0.1}), epochs=2),
        RunConfig(
            model=Spec("m", {"hidden": 64}),
            optimizer=Spec("adam", {"lr": 0.1}),
            packs=(Spec("checkpoint"),),
        ),
        RunConfig(
            model=Spec("m", {"hidden": 64}),
            optimizer=Spec("adam", {"lr": 0.1}),
            backend=Spec("amp"),
        ),
        RunConfig(
            model=Spec("m", {"hidden": 64}), optimizer=Spec("adam", {"lr": 0.1}), mode="eval"
        ),
        # names that sanitise to the same readable part still differ by their hash
        RunConfig(model=Spec("m/x", {"hidden": 64}), optimizer=Spec("adam", {"lr": 0.1})),
        RunConfig(model=Spec("m x", {"hidden": 64}), optimizer=Spec("adam", {"lr": 0.1})),
        RunConfig(model=Spec("m" + "y" * 200, {"hidden": 64})),
        RunConfig(model=Spec("m" + "y" * 201, {"hidden": 64})),
    ]
    names = [config.run_name() for config in variations]
    assert len(set(names)) == len(names)
    assert len({run_dir_for(config, tmp_path) for config in variations}) == len(variations)


def test_run_dir_for_is_under_the_root(tmp_path: Path) -> None:
    config = RunConfig(model=Spec("m", {"a": 1}))
    assert run_dir_for(config, tmp_path) == tmp_path / config.run_name()
    assert run_dir_for(config, str(tmp_path)) == tmp_path / config.run_name()
    assert run_dir_for(config) == Path("runs") / config.run_name()


def test_equal_configs_share_a_directory(tmp_path: Path) -> None:
    a = RunConfig(model=Spec("m", {"a": 1, "b": 2}))
    b = RunConfig(model=Spec("m", {"b": 2, "a": 1}))
    assert a == b
    assert run_dir_for(a, tmp_path) == run_dir_for(b, tmp_path)


# -- round trip ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config",
    [
        FULL,
        RunConfig(model=Spec("m")),
        RunConfig(model=Spec("m", {"nested": {"a": [1, 2]}}), epochs=0, steps=0, mode="profile"),
        RunConfig(model=Spec("m"), setup={"lr": 0.5, "layers": [1, 2]}),
    ],
    ids=["full", "minimal", "nested", "setup"],
)
def test_to_dict_and_from_dict_round_trip(config: RunConfig) -> None:
    data = config.to_dict()
    # setup only where given: the configs of runs made before it keep their hashes
    assert list(data) == [f for f in FIELDS if f != "setup" or config.setup]
    again = RunConfig.from_dict(data)
    assert again == config and again.digest() == config.digest()
    through_json = RunConfig.from_dict(json.loads(json.dumps(data)))
    assert through_json == config and through_json.digest() == config.digest()


def test_to_dict_is_the_canonical_form() -> None:
    assert RunConfig(model=Spec("m"), backend=Spec("amp")).to_dict() == {
        "model": {"type": "m", "args": {}},
        "optimizer": None,
        "interface": None,
        "backend": {"type": "amp", "args": {}},
        "packs": [],
        "epochs": None,
        "steps": None,
        "seed": 0,
        "device": None,
        "mode": "train",
        "imports": [],
        "iterations": None,
    }

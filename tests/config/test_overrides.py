"""``--set KEY=VALUE`` read once, and the one rule for an option a model does not declare,
by where it was given."""

from __future__ import annotations

import re
import warnings

import pytest

import runmodel.config
from runmodel.config import closest
from runmodel.config.overrides import ConfigError, key_value, split_options, unknown_option
from runmodel.config.registry import ConfigError as RegistryConfigError
from runmodel.config.runconfig import apply_overrides
from runmodel.core import checks


@pytest.mark.parametrize(
    ("pair", "expected"),
    [
        ("lr=0.01", ("lr", 0.01)),
        ("hidden=3", ("hidden", 3)),
        ("flag=True", ("flag", True)),
        ("sizes=[1, 2]", ("sizes", [1, 2])),
        ("name=adam", ("name", "adam")),  # not a literal: the text itself
        ("name='adam'", ("name", "adam")),
        ("expr=a=b", ("expr", "a=b")),  # split on the first '='
        ("empty=", ("empty", "")),
    ],
)
def test_a_pair_is_a_key_and_a_literal_or_its_text(pair: str, expected: tuple) -> None:
    assert key_value(pair, "lr=0.01") == expected


@pytest.mark.parametrize("pair", ["lr", "=3"])
def test_a_pair_without_a_key_or_an_equals_sign_shows_the_example(pair: str) -> None:
    with pytest.raises(ConfigError, match=r"write KEY=VALUE, as in --set x=1$"):
        key_value(pair, "x=1")


def test_configs_and_model_sources_read_pairs_alike() -> None:
    data = apply_overrides({"epochs": 1, "device": "cpu"}, ["epochs=3", "device=b=c"])
    assert (data["epochs"], data["device"]) == (3, "b=c")

    class Net:
        init_defaults = {"hidden": 1, "name": "a"}

    assert split_options(["hidden=3", "name=b=c"], Net) == ({"hidden": 3, "name": "b=c"}, {})
    assert ConfigError is RegistryConfigError  # one error type, wherever it is imported


def test_an_undeclared_option_is_ignored_from_python_and_refused_from_configs_and_the_command_line() -> (  # noqa: E501
    None
):
    """Issue 38: one rule for a config and ``--set`` (a config only warned before)."""
    with pytest.warns(UserWarning, match=r"^Net: unknown init option 'hiden' ignored; did"):
        unknown_option("python", "Net", "init", "hiden", ["hidden"])
    for given, how in (
        ("config", "run.toml: model.args.hiden"),
        ("command line", "--set 'hiden=3'"),
    ):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(
                ConfigError,
                match=rf"^{re.escape(how)}: Net declares no init option 'hiden' \(did you "
                r"mean 'hidden'\?\); its options$",
            ):
                unknown_option(
                    given,  # type: ignore[arg-type]
                    "Net",
                    "init",
                    "hiden",
                    ["hidden"],
                    given_as=how,
                    declared="its options",
                )


def test_one_did_you_mean_for_every_layer() -> None:
    """config's hint is the core's (config is above the core now, which imports nothing
    else of runmodel): one guess, written as an aside or as a sentence."""
    assert closest is checks.closest
    assert runmodel.config.did_you_mean is checks.did_you_mean_aside
    choices = ["epochs", "steps", "epoch_end", "hidden", "lr"]
    assert checks.did_you_mean_aside("hiden", choices) == " (did you mean 'hidden'?)"
    assert checks.did_you_mean("hiden", choices) == " Did you mean 'hidden'?"
    assert checks.did_you_mean_aside("zzz", choices) == checks.did_you_mean("zzz", choices) == ""

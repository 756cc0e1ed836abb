"""The two checks options of every layer share: a whole number, and the did-you-mean
sentence for a name that is not one of the choices."""

from __future__ import annotations

import re

import pytest

from runmodel.core.checks import closest, did_you_mean, is_whole_number, whole_number


@pytest.mark.parametrize("value", [-1, 1.0, 2.5, True, False, "3", None])
def test_only_ints_at_least_the_least_are_whole_numbers(value: object) -> None:
    assert not is_whole_number(value, least=0)  # False == 0, and still no whole number
    with pytest.raises(
        ValueError, match=re.escape(f"Pack(k=) must be a whole number >= 0; got {value!r}")
    ):
        whole_number(value, "Pack(k=)")


def test_a_whole_number_is_returned_and_the_message_says_what_it_counts() -> None:
    assert whole_number(3, "k=", least=1) == 3
    assert whole_number(None, "k=", none=True) is None
    with pytest.raises(ValueError) as info:
        whole_number(
            0,
            "EarlyStopping(every=)",
            least=1,
            none=True,
            unit="epochs",
            meaning="as Evaluate's every=",
        )
    assert str(info.value) == (
        "EarlyStopping(every=) must be a whole number of epochs >= 1 or "
        "None (as Evaluate's every=); got 0"
    )


def test_did_you_mean_names_the_closest_choice_or_nothing() -> None:
    assert did_you_mean("epch_end", ["epoch_start", "epoch_end"]) == " Did you mean 'epoch_end'?"
    assert did_you_mean("zzz", ["epoch_start", "epoch_end"]) == ""
    assert closest("mx", ["min", "max"], cutoff=0.3) == "max"
    assert closest(3, ["3rd"], cutoff=0.5) == "3rd"  # any value, as it reads


@pytest.mark.parametrize(
    ("value", "above", "expected"),
    [
        (1, None, True),
        (0.5, 0, True),
        (0, 0, False),
        (-1.0, None, True),
        (True, None, False),  # a bool is not a number of anything
        ("1", None, False),
        (None, None, False),
        (float("nan"), 0, False),
    ],
)
def test_a_number_is_an_int_or_a_float_not_a_bool(
    value: object, above: float | None, expected: bool
) -> None:
    from runmodel.core.checks import is_number

    assert is_number(value, above=above) is expected


def test_a_whole_number_with_no_least_is_any_int() -> None:
    assert is_whole_number(-5, least=None) and not is_whole_number(-5)
    assert not is_whole_number(True, least=None) and not is_whole_number(1.0, least=None)

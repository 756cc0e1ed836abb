"""Checks that options of every layer make, written once: a number (not a bool), a whole
number (not a bool, not a float) at least some value, and the did-you-mean hint for a name
that is not one of the choices. They only build values and messages; the caller raises
with its own words around them, so each error still says whose option was wrong.

The did-you-mean is here once for every layer (the core imports nothing else of runmodel,
so everything may import it, the command line before torch too): ``closest`` is the guess,
written as a sentence of its own after an error's first sentence (``did_you_mean``:
`` Did you mean 'x'?``) or as an aside after a quoted name (``did_you_mean_aside``:
`` (did you mean 'x'?)``)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import TypeGuard

__all__ = [
    "closest",
    "did_you_mean",
    "did_you_mean_aside",
    "is_number",
    "is_whole_number",
    "whole_number",
]


def is_number(value: object, above: float | None = None) -> TypeGuard[int | float]:
    """Whether ``value`` is an ``int`` or a ``float`` (a ``bool`` is not), and greater
    than ``above`` when one is given."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and (above is None or value > above)
    )


def is_whole_number(value: object, least: int | None = 0) -> TypeGuard[int]:
    """Whether ``value`` is an ``int`` (a ``bool`` is not) and at least ``least`` (any
    ``int``, with None)."""
    return (
        isinstance(value, int) and not isinstance(value, bool) and (least is None or value >= least)
    )


def whole_number(
    value: object,
    what: str,
    *,
    least: int = 0,
    none: bool = False,
    unit: str = "",
    meaning: str = "",
) -> int | None:
    """``value`` if it is a whole number >= ``least`` (or None, when ``none``); else a
    ``ValueError`` that reads ``{what} must be a whole number[ of {unit}] >= {least}
    [ or None][ ({meaning})]; got {value!r}``: ``what`` names the option as its owner
    writes it (``"EarlyStopping(patience=)"``, ``"warmup="``), ``meaning`` says what it
    counts."""
    if value is None and none:
        return None
    if not is_whole_number(value, least):
        of = f" of {unit}" if unit else ""
        detail = f" ({meaning})" if meaning else ""
        raise ValueError(
            f"{what} must be a whole number{of} >= {least}"
            f"{' or None' if none else ''}{detail}; got {value!r}"
        )
    return value


def closest(value: object, choices: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The choice nearest ``value`` as a person would misspell it (``difflib``'s
    ratio of at least ``cutoff``), or None."""
    found = difflib.get_close_matches(str(value), list(choices), n=1, cutoff=cutoff)
    return found[0] if found else None


def did_you_mean(value: object, choices: Iterable[str], cutoff: float = 0.6) -> str:
    """``" Did you mean 'x'?"`` for the nearest choice, or ``""``: the sentence to put
    after an error's first sentence."""
    found = closest(value, choices, cutoff)
    return f" Did you mean {found!r}?" if found is not None else ""


def did_you_mean_aside(value: object, choices: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the nearest choice, or ``""``: the aside to put
    after a quoted name that names nothing (a config key, a model option, a column)."""
    found = closest(value, choices)
    return f" (did you mean {found!r}?)" if found is not None else ""

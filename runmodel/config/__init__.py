"""Runs described as data: registries of named things (``registry``), runmodel's own
registrations (``builtins``) and ``RunConfig`` (``runconfig``). Nothing here runs a
model: a config run in its folder is ``runmodel.runs``, above the engine. The public names
are exported by ``runmodel``.

Here, importing nothing (the command line asks them before torch is imported):
``is_config_file``, and ``did_you_mean``, the one hint for a name that names nothing (a
config key, a model option, a column of ``runmodel runs``), after ``closest``, the one
guess of what it meant. ``runmodel.core.checks`` keeps the same two for the core, which
imports nothing else of runmodel (nor can this, below the core, import it): the same
guess, and its hint written as a sentence of its own (`` Did you mean 'x'?``), where this
one is an aside after a quoted name (`` (did you mean 'x'?)``)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["closest", "did_you_mean", "is_config_file"]

#: The files a config is read from (``runconfig.read_config_file``).
CONFIG_SUFFIXES = (".toml", ".json")


def is_config_file(source: str) -> bool:
    """Whether ``source`` names a config file (rather than a model or a script)."""
    return source.endswith(CONFIG_SUFFIXES)


def closest(value: object, choices: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The choice nearest ``value`` as a person would misspell it (``difflib``'s
    ratio of at least ``cutoff``), or None."""
    found = difflib.get_close_matches(str(value), list(choices), n=1, cutoff=cutoff)
    return found[0] if found else None


def did_you_mean(key: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'NAME'?)`` for the choice closest to ``key``, or ``""``."""
    close = closest(key, choices)
    return f" (did you mean {close!r}?)" if close is not None else ""

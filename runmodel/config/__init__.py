"""Runs described as data: registries of named things (``registry``), runmodel's own
registrations (``builtins``) and ``RunConfig`` (``runconfig``). Nothing here runs a
model: a config run in its folder is ``runmodel.runs``, above the engine. The public names
are exported by ``runmodel``.

Here, importing nothing (the command line asks them before torch is imported):
``is_config_file``, and ``did_you_mean``, the one hint for a name that names nothing (a
config key, a model option, a column of ``runmodel runs``)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["did_you_mean", "is_config_file"]

#: The files a config is read from (``runconfig.read_config_file``).
CONFIG_SUFFIXES = (".toml", ".json")


def is_config_file(source: str) -> bool:
    """Whether ``source`` names a config file (rather than a model or a script)."""
    return source.endswith(CONFIG_SUFFIXES)


def did_you_mean(key: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'NAME'?)`` for the choice closest to ``key``, or ``""``."""
    close = difflib.get_close_matches(key, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""

"""Runs described as data: registries of named things (``registry``), runmodel's own
registrations (``builtins``) and ``RunConfig`` (``runconfig``). Nothing here runs a
model: a config run in its folder is ``runmodel.runs``, above the engine. The public names
are exported by ``runmodel``.

Here, importing nothing but ``runmodel.core.checks`` (the command line asks them before
torch is imported): ``is_config_file``; and ``closest`` and ``did_you_mean``, the guess
and the aside hint for a name that names nothing (a config key, a model option, a column
of ``runmodel runs``), which are the core's (``core/checks.py``: the one did-you-mean)."""

from __future__ import annotations

from ..core.checks import closest
from ..core.checks import did_you_mean_aside as did_you_mean

__all__ = ["closest", "did_you_mean", "is_config_file"]

#: The files a config is read from (``runconfig.read_config_file``).
CONFIG_SUFFIXES = (".toml", ".json")


def is_config_file(source: str) -> bool:
    """Whether ``source`` names a config file (rather than a model or a script)."""
    return source.endswith(CONFIG_SUFFIXES)

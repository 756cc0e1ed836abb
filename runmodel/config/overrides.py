"""Options given as text, and what becomes of an option a model does not declare.

``--set KEY=VALUE`` is read here once (``key_value``), for a config's dotted keys
(``runconfig.apply_overrides``) and a model source's options (``split_options``) alike.

An option a model does not declare (not in its ``init_defaults`` or ``setup_defaults``)
meets one rule by where it was given (``REFUSED``), decided here in ``unknown_option``:
from Python it is ignored with one warning (the model contract); in a config file and on
the command line it is refused before anything runs, with a did-you-mean. The table is
docs/models.md's "Options a model does not declare".

Standard library only: the command line reads options before torch is imported.
"""

from __future__ import annotations

import ast
import sys
import warnings
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from ..core.checks import closest, did_you_mean_aside

__all__ = [
    "ConfigError",
    "Given",
    "key_value",
    "split_options",
    "unknown_option",
    "unknown_option_text",
]


class ConfigError(ValueError):
    """A config that cannot describe a run: malformed, an unknown key, a wrong type, a
    model option the model does not declare."""


#: Where an option was given: the rows of docs/models.md's table.
Given = Literal["python", "config", "command line"]

#: Whether an option a model does not declare is refused where it was given (the rest
#: are ignored with a warning).
REFUSED: dict[Given, bool] = {"python": False, "config": True, "command line": True}


def key_value(pair: str, example: str) -> tuple[str, Any]:
    """``KEY=VALUE`` as the key and the value: a Python literal (``3``, ``0.01``,
    ``True``, ``[1, 2]``, ``"text"``), or else the text itself. A pair without ``=`` or
    without a key is a ``ConfigError`` that shows ``example``."""
    key, sep, text = pair.partition("=")
    if not sep or not key:
        raise ConfigError(f"--set {pair!r}: write KEY=VALUE, as in --set {example}")
    try:
        return key, ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return key, text


def unknown_option_text(owner: str, kind: str, key: str, known: Iterable[str]) -> str:
    """The one warning for an option ``owner`` does not declare: it is ignored, with a
    did-you-mean when a declared name is close."""
    names = sorted(known)
    close = closest(key, names)
    hint = f"; did you mean {close!r}?" if close else ""
    return (
        f"{owner}: unknown {kind} option {key!r} ignored{hint} (known: "
        f"{', '.join(names) or 'none'})"
    )


def unknown_option(
    given: Given,
    owner: str,
    kind: str,
    key: str,
    known: Iterable[str],
    *,
    given_as: str = "",
    declared: str = "",
    stacklevel: int = 2,
) -> None:
    """What becomes of option ``key`` (an ``init`` or ``setup`` option, ``kind``) that
    ``owner`` does not declare (``known``: its names of that kind), by where it was
    ``given``: a warning (the caller leaves the option out), or a ``ConfigError`` that
    reads ``{given_as}: {owner} declares no {kind} option {key!r}`` with a did-you-mean
    and ``declared`` (what the model declares). ``stacklevel`` is the warning's, counted
    from the caller."""
    known = list(known)
    if not REFUSED[given]:
        warnings.warn(
            unknown_option_text(owner, kind, key, known), UserWarning, stacklevel=stacklevel + 1
        )
        return
    what = f"{kind} option" if kind else "option"
    raise ConfigError(
        f"{given_as}: {owner} declares no {what} {key!r}"
        f"{did_you_mean_aside(key, known)}; {declared}"
    )


def split_options(pairs: Sequence[str], cls: type) -> tuple[dict[str, Any], dict[str, Any]]:
    """``--set`` pairs as init and setup options of the model class ``cls``. ``KEY`` is
    ``NAME``, ``init.NAME`` or ``setup.NAME``; a bare ``NAME`` is an init option where the
    model declares one of that name (``init_defaults``), else a setup option. A name the
    model does not declare is refused (``unknown_option``); where the model declares no
    options of that kind, it is passed through, with one warning."""
    known = {
        "init": dict(getattr(cls, "init_defaults", None) or {}),
        "setup": dict(getattr(cls, "setup_defaults", None) or {}),
    }
    given: dict[str, dict[str, Any]] = {"init": {}, "setup": {}}
    unchecked: dict[str, list[str]] = {"init": [], "setup": []}
    for pair in pairs:
        key, value = key_value(pair, "lr=0.01")
        scope, _, name = key.rpartition(".")
        if scope not in ("", "init", "setup"):
            raise ConfigError(f"--set {pair!r}: the key is NAME, init.NAME or setup.NAME")
        named = scope  # the kind the key names, if it names one
        if not scope:
            scope = "init" if name in known["init"] else "setup"
        if known[scope] and name not in known[scope]:
            kinds = [named] if named else [kind for kind in ("init", "setup") if known[kind]]
            unknown_option(
                "command line",
                cls.__name__,
                named,
                name,
                [n for kind in kinds for n in known[kind]],
                given_as=f"--set {pair!r}",
                declared="; ".join(
                    f"{kind} options: {', '.join(known[kind]) or 'none'}"
                    for kind in ("init", "setup")
                ),
            )
        if not known[scope]:  # the model reads them itself: none can be called unknown
            close = did_you_mean_aside(name, [*known["init"], *known["setup"]])
            unchecked[scope].append(f"--set {pair!r}{close}")
        given[scope][name] = value
    for scope, said in unchecked.items():
        if said:
            print(
                f"runmodel: warning: {cls.__name__} declares no {scope} options "
                f"({scope}_defaults), so these go to it unchecked: {', '.join(said)}",
                file=sys.stderr,
            )
    return given["init"], given["setup"]

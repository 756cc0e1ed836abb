"""A package's public names in one mapping, each imported from its module on first use.

A package's ``__init__`` writes::

    __all__ = ["Engine", "Spec"]

    __getattr__, __dir__ = lazy_exports(
        __name__,
        {"Engine": ".engine", "Spec": ".config.registry"},
        deprecated={"FineTuneSpec": "runmodel.core.RunHorizon"},
    )

and, for type checkers, the same names imported under ``if TYPE_CHECKING:``. ``__all__``
stays a plain list, as linters and the API reference read it (they do not run code);
``lazy_exports`` refuses a name missing from it, and ``tests/test_exports.py`` checks
that the three agree. A module name starting with a dot is relative to the package.

A deprecated name is the object at its new place, with a ``DeprecationWarning`` that
names it; runmodel's own modules read old names quietly (the ones not switched yet), so
that the warning is for a user's code.

It imports nothing of runmodel, so that the core, whose ``__init__`` uses it, loads
without the rest.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str,
    exports: Mapping[str, str],
    *,
    deprecated: Mapping[str, str] | None = None,
    submodules: Iterable[str] = (),
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``exports`` maps names of its
    ``__all__`` to the modules defining them, ``deprecated`` an old name to the dotted
    path of what replaced it, and ``submodules`` are packages imported when read as
    attributes (``runmodel.backends``)."""
    unlisted = set(exports) - set(getattr(sys.modules[package], "__all__", ()))
    if unlisted:
        raise ImportError(f"{package}: {sorted(unlisted)} imported on first use, not in __all__")
    old_names = dict(deprecated or {})
    below = frozenset(submodules)

    def __getattr__(name: str) -> Any:
        if name in exports:
            value = getattr(importlib.import_module(exports[name], package), name)
            sys.modules[package].__dict__[name] = value  # the next read is a plain attribute
            return value
        if name in old_names:
            module, _, new = old_names[name].rpartition(".")
            # quiet for runmodel's own modules (the ones not switched yet) and for the
            # import machinery, which reads the name before ``from ... import`` does
            reader = sys._getframe(1).f_globals.get("__name__", "")
            if not reader.startswith(("runmodel.", "importlib")) and reader != "runmodel":
                warnings.warn(
                    f"{package}.{name} is deprecated: use {old_names[name]}",
                    DeprecationWarning,
                    stacklevel=2,
                )
            return getattr(importlib.import_module(module), new)
        if name in below:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*sys.modules[package].__dict__, *exports, *below})

    return __getattr__, __dir__

"""Load a model from a source string: ``path/file.py``, ``path/file.py:ClassName`` or
``package.module:ClassName``."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import itertools
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from .model import Model

__all__ = ["configure_engine", "load_model", "load_model_class", "load_source"]

_loads = itertools.count()
_FORMS = "'path/file.py', 'path/file.py:ClassName' or 'package.module:ClassName'"


def load_source(source: str) -> tuple[ModuleType, str | None]:
    """Import the module a source string names; return it and the class name, if any."""
    if not isinstance(source, str) or not source.strip():
        raise ValueError(f"a model source is {_FORMS}, got {source!r}")
    location, _, class_name = source.partition(":")
    if ":" in source and not class_name.isidentifier():
        raise ValueError(
            f"{source!r}: {class_name!r} after ':' is not a class name; a model source is {_FORMS}"
        )
    if location.endswith(".py") or "/" in location or "\\" in location:
        return _load_file(Path(location), source), class_name or None
    if not class_name:
        raise ValueError(
            f"{source!r}: name the class of a module, as 'package.module:ClassName' "
            f"(or give a path ending in .py)"
        )
    try:
        return importlib.import_module(location), class_name
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(
            f"{source!r}: cannot import module {location!r} ({error}); "
            f"is it installed, or on sys.path?"
        ) from None


def _load_file(path: Path, source: str) -> ModuleType:
    if not path.is_file():
        raise FileNotFoundError(f"{source!r}: no file {str(path)!r} (looked in {Path.cwd()})")
    # A fresh, unique module name per load: the same file loads twice side by side, and
    # pickling, dataclasses and tracebacks find the module in sys.modules.
    name = f"runmodel_source_{path.stem}_{next(_loads)}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{source!r}: cannot load {str(path)!r} as Python source")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def configure_engine(source: Any, engine: Any, model: Any = None) -> bool:
    """Call ``configure(engine)`` of ``source`` (a module), or of the module that defines
    ``source`` (a model class or factory), if it has one: how a model file attaches the
    hooks and packs it wants, for command-line and config runs alike. A ``configure``
    whose second parameter is ``model`` (or has no default) is called
    ``configure(engine, model)`` with the run's model,
    built with its resolved options (``model.init_options``), so what it attaches may
    depend on them (the layer count deciding an unfreeze schedule). Returns whether there
    was one."""
    module = (
        source
        if isinstance(source, ModuleType)
        else sys.modules.get(getattr(source, "__module__", "") or "")
    )
    configure = getattr(module, "configure", None)
    if not callable(configure):
        return False
    if _takes_model(configure):
        configure(engine, model)
    else:
        configure(engine)
    return True


def _takes_model(configure: Any) -> bool:
    """Whether ``configure`` takes the model: a second positional parameter named
    ``model`` or without a default (``configure(engine, out=".")``, a script's own option,
    is called as ``configure(engine)``, as before)."""
    try:
        parameters = inspect.signature(configure).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < 2:
        return False
    second = positional[1]
    return second.name == "model" or second.default is second.empty


def load_model_class(source: str) -> type[Model]:
    """The ``Model`` subclass a source string names (see ``load_model``)."""
    module, class_name = load_source(source)
    defined = [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj)
        and issubclass(obj, Model)
        and obj.__module__ == module.__name__
        and not inspect.isabstract(obj)
    ]
    names = ", ".join(sorted(c.__name__ for c in defined)) or "none"
    if class_name is not None:
        found = getattr(module, class_name, None)
        if not (inspect.isclass(found) and issubclass(found, Model)):
            what = "is not a runmodel.Model subclass" if found is not None else "is not defined"
            raise ValueError(f"{source!r}: {class_name!r} {what}; Model subclasses there: {names}")
        if inspect.isabstract(found):
            missing = ", ".join(sorted(found.__abstractmethods__))
            raise ValueError(
                f"{source!r}: {class_name!r} is abstract (it does not define "
                f"{missing}); Model subclasses there: {names}"
            )
        return found
    if len(defined) != 1:
        hint = (
            f"name one, as '{source}:{defined[0].__name__}'"
            if defined
            else "define one, or name a class as file.py:ClassName"
        )
        raise ValueError(
            f"{source!r} defines {'several' if defined else 'no'} runmodel.Model "
            f"subclasses ({names}); {hint}"
        )
    return defined[0]


def load_model(
    source: str, device: str | None = None, init_options: dict[str, Any] | None = None
) -> Model:
    """Load and construct the model a source string names.

    ``path/file.py`` takes the one ``Model`` subclass defined in the file (none or
    several is an error listing them); ``path/file.py:ClassName`` and
    ``package.module:ClassName`` name it. Each load imports the file afresh.
    """
    return load_model_class(source)(device=device, init_options=init_options)

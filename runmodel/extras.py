"""Optional dependencies: which pip extra brings each one, and errors that say so.

    >>> from runmodel.extras import require
    >>> datasets = require("sklearn.datasets", needed_by="examples/digits.py")

A missing one raises ``ModuleNotFoundError`` whose message names what to install:
``examples/digits.py needs scikit-learn (import sklearn): pip install 'runmodel[examples]'``.
``hint(error)`` gives the same advice for any ``ModuleNotFoundError`` of a module in the
table, wherever it was raised (the ``runmodel`` command adds it to its error line).

This module imports nothing but the standard library, so anything can use it.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import NamedTuple

__all__ = ["OPTIONAL", "Dependency", "hint", "install_command", "require"]


class Dependency(NamedTuple):
    """An optional dependency: its pip name and the runmodel extra that installs it
    (``None``: no extra does, install it by its pip name)."""

    pip: str
    extra: str | None


#: Top-level module name -> what installs it (keep in step with pyproject.toml's extras).
OPTIONAL: dict[str, Dependency] = {
    "sklearn": Dependency("scikit-learn", "examples"),
    "matplotlib": Dependency("matplotlib", "plot"),
    "mkdocs": Dependency("mkdocs", "docs"),
    "material": Dependency("mkdocs-material", "docs"),
    "mkdocstrings": Dependency("mkdocstrings[python]", "docs"),
    "mkdocstrings_handlers": Dependency("mkdocstrings[python]", "docs"),
    # StatefulDataLoader (exact resume mid-epoch with workers) is the user's choice of loader:
    # only the dev extra installs it, so say the pip name
    "torchdata": Dependency("torchdata", None),
    "optuna": Dependency("optuna", "sweep"),
    # `runmodel export --format onnx`: the exporter (torch.onnx, dynamo) and the check
    "onnx": Dependency("onnx", "onnx"),
    "onnxscript": Dependency("onnxscript", "onnx"),
    "onnxruntime": Dependency("onnxruntime", "onnx"),
    # the MLflow pack: MLflow's client (mlflow-skinny) and its local SQLite store
    "mlflow": Dependency("mlflow-skinny", "mlflow"),
    # Hugging Face models (docs/huggingface.md; any model works without it)
    "transformers": Dependency("transformers", "hf"),
    # Lightning's fine-tuning example beside its port (docs/migrating_lightning.md)
    "lightning": Dependency("lightning", "lightning"),
    "torchmetrics": Dependency("torchmetrics", "lightning"),
}


def _top(module: str) -> str:
    return module.partition(".")[0]


def install_command(module: str, extra: str | None = None) -> str:
    """The pip command that brings ``module``: ``pip install 'runmodel[EXTRA]'`` for a
    module an extra installs (``extra`` overrides the table's), else ``pip install NAME``."""
    known = OPTIONAL.get(_top(module))
    extra = extra or (known.extra if known else None)
    if extra:
        return f"pip install 'runmodel[{extra}]'"
    return f"pip install {known.pip if known else _top(module)}"


def _message(module: str, extra: str | None, needed_by: str | None) -> str:
    known = OPTIONAL.get(_top(module))
    pip = known.pip if known else _top(module)
    return (
        f"{needed_by or 'this'} needs {pip} (import {_top(module)}): "
        f"{install_command(module, extra)}"
    )


def require(module: str, extra: str | None = None, *, needed_by: str | None = None) -> ModuleType:
    """Import ``module`` (``"sklearn.datasets"``) and return it; if it (or its package) is
    not installed, raise ``ModuleNotFoundError`` saying what ``needed_by`` needs and the pip
    command that installs it (the extra from ``OPTIONAL``, or ``extra``).

    A module that is installed but fails on one of its own imports is not ours to explain:
    that error is raised as it is.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        missing = error.name or ""
        if missing != module and not module.startswith(missing + "."):
            raise  # e.g. scikit-learn is there but one of its dependencies is broken
        raise ModuleNotFoundError(
            _message(module, extra, needed_by), name=error.name, path=error.path
        ) from error


def hint(error: BaseException) -> str | None:
    """For an error caused by a missing optional module (the error itself, its cause or
    its context), the advice ``"scikit-learn is an optional dependency: pip install
    'runmodel[examples]'"``; ``None`` for any other error, or one that says so already."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ModuleNotFoundError) and current.name:
            known = OPTIONAL.get(_top(current.name))
            if known is not None:
                if "pip install" in str(error):  # require() said it already
                    return None
                return f"{known.pip} is an optional dependency: {install_command(current.name)}"
        current = current.__cause__ or current.__context__
    return None

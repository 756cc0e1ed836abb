"""Scripts run by the ``runmodel`` command: a ``.py`` file that is no model source runs as
``__main__`` (with its arguments, from its working folder) up to its first
``engine.run``, which then does what the command asked instead of training: describe,
benchmark or profile, evaluate or infer with a trained run's weights, continue the run.
"""

from __future__ import annotations

import ast
import os
import runpy
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..core import RunResult
from ..engine import RunArguments, instead_of_first_run

__all__ = ["ScriptEnded", "is_script", "run_script"]

#: What the command does in place of the script's ``engine.run``:
#: ``instead(engine, model, run_arguments) -> result``.
Instead = Callable[[Any, Any, RunArguments], Any]


class ScriptEnded(BaseException):
    """Ends the script once its ``engine.run`` did the asked thing (a ``BaseException``,
    so the script's ``except Exception`` does not catch it)."""

    def __init__(self, result: Any) -> None:
        super().__init__("the runmodel command ended the script after its engine.run")
        self.result = result


_MODEL_BASES = {"Model", "TorchModel"}


def is_script(source: str) -> bool:
    """Whether ``source`` is a script: a ``.py`` file (with no ``:Class``) that defines no
    ``Model`` subclass. Read, not imported: a script's top level is its run."""
    if ":" in source or not source.endswith(".py") or not Path(source).is_file():
        return False
    try:
        tree = ast.parse(Path(source).read_text(), source)
    except (OSError, SyntaxError, ValueError):
        return False
    models = set(_MODEL_BASES)
    changed = True
    while changed:  # a class whose base is one of the file's model classes is one too
        changed = False
        for node in tree.body:
            if (
                isinstance(node, ast.ClassDef)
                and node.name not in models
                and any(_base_name(base) in models for base in node.bases)
            ):
                models.add(node.name)
                changed = True
    return not (models - _MODEL_BASES)


def _base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def run_script(
    script: str | os.PathLike[str],
    argv: Sequence[str],
    cwd: str | os.PathLike[str],
    instead: Instead,
) -> Any:
    """Run ``script`` as ``__main__`` with ``argv`` from ``cwd`` until its first
    ``engine.run``, which calls ``instead(engine, model, arguments)``; its return value."""
    script = Path(script).resolve()

    def replaced(engine: Any, model: Any, arguments: RunArguments) -> RunResult:
        raise ScriptEnded(instead(engine, model, arguments))

    saved = sys.argv[:], os.getcwd(), sys.path[:]
    sys.argv = [str(script), *argv]
    sys.path.insert(0, str(script.parent))
    os.chdir(cwd)
    try:
        with instead_of_first_run(replaced):
            runpy.run_path(str(script), run_name="__main__")
    except ScriptEnded as ended:
        return ended.result
    finally:
        sys.argv, sys.path[:] = saved[0], saved[2]
        os.chdir(saved[1])
    raise RuntimeError(
        f"{script} ended without calling engine.run(...): the runmodel command "
        f"acts at a script's first engine.run"
    )

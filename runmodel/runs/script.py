"""Scripts run by the ``runmodel`` command: a ``.py`` file that is no model source
(``is_script``: it defines no ``Model``, or sets its run up under ``if __name__ ==
"__main__":`` without a ``configure(engine)``) runs as ``__main__`` (with its arguments,
from its working folder) up to its first ``engine.run``, which then does what the
command asked instead of training: describe, benchmark or profile, evaluate or infer
with a trained run's weights, continue the run.
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

__all__ = ["ScriptEnded", "is_script", "main_block_ignored", "run_script"]

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
    """Whether ``source`` is a script, the one rule every command follows: a ``.py`` file
    (with no ``:Class``) that defines no ``Model`` subclass, or one that sets its run up
    under ``if __name__ == "__main__":`` and defines no ``configure(engine)`` (that block
    is then the only place its packs and hooks are attached, and only running the file
    as a script honours it). Read, not imported: a script's top level is its run."""
    if ":" in source:
        return False
    tree = _parsed(source)
    if tree is None:
        return False
    return not _defines_model(tree) or (_has_main_block(tree) and not _defines_configure(tree))


def main_block_ignored(source: str) -> bool:
    """Whether a command that loads ``source`` as a model source leaves out setup the file
    has: a ``file.py:Class`` whose file sets its run up under ``if __name__ ==
    "__main__":`` and defines no ``configure(engine)``."""
    location = source.partition(":")[0]
    tree = _parsed(location) if ":" in source else None
    return tree is not None and _has_main_block(tree) and not _defines_configure(tree)


def _parsed(path: str) -> ast.Module | None:
    if not path.endswith(".py") or not Path(path).is_file():
        return None
    try:
        return ast.parse(Path(path).read_text(), path)
    except (OSError, SyntaxError, ValueError):
        return None


def _defines_model(tree: ast.Module) -> bool:
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
    return bool(models - _MODEL_BASES)


def _has_main_block(tree: ast.Module) -> bool:
    """A top-level ``if __name__ == "__main__":``."""
    for node in tree.body:
        test = node.test if isinstance(node, ast.If) else None
        if isinstance(test, ast.Compare) and len(test.comparators) == 1:
            sides = {ast.dump(test.left), ast.dump(test.comparators[0])}
            if isinstance(test.ops[0], ast.Eq) and sides == {
                ast.dump(ast.Name("__name__", ast.Load())),
                ast.dump(ast.Constant("__main__")),
            }:
                return True
    return False


def _defines_configure(tree: ast.Module) -> bool:
    """A top-level ``configure``: a function, or a name imported as it."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "configure":
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
            (alias.asname or alias.name) == "configure" for alias in node.names
        ):
            return True
    return False


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

"""Every package's public names: the list a package exports (``__all__``) agrees with
what its ``if TYPE_CHECKING:`` block names for type checkers (where the names are imported
on first use, by ``runmodel.core.exports.lazy_exports``), every name resolves to the
object the block names, and an old name warns and gives the new one."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
import sys
import warnings
from pathlib import Path
from types import ModuleType

import pytest

import runmodel
import runmodel.core
from runmodel.core.exports import lazy_exports

PACKAGES = sorted(
    [
        "runmodel",
        "runmodel.plot",
        *(
            info.name
            for info in pkgutil.walk_packages(runmodel.__path__, "runmodel.")
            if info.ispkg
        ),
    ]
)


#: packages that still write their __getattr__ by hand (without __dir__): none
HAND_WRITTEN: set[str] = set()


def type_checking_block(module: ModuleType) -> dict[str, tuple[str, str]]:
    """What the module's top-level ``if TYPE_CHECKING:`` block names: each name it binds
    -> (the module it comes from, the name there). An import binds a name; an
    assignment ``old = new`` or ``old = module.new`` binds an old (deprecated) name."""
    assert module.__file__ is not None
    tree = ast.parse(Path(module.__file__).read_text())
    package = module.__name__ if module.__file__.endswith("__init__.py") else module.__package__
    found: dict[str, tuple[str, str]] = {}
    modules: dict[str, str] = {}  # modules the block imports, by the name they are bound to
    for node in tree.body:
        if not (isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"):
            continue
        for statement in node.body:
            if isinstance(statement, ast.ImportFrom):
                source = importlib.util.resolve_name(
                    "." * statement.level + (statement.module or ""), package
                )
                for alias in statement.names:
                    bound, full = alias.asname or alias.name, f"{source}.{alias.name}"
                    if importlib.util.find_spec(full) if _is_package(source) else False:
                        modules[bound] = full  # a module, not a name
                    else:
                        found[bound] = (source, alias.name)
            else:
                assert isinstance(statement, ast.Assign), ast.unparse(statement)
                [target], value = statement.targets, statement.value
                assert isinstance(target, ast.Name)
                if isinstance(value, ast.Attribute):
                    assert isinstance(value.value, ast.Name)
                    found[target.id] = (modules[value.value.id], value.attr)
                else:
                    assert isinstance(value, ast.Name)
                    found[target.id] = found[value.id]
    return found


def _is_package(name: str) -> bool:
    spec = importlib.util.find_spec(name)
    return spec is not None and spec.submodule_search_locations is not None


def test_every_package_is_walked() -> None:
    assert {"runmodel.core", "runmodel.runs", "runmodel.backends.distributed"} <= set(PACKAGES)
    assert "runmodel.checkpoint.sharded" in PACKAGES


@pytest.mark.parametrize("name", PACKAGES)
def test_a_packages_exports_agree_with_its_type_checking_block_and_resolve(name: str) -> None:
    package = importlib.import_module(name)
    exported = getattr(package, "__all__", None)
    declared = type_checking_block(package)
    if exported is None:  # exports nothing (runmodel.integrations): nothing to declare
        assert not declared
        return
    assert len(exported) == len(set(exported)), "a name listed twice"
    if declared:  # names imported on first use: each declared for type checkers
        assert set(exported) - set(declared) == set(), "exported, not declared"
    for public in exported:
        value = getattr(package, public)  # resolves, without a warning (none are errors)
        if public in declared:
            source, original = declared[public]
            assert value is getattr(importlib.import_module(source), original), public
    if name not in HAND_WRITTEN:
        assert set(exported) <= set(dir(package))
    for old in set(declared) - set(exported):  # declared, not exported: an old name
        source, original = declared[old]
        with pytest.warns(DeprecationWarning, match=rf"{name}\.{old} is deprecated"):
            value = getattr(package, old)
        assert value is getattr(importlib.import_module(source), original)


def test_the_renamed_names_warn_and_give_the_new_ones() -> None:
    with pytest.warns(DeprecationWarning, match=r"use runmodel\.core\.RunHorizon"):
        assert runmodel.FineTuneSpec is runmodel.core.RunHorizon  # type: ignore[attr-defined]
    with pytest.warns(DeprecationWarning, match=r"use runmodel\.core\.BareEngine"):
        assert runmodel.core.Engine is runmodel.core.BareEngine
    with pytest.warns(DeprecationWarning, match=r"use runmodel\.core\.ModeLike"):
        from runmodel.core import Mode
    assert Mode is runmodel.core.ModeLike
    with pytest.warns(DeprecationWarning, match=r"metric_watcher\.DIRECTIONS"):
        from runmodel.packs.metric_watcher import MODES
    assert MODES == ("min", "max")
    with pytest.warns(DeprecationWarning, match=r"use runmodel\.runs\.plot\.main"):
        from runmodel.plot import main
    assert main is importlib.import_module("runmodel.runs.plot").main


def test_an_import_of_an_old_name_warns_once_and_runmodels_own_modules_read_it_quietly() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from runmodel.core import FineTuneSpec  # noqa: F401
    assert [str(w.message) for w in caught] == [
        "runmodel.core.FineTuneSpec is deprecated: use runmodel.core.RunHorizon"
    ]
    assert caught[0].filename == __file__  # the warning points at the import
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # a module of runmodel not switched to the new name yet
        exec("from runmodel.core import FineTuneSpec", {"__name__": "runmodel.backends.x"})


def test_lazy_exports_imports_on_first_read_and_keeps_the_value() -> None:
    module = ModuleType("runmodel_test_exports")
    module.__all__ = ["dumps"]
    sys.modules[module.__name__] = module
    try:
        module.__getattr__, module.__dir__ = lazy_exports(  # type: ignore[attr-defined]
            module.__name__, {"dumps": "json"}, deprecated={"old": "json.loads"}
        )
        assert "dumps" not in vars(module) and "dumps" in dir(module)
        assert module.dumps is importlib.import_module("json").dumps
        assert "dumps" in vars(module)  # the next read is a plain attribute
        with pytest.warns(DeprecationWarning):
            assert module.old is importlib.import_module("json").loads
        assert "old" not in vars(module)  # so that each read warns
        with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
            module.nothing  # noqa: B018
        with pytest.raises(ImportError, match=r"\['loads'\] imported on first use, not in __all__"):
            lazy_exports(module.__name__, {"dumps": "json", "loads": "json"})
    finally:
        del sys.modules[module.__name__]

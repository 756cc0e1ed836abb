"""The package's layers: each module imports only from layers below its own (or from its
own folder), and no imports go round in a circle. Imports inside functions count. Imports
under ``if TYPE_CHECKING:`` are for type checkers only: they do not count for the layers,
but they do for circles (a circle of type hints is a circle of meaning; a ``Protocol`` in
the lower module ends it), except inside ``runmodel.core``, whose parts name the engine
that holds them in their type hints.

The layers are README's "Layout" table, read here: the map a reader trusts first is the
one the test checks.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "runmodel"

README = PACKAGE.parent / "README.md"


def read_layers(readme: Path) -> list[tuple[str, ...]]:
    """README's Layout table, bottom to top: each row's first cell names its modules
    (``core``, ``session``; ``runmodel`` is the package's ``__init__``)."""
    text = readme.read_text()
    section = text[text.index("## Layout") :]
    section = section[: section.find("\n## ", 1) if "\n## " in section[1:] else len(section)]
    layers = []
    for line in section.splitlines():
        cells = line.split("|")
        if len(cells) < 3 or not cells[1].strip().startswith("`"):
            continue
        names = re.findall(r"`([\w.]+)`", cells[1])
        layers.append(tuple(n if n == "runmodel" else f"runmodel.{n}" for n in names))
    return layers


# Modules in one layer are peers: neither imports the other.
LAYERS = read_layers(README)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def group(module: str) -> tuple[int, str]:
    """The layer of ``module`` and the entry of LAYERS it belongs to (the longest match)."""
    found = [
        (len(entry), rank, entry)
        for rank, entries in enumerate(LAYERS)
        for entry in entries
        if module == entry or (module.startswith(entry + ".") and entry != "runmodel")
    ]
    assert found, f"{module} is in no layer: add it to LAYERS"
    _, rank, entry = max(found)
    return rank, entry


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(module: str, typing: bool = False) -> set[str]:
    """The runmodel modules ``module`` imports, outside ``if TYPE_CHECKING:`` (and inside
    it too with ``typing``)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node) and not typing:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "runmodel")
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == "runmodel":
                for alias in node.names:  # `from . import checkpoint` imports a module
                    sub = f"{target}.{alias.name}"
                    found.add(sub if sub in MODULES else target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    found.discard(module)
    return found


GRAPH = {module: imports(module) for module in MODULES}
#: Type hints allowed to go round in a circle: the core's parts name its engine.
TYPING_CIRCLES_ALLOWED = ("runmodel.core",)


def _typing_edges(module: str) -> set[str]:
    inside = [p for p in TYPING_CIRCLES_ALLOWED if module.startswith(p + ".")]
    return {
        t for t in imports(module, typing=True) if not any(t.startswith(p + ".") for p in inside)
    } | GRAPH[module]


TYPING_GRAPH = {module: _typing_edges(module) for module in MODULES}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down(module: str) -> None:
    rank, entry = group(module)
    upward = []
    for target in sorted(GRAPH[module]):
        target_rank, target_entry = group(target)
        if target_entry != entry and target_rank >= rank:
            upward.append(f"{target} (layer {target_rank}: {target_entry})")
    assert not upward, f"{module} (layer {rank}: {entry}) imports upward: {upward}"


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A circle of imports in ``graph``, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def walk(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target in graph and state.get(target) is None and (found := walk(target)):
                return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if state.get(module) is None and (found := walk(module)):
            return found
    return None


@pytest.mark.parametrize("graph", ["imports", "with type hints"])
def test_no_import_cycles(graph: str) -> None:
    cycle = find_cycle(GRAPH if graph == "imports" else TYPING_GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


def package_of(module: str) -> str:
    """The package ``module`` belongs to: its entry in README's layer table (a folder,
    ``runmodel.runs``; a part of one the table gives a row of its own,
    ``runmodel.config.builtins``; a top-level module, ``runmodel.engine``)."""
    return group(module)[1]


def test_no_import_cycles_between_packages() -> None:
    """Packages import one another one way only: runs/ imports the engine, which imports
    session/, and nothing of session/ imports runs/ (imports inside functions count)."""
    graph: dict[str, set[str]] = {}
    for module, targets in GRAPH.items():
        edges = graph.setdefault(package_of(module), set())
        edges.update(package_of(t) for t in targets if package_of(t) != package_of(module))
    assert graph["runmodel.runs"] >= {"runmodel.engine", "runmodel.session"}
    assert "runmodel.session" in graph["runmodel.engine"]
    assert not any(entry.startswith(("runmodel.runs.", "runmodel.session.")) for entry in graph)
    cycle = find_cycle(graph)
    assert cycle is None, "packages import each other in a circle: " + " -> ".join(cycle or ())


def test_a_circle_through_type_hints_is_found(tmp_path: Path) -> None:
    # models/interface -> metrics -> torch_model -> interface was one, until metrics named
    # a Protocol instead of TorchModel: put that typing-only import back and it is found
    (tmp_path / "metrics.py").write_text(
        MODULES["runmodel.models.metrics"].read_text() + "\nif TYPE_CHECKING:\n"
        "    from .torch_model import TorchModel\n"
    )
    saved = MODULES["runmodel.models.metrics"]
    MODULES["runmodel.models.metrics"] = tmp_path / "metrics.py"
    try:
        graph = {m: _typing_edges(m) for m in MODULES}
        assert imports("runmodel.models.metrics") == set()  # not an import at run time
    finally:
        MODULES["runmodel.models.metrics"] = saved
    cycle = find_cycle(graph)
    assert cycle is not None and set(cycle) == {
        "runmodel.models.interface",
        "runmodel.models.metrics",
        "runmodel.models.torch_model",
    }


def test_function_level_imports_count_and_type_checking_ones_do_not(tmp_path: Path) -> None:
    (tmp_path / "example.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ..models import Model\n"
        "def f():\n    from ..modes import Train\n    from .. import checkpoint\n"
    )
    MODULES["runmodel.core.example"] = tmp_path / "example.py"
    try:
        assert imports("runmodel.core.example") == {"runmodel.modes", "runmodel.checkpoint"}
    finally:
        del MODULES["runmodel.core.example"]


def _engine_rank() -> int:
    return group("runmodel.engine")[0]


@pytest.mark.parametrize(
    ("package", "below"),
    [("runmodel.config", True), ("runmodel.session", True), ("runmodel.runs", False)],
)
def test_a_package_folder_sits_on_one_side_of_the_engine(package: str, below: bool) -> None:
    """A folder of modules is below the engine facade or above it, never both: config/
    keeps registries and configs as data (the engine uses them), session/ what every run
    has (its folder's writer, the interrupt path: the engine gives them to every run),
    runs/ runs them. A module in config/ that imports the engine (as config/rundir.py did)
    is the arrow back up; so was runs/folder.py, which the engine imported while the rest
    of runs/ imported the engine."""
    ranks = {group(m)[0] for m in MODULES if m == package or m.startswith(package + ".")}
    sides = {rank < _engine_rank() for rank in ranks}
    assert sides == {below}, (
        f"{package}'s modules are at layers {ranks} (the engine's is at "
        f"{_engine_rank()}): all {'below' if below else 'above'} it"
    )
    if package == "runmodel.config":
        assert sides == {True}, "config/ is data below the engine"
        reached: set[str] = set()
        todo = [m for m in MODULES if m.startswith(package)]
        while todo:  # what config/ imports, and what that imports...
            module = todo.pop()
            for target in GRAPH.get(module, ()):
                if target not in reached:
                    reached.add(target)
                    todo.append(target)
        assert "runmodel.engine" not in reached and not any(
            r.startswith("runmodel.runs") for r in reached
        ), "config/ reaches up to the engine"


# -- no module-global hook points ---------------------------------------------------------------

#: Attributes of imported modules that runmodel may set: Python's documented hook for how an
#: uncaught exception ends the process (an uncaught ``runmodel.Interrupted`` ends it by its
#: signal, as Python does for a plain KeyboardInterrupt: ``session/interrupt.py``).
ASSIGNABLE = {
    ("sys", "excepthook"),
    # a script run as __main__ by the command gets its own arguments, put back after
    ("sys", "argv"),
    # from an interrupt's signal to the end of its run, a write to a closed pipe is
    # dropped (session/interrupt.py: put back as the run's watch ends)
    ("sys", "stdout"),
    ("sys", "stderr"),
}


def _module_names(tree: ast.AST, module: str) -> dict[str, str]:
    """The names ``module``'s imports bind to modules (local name -> module)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = alias.name
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            target = (
                ".".join(
                    base[: len(base) - node.level + 1] + ([node.module] if node.module else [])
                )
                if node.level
                else node.module or ""
            )
            for alias in node.names:
                full = f"{target}.{alias.name}"
                if full in MODULES or (not full.startswith("runmodel") and _is_module(full)):
                    names[alias.asname or alias.name] = full
    return names


def _is_module(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_global_statement_and_no_imported_module_changed(module: str) -> None:
    tree = ast.parse(MODULES[module].read_text(), str(MODULES[module]))
    found = [
        f"line {n.lineno}: global {', '.join(n.names)}"
        for n in ast.walk(tree)
        if isinstance(n, ast.Global)
    ]
    modules = _module_names(tree, module)
    for node in ast.walk(tree):
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, (ast.AugAssign, ast.AnnAssign))
            else []
        )
        for target in targets:
            if (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id in modules
                and (modules[target.value.id], target.attr) not in ASSIGNABLE
            ):
                found.append(
                    f"line {target.lineno}: {target.value.id}.{target.attr} = ... "
                    f"(an attribute of the module {modules[target.value.id]})"
                )
    assert not found, (
        f"{module} keeps state in a module global or changes an imported "
        f"module (hold it in an object, or scope it with a context manager): "
        f"{found}"
    )


def test_the_package_top_holds_at_most_four_modules() -> None:
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert set(top) <= {"engine", "_io", "extras", "plot"}, top


def test_the_layers_are_readmes_and_core_imports_nothing_else() -> None:
    # the core imports nothing else of runmodel: the bottom layer, which all may import
    assert LAYERS[0] == ("runmodel.core",) and LAYERS[-1] == ("runmodel.__main__",)
    assert len({n for layer in LAYERS for n in layer}) == sum(map(len, LAYERS))
    core = [m for m in MODULES if m.startswith("runmodel.core")]
    outside = {
        m: sorted(t for t in imports(m, typing=True) if not t.startswith("runmodel.core"))
        for m in core
    }
    assert not any(outside.values()), {m: t for m, t in outside.items() if t}

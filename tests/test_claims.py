"""Docstrings and docs that say a module is "the one" that does a thing are true, and stay
true: each such claim is listed here with a check of the code, and a claim made anywhere
else (a new "the one writer") fails until it is listed with its own check.

Two of them were false once: ``runs/evaluate.py`` globbed and sorted checkpoint names
itself (``checkpoint/names.py`` is "the one module that knows"), and ``sweeps/trial.py``
wrote a run's ``status.json`` past its writer."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "runmodel"
SOURCES = {str(p.relative_to(ROOT)): p for p in sorted(PACKAGE.rglob("*.py"))}

#: The phrases that claim sole ownership.
CLAIM = re.compile(
    r"the (one|only) (writer|object that writes|module that|adapter|way a run|low-level"
    r"|interrupt|preparer|way a config)",
    re.IGNORECASE,
)


def strings(path: Path) -> Iterator[tuple[int, str]]:
    """The string constants of ``path`` that are not docstrings, with their lines."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
        ):
            yield node.lineno, node.value


def calls(path: Path, name: str) -> Iterator[tuple[int, str]]:
    """The calls of ``name`` (a function, or ``module.function``) in ``path``, each with its
    source text."""
    text = path.read_text()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == name:
            yield node.lineno, ast.get_source_segment(text, node) or ""


def outside(owner: str, found: Callable[[Path], list[str]]) -> list[str]:
    """What ``found`` finds in the package's modules but ``owner``."""
    return [
        f"{name}:{where}"
        for name, path in SOURCES.items()
        if name != owner
        for where in found(path)
    ]


FOLDER_FILES = ("status.json", "run.json", "metrics.json", "config.json", "eval.json")
FOLDER_NAMES = ("STATUS", "RECORD", "METRICS", "CONFIG", "EVAL")


def _writes_folder_files(path: Path) -> list[str]:
    """Names of a run folder's files written out, and writes of a run folder's file."""
    named = [f"{line}: {text!r}" for line, text in strings(path) if text.endswith(FOLDER_FILES)]
    writes = [
        f"{line}: {source}"
        for writer in ("write_json", "atomic_write")
        for line, source in calls(path, writer)
        if any(re.search(rf"\b{name}\b", source) for name in FOLDER_NAMES)
    ]
    return named + writes


def _names_checkpoints(path: Path) -> list[str]:
    """A checkpoint's name, or a pattern of them, written out."""
    return [
        f"{line}: {text!r}"
        for line, text in strings(path)
        if re.search(r"(^|[^.\w])(ckpt|best)-", text)
    ]


def _sets_signal_handlers(path: Path) -> list[str]:
    return [f"{line}: {source}" for line, source in calls(path, "signal.signal")]


def _opens_optuna_storage(path: Path) -> list[str]:
    text = path.read_text()
    return [
        f"{n}: {line.strip()}"
        for n, line in enumerate(text.splitlines(), 1)
        if re.search(r"optuna\.storages|JournalStorage|RDBStorage|load_study|create_study", line)
    ]


def _low_level_file_calls(path: Path) -> list[str]:
    return [
        f"{line}: {source}"
        for name in ("os.fsync", "fcntl.flock", "fcntl.lockf")
        for line, source in calls(path, name)
    ]


def _prepares_folder_runs(path: Path) -> list[str]:
    return [
        f"{line}: {source}"
        for name in ("claim_folder", "FolderRun", "_claim")
        for line, source in calls(path, name)
    ]


#: (module, where the claim is made, what it says, the check: nothing found outside it)
CLAIMS: list[tuple[str, str, str, Callable[[Path], list[str]]]] = [
    (
        "runmodel/session/folder.py",
        "runmodel/session/folder.py",
        "the one object that writes it",
        _writes_folder_files,
    ),
    (
        "runmodel/checkpoint/names.py",
        "runmodel/checkpoint/names.py",
        "the one module that knows it",
        _names_checkpoints,
    ),
    (
        "runmodel/session/interrupt.py",
        "runmodel/session/interrupt.py",
        "The one way a run is interrupted",
        _sets_signal_handlers,
    ),
    (
        "runmodel/sweeps/study.py",
        "runmodel/sweeps/study.py",
        "The one adapter over",
        _opens_optuna_storage,
    ),
    ("runmodel/_io.py", "README.md", "the one low-level file module", _low_level_file_calls),
    (
        "runmodel/runs/folder_run.py",
        "runmodel/runs/folder_run.py",
        "the one way a config's run",
        _prepares_folder_runs,
    ),
]

#: Where the claims above are repeated, in words (README's layout, the packages' docs).
REPEATED = {
    "README.md": [
        "the one low-level",
        "the only module that",
        "the one interrupt",
        "the one adapter",
        "the one preparer",
        "one writer",
    ],
    "runmodel/session/__init__.py": ["the one writer of", "the\none way a run is interrupted"],
    "runmodel/session/folder.py": ["the one writer of its files"],
    "runmodel/runs/__init__.py": ["the one preparer"],
    "runmodel/runs/target.py": ["prepared by the one preparer (``folder_run.py``"],
    "runmodel/engine.py": ["the one interrupt path"],
}


@pytest.mark.parametrize(("owner", "said_in", "claim", "check"), CLAIMS, ids=[c[0] for c in CLAIMS])
def test_a_claim_of_being_the_one_holds(
    owner: str, said_in: str, claim: str, check: Callable[[Path], list[str]]
) -> None:
    said = " ".join((ROOT / said_in).read_text().split())
    assert claim in said, f"{said_in} no longer says {claim!r}: update CLAIMS"
    assert check(ROOT / owner) or owner == "runmodel/sweeps/study.py", (
        f"the check of {owner} finds nothing even there: it checks nothing"
    )
    found = outside(owner, check)
    assert not found, f"{owner} says {claim!r}, but so does the code elsewhere: {found}"


def test_every_claim_of_being_the_one_is_checked() -> None:
    listed = {said_in for _, said_in, _, _ in CLAIMS} | set(REPEATED)
    made = {
        name
        for name, path in {**SOURCES, "README.md": ROOT / "README.md"}.items()
        if CLAIM.search(path.read_text())
    }
    assert made <= listed, f"claims no test checks: {sorted(made - listed)} (list them in CLAIMS)"
    for name, phrases in REPEATED.items():
        text = " ".join((ROOT / name).read_text().split())
        for phrase in phrases:
            assert " ".join(phrase.split()) in text, f"{name} no longer says {phrase!r}"


def test_the_checks_find_what_they_look_for(tmp_path: Path) -> None:
    """Each check finds the thing it forbids elsewhere, as a module would write it."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import os, signal\n"
        "from pathlib import Path\n"
        "STATUS = 'x'\n"
        "def f(run_dir, fd):\n"
        "    '''A docstring naming status.json and ckpt-00001 counts for nothing.'''\n"
        "    write_json(run_dir / STATUS, {})\n"
        "    sorted(Path(run_dir).glob('best-*.pt'))\n"
        "    signal.signal(signal.SIGINT, None)\n"
        "    os.fsync(fd)\n"
        "    claim_folder(run_dir, resume=False, restart=False, take_over=False)\n"
        "    return run_dir / 'metrics.json'\n"
    )
    assert len(_writes_folder_files(bad)) == 2
    assert len(_names_checkpoints(bad)) == 1
    assert len(_sets_signal_handlers(bad)) == 1
    assert len(_low_level_file_calls(bad)) == 1
    assert len(_prepares_folder_runs(bad)) == 1

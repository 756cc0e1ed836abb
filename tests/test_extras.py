"""Optional dependencies: ``runmodel.extras.require`` and ``hint`` name the extra to
install, the table agrees with pyproject.toml, and a missing scikit-learn or matplotlib
(made unimportable in a real process by a ``sitecustomize`` on its PYTHONPATH) gives a
one-line error saying what to install, from the digits example and from ``runmodel plot``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import runmodel.cli
from runmodel.extras import OPTIONAL, hint, install_command, require

ROOT = Path(__file__).resolve().parent.parent
DIGITS = ROOT / "examples" / "digits.py"
SITECUSTOMIZE = """\
import os
import sys

for name in os.environ["BLOCK_MODULES"].split(","):
    sys.modules[name] = None  # as if not installed: importing it raises ModuleNotFoundError
"""
NO_SKLEARN = (
    "examples/digits.py needs scikit-learn (import sklearn): pip install 'runmodel[examples]'"
)


def without(tmp_path: Path, *modules: str) -> dict[str, str]:
    """The environment of a process in which ``modules`` cannot be imported."""
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    return {
        **os.environ,
        "PYTHONPATH": path,
        "BLOCK_MODULES": ",".join(modules),
        "PYTHONIOENCODING": "utf-8",
        "OMP_NUM_THREADS": "1",
    }


@pytest.fixture
def no_sklearn(monkeypatch: pytest.MonkeyPatch) -> None:
    """scikit-learn unimportable in this process (imported submodules too)."""
    for name in [n for n in sys.modules if n == "sklearn" or n.startswith("sklearn.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)


# -- require, hint, the table ------------------------------------------------------------


def test_require_returns_the_module() -> None:
    assert require("json") is json
    assert require("os.path") is os.path


def test_require_names_the_extra(no_sklearn: None) -> None:
    with pytest.raises(ModuleNotFoundError) as raised:
        require("sklearn.datasets", needed_by="examples/digits.py")
    assert str(raised.value) == NO_SKLEARN
    assert raised.value.name == "sklearn.datasets"
    assert isinstance(raised.value.__cause__, ModuleNotFoundError)
    with pytest.raises(ModuleNotFoundError, match=r"^this needs scikit-learn \(import sklearn\)"):
        require("sklearn")


def test_require_without_an_extra_says_the_pip_name() -> None:
    with pytest.raises(
        ModuleNotFoundError,
        match=re.escape(
            "x needs nosuch_mod_7f3 (import nosuch_mod_7f3): pip install nosuch_mod_7f3"
        ),
    ):
        require("nosuch_mod_7f3.sub", needed_by="x")
    with pytest.raises(ModuleNotFoundError, match=re.escape("pip install 'runmodel[plot]'")):
        require("nosuch_mod_7f3", "plot")
    assert install_command("torchdata.stateful_dataloader") == "pip install torchdata"
    assert install_command("matplotlib.pyplot") == "pip install 'runmodel[plot]'"


def test_a_broken_install_is_not_called_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An installed package failing on its own import is raised as it is."""
    (tmp_path / "broken_pkg_7f3").mkdir()
    (tmp_path / "broken_pkg_7f3" / "__init__.py").write_text("import nosuch_inner_7f3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as raised:
        require("broken_pkg_7f3", "plot")
    assert (str(raised.value), raised.value.name) == (
        "No module named 'nosuch_inner_7f3'",
        "nosuch_inner_7f3",
    )


def test_hint_finds_a_missing_optional_module_in_the_chain(no_sklearn: None) -> None:
    with pytest.raises(RuntimeError) as loading:
        try:
            import sklearn.datasets  # noqa: F401
        except ImportError as error:
            raise RuntimeError("loading the model failed") from error
    assert hint(loading.value) == (
        "scikit-learn is an optional dependency: pip install 'runmodel[examples]'"
    )
    with pytest.raises(ModuleNotFoundError) as required:
        require("sklearn")
    assert hint(required.value) is None  # it says so already
    assert hint(ModuleNotFoundError("No module named 'numpyy'", name="numpyy")) is None
    assert hint(ValueError("bad")) is None


def test_the_table_agrees_with_pyproject() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for module, dependency in OPTIONAL.items():
        extra = dependency.extra or "dev"  # no extra of its own: the dev extra has it
        names = [re.split(r"[<>=~!; ]", requirement)[0] for requirement in extras[extra]]
        assert dependency.pip in names, (module, extra, names)
    # and every extra but dev (which takes the others) is in the table
    assert {d.extra for d in OPTIONAL.values()} - {None} == set(extras) - {"dev"}


# -- in real runs ------------------------------------------------------------------------


def test_the_digits_example_without_scikit_learn(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "runmodel", "run", str(DIGITS), "--epochs", "1", "--no-progress"],
        cwd=tmp_path,
        env=without(tmp_path, "sklearn"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    said, *lines = done.stderr.splitlines()  # first, where its run folder is
    assert said.startswith("run directory: runs/digits_"), said
    assert lines[0] == f"runmodel run: error: ModuleNotFoundError: {NO_SKLEARN}"
    assert "raised in model.setup" in lines[1]
    assert "Traceback" not in done.stderr


def test_a_digits_config_run_without_scikit_learn_records_why(
    tmp_path: Path, no_sklearn: None, capsys: pytest.CaptureFixture[str]
) -> None:
    code = runmodel.cli.main(
        [
            "run",
            str(ROOT / "examples" / "configs" / "digits.toml"),
            "--epochs",
            "1",
            "--no-progress",
            "--runs-dir",
            str(tmp_path / "runs"),
        ]
    )
    assert code == 1
    err = capsys.readouterr().err
    assert f"runmodel run: error: ModuleNotFoundError: {NO_SKLEARN}\n" in err
    [status] = (tmp_path / "runs").glob("*/status.json")
    assert json.loads(status.read_text())["error"] == f"ModuleNotFoundError: {NO_SKLEARN}"


def test_plot_without_matplotlib(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "runmodel.plot", str(tmp_path)],
        cwd=tmp_path,
        env=without(tmp_path, "matplotlib"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "runmodel plot: error: runmodel plot needs matplotlib "
        "(import matplotlib): pip install 'runmodel[plot]'\n"
    )


def test_the_command_names_the_extra_for_any_missing_optional_module(
    tmp_path: Path, no_sklearn: None, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "bare.py"
    model.write_text(
        "import torch\nimport runmodel\n\n\n"
        "class Bare(runmodel.TorchModel):\n"
        "    def __init__(self, device=None, init_options=None):\n"
        "        super().__init__(device, init_options)\n"
        "        self.module = torch.nn.Linear(2, 2)\n\n"
        "    def setup(self, setup_options=None):\n"
        "        from sklearn.datasets import load_digits  # noqa: F401\n"
    )
    assert (
        runmodel.cli.main(
            ["run", str(model), "--no-progress", "--runs-dir", str(tmp_path / "runs")]
        )
        == 1
    )
    said, *lines = capsys.readouterr().err.splitlines()  # first, where its run folder is
    assert said.startswith(f"run directory: {tmp_path / 'runs' / 'bare_'}"), said
    assert lines[0].startswith("runmodel run: error: ModuleNotFoundError: ")
    assert "  scikit-learn is an optional dependency: pip install 'runmodel[examples]'" in lines
    # a source that cannot even be loaded (scikit-learn imported at its top): exit 2
    model.write_text("from sklearn.datasets import load_digits  # noqa: F401\n")
    assert runmodel.cli.main(["run", str(model), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.endswith(
        "\n  scikit-learn is an optional dependency: pip install 'runmodel[examples]'\n"
    )

"""A run folder is self-contained: one moved aside by ``--restart`` (``NAME.old-TIME``),
one moved with ``mv`` and one copied with ``cp -r`` evaluate, resume and export their own
checkpoints, of a config's run, a model source's and a script's, and leave the folder they
came from untouched; a copy whose Checkpoint pack saves outside it is refused at resume
(exit 2, naming that folder). The commands run in this process (``runmodel.cli.main``):
no process starts, the runs are small.
"""

from __future__ import annotations

import json
import os
import runpy
import shutil
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from runmodel.checkpoint.export import model_state
from runmodel.checkpoint.format import run_of
from runmodel.cli import main

EPOCHS = 2  # of 4 steps

MODEL = textwrap.dedent('''
    """A small classifier with train and eval data, registered as "moved"."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import runmodel


    class Moved(runmodel.TorchModel):
        def __init__(self, device=None, init_options=None):
            super().__init__(device, init_options)
            self.module = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))

        def setup(self, setup_options=None):
            g = torch.Generator().manual_seed(0)
            x = torch.randn(32, 4, generator=g)
            y = (x[:, 0] > 0).long()
            self.train_data = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True,
                                         generator=torch.Generator().manual_seed(1))
            self.eval_data = DataLoader(TensorDataset(x, y), batch_size=16)
            self.optimizer = torch.optim.SGD(self.module.parameters(), lr=0.1)
            self.loss_fn = nn.CrossEntropyLoss()


    runmodel.register_model("moved", Moved)
''')

CONFIG = textwrap.dedent(f"""
    imports = ["moved.py"]
    epochs = {EPOCHS}

    [model]
    type = "moved"
""")

#: A script run in ``argv[1]``, its checkpoints inside it (``checkpoint/``), or, with
#: ``argv[2] == "outside"``, in a folder beside it.
SCRIPT = textwrap.dedent(f"""
    import sys

    import torch

    import runmodel
    from runmodel.packs import Checkpoint

    from moved import Moved

    torch.manual_seed(0)
    run_dir = sys.argv[1]
    folder = run_dir + "-checkpoints" if sys.argv[2:] == ["outside"] else "checkpoint"
    runmodel.Engine(Checkpoint(folder), progress=False).run(
        Moved(), epochs={EPOCHS}, run_dir=run_dir, resume="auto")
""")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("moved")
    (folder / "moved.py").write_text(MODEL)
    (folder / "run.toml").write_text(CONFIG)
    (folder / "train.py").write_text(SCRIPT)
    sys.path.insert(0, str(folder))  # the script imports moved.py
    try:
        yield folder
    finally:
        sys.path.remove(str(folder))


def _command(*args: str | Path) -> int:
    return main([str(arg) for arg in args])


def _script(project: Path, *args: str | Path) -> None:
    """``python train.py ARGS`` from ``project``, in this process."""
    saved, cwd = sys.argv[:], os.getcwd()
    sys.argv = [str(project / "train.py"), *map(str, args)]
    os.chdir(project)
    try:
        runpy.run_path(str(project / "train.py"), run_name="__main__")
    finally:
        sys.argv = saved
        os.chdir(cwd)


def _files(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder``: its size and modification time."""
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _read(folder: Path, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / name).read_text())
    return data


def _inside(path: str, folder: Path) -> bool:
    return Path(path).resolve().is_relative_to(folder.resolve())


def _uses_its_own_checkpoints(
    folder: Path, epochs: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``eval``, ``export`` and ``resume --epochs`` of ``folder`` read (and write) the
    checkpoints inside it, and only those."""
    run = _read(folder, "run.json")["id"]
    capsys.readouterr()
    assert _command("eval", folder) == 0
    said = [
        line for line in capsys.readouterr().err.splitlines() if line.startswith("runmodel eval: ")
    ]
    weights = said[0].split(" with ", 1)[1]
    assert _inside(weights, folder) and run_of(weights)["id"] == run, said  # type: ignore[index]
    keys = list(_read(folder, "eval.json"))  # keyed by the weights, relative to the folder
    assert str(Path(weights).resolve().relative_to(folder.resolve())) in keys
    assert not any(Path(key).is_absolute() for key in keys), keys

    out = tmp_path / f"{folder.name}.pt"
    assert _command("export", folder, out) == 0
    used = capsys.readouterr().err.splitlines()[-1].removeprefix("exported ").split(" to ")[0]
    assert _inside(used, folder), used
    saved = model_state(used)["module"]
    exported = torch.load(out, weights_only=True)
    assert all(torch.equal(exported[k], saved[k]) for k in saved)

    assert _command("resume", folder, "--epochs", epochs, "--no-progress") == 0
    status = _read(folder, "status.json")
    assert (status["status"], status["epochs"], status["run"]) == ("finished", epochs, run)
    assert not Path(status["resumed_from"]).is_absolute(), status["resumed_from"]
    assert (folder / status["files"]["last_checkpoint"]).is_file()
    assert _read(folder, "metrics.json")["epochs"] == epochs


@pytest.mark.parametrize("kind", ["config", "source"])
def test_a_run_moved_aside_moved_or_copied_uses_its_own_checkpoints(
    kind: str, project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    given = ["run.toml"] if kind == "config" else ["moved.py", "--epochs", str(EPOCHS)]
    start = ["run", *(project / given[0], *given[1:]), "--runs-dir", runs, "--no-progress"]
    assert _command(*start) == 0
    [first] = runs.iterdir()
    first_run = _read(first, "run.json")["id"]
    assert _command(*start, "--restart") == 0  # the first run moved aside, a new one here
    [aside] = runs.glob(f"{first.name}.old-*")
    assert _read(aside, "run.json")["id"] == first_run != _read(first, "run.json")["id"]
    # as a folder written before paths were relative names them: where it was started
    # (which holds the new run's checkpoints now); those of another run are never used
    status = _read(aside, "status.json")
    status["files"] = {k: str(first / v) for k, v in status["files"].items()}
    (aside / "status.json").write_text(json.dumps(status))
    original = _files(first)

    _uses_its_own_checkpoints(aside, EPOCHS + 1, tmp_path, capsys)
    copied = runs / "copied"
    shutil.copytree(first, copied)  # cp -r
    _uses_its_own_checkpoints(copied, EPOCHS + 1, tmp_path, capsys)
    moved = runs / "moved"
    aside.rename(moved)  # mv
    _uses_its_own_checkpoints(moved, EPOCHS + 2, tmp_path, capsys)
    assert _files(first) == original  # the run they came from: untouched
    # the table of runs reads a model source's run as it reads a config's
    capsys.readouterr()
    assert _command("runs", runs, "--columns", "run,status,epochs,steps") == 0
    table = capsys.readouterr().out.splitlines()[2:]
    assert sorted(row.split() for row in table) == sorted(
        [
            ["copied", "finished", "3", "12"],
            [first.name, "finished", "2", "8"],
            ["moved", "finished", "4", "16"],
        ]
    )


def test_a_script_run_moved_or_copied_uses_its_own_checkpoints(
    project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = tmp_path / "runs" / "first"
    _script(project, first)
    original = _files(first)
    copied = tmp_path / "runs" / "copied"
    shutil.copytree(first, copied)
    _uses_its_own_checkpoints(copied, EPOCHS + 1, tmp_path, capsys)
    moved = tmp_path / "elsewhere" / "moved"
    moved.parent.mkdir()
    copied.rename(moved)
    _uses_its_own_checkpoints(moved, EPOCHS + 2, tmp_path, capsys)
    assert _files(first) == original


def test_a_copy_whose_checkpoints_are_outside_it_is_refused_at_resume(
    project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = tmp_path / "runs" / "first"
    _script(project, first, "outside")
    checkpoints = tmp_path / "runs" / "first-checkpoints"
    before = _files(first), _files(checkpoints)
    copied = tmp_path / "runs" / "copied"
    shutil.copytree(first, copied)
    capsys.readouterr()
    assert _command("resume", copied, "--epochs", EPOCHS + 1, "--no-progress") == 2
    [line] = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert line.startswith(
        f"runmodel resume: error: {copied} is a copy of the run folder "
        f"{first} (or was moved from there), and its Checkpoint pack saves "
        f"in {checkpoints}, outside it"
    ), line
    assert (_files(first), _files(checkpoints)) == before
    assert _read(copied, "status.json")["status"] == "finished"
    # the run itself, in the folder it was started in, goes on
    assert _command("resume", first, "--epochs", EPOCHS + 1, "--no-progress") == 0
    assert _read(first, "status.json")["epochs"] == EPOCHS + 1

"""A run folder under faults, in real subprocesses: a full disk (a real, small tmpfs) never
costs the status, and a refused resume leaves the folder as it was."""

from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import warm as subprocess

TIMEOUT = 300
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8"}
RUNMODEL = (sys.executable, "-m", "runmodel")

MODEL = textwrap.dedent('''
    """A classifier of about 1 MB of weights (so that a checkpoint is a few MB)."""
    import os

    import torch
    from torch import nn

    import runmodel


    class Wide(runmodel.TorchModel):
        def __init__(self, device=None, init_options=None):
            super().__init__(device, init_options)
            self.module = nn.Sequential(nn.Linear(8, 256), nn.ReLU(), nn.Linear(256, 512),
                                        nn.ReLU(), nn.Linear(512, 2))

        def setup(self, setup_options=None):
            g = torch.Generator().manual_seed(0)
            x = torch.randn(64, 8, generator=g)
            y = (x[:, 0] > 0).long()
            self.train_data = [(x[i:i + 16], y[i:i + 16]) for i in range(0, 64, 16)]
            self.optimizer = torch.optim.Adam(self.module.parameters(), lr=1e-3)
            self.loss_fn = nn.CrossEntropyLoss()


    runmodel.register_model("wide", Wide)


    def configure(engine):
        """With FILL: at the end of epoch FILL_AT, fill the disk that FILL is on, to the
        last byte, after the run log and TensorBoard wrote and before the checkpoint."""
        fill = os.environ.get("FILL")
        if fill:
            @engine.on("epoch_end", priority=-500,
                       when=lambda e: e.state.epoch == int(os.environ["FILL_AT"]))
            def fill_the_disk(engine):
                with open(fill, "wb", buffering=0) as file:
                    try:
                        while True:
                            file.write(b"\\0" * 4096)
                    except OSError:
                        pass
''')

CONFIG = textwrap.dedent("""
    imports = ["wide.py"]
    epochs = 3
    seed = 0

    [model]
    type = "wide"
""")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("faults")
    (folder / "wide.py").write_text(MODEL)
    (folder / "run.toml").write_text(CONFIG)
    return folder


def _runmodel(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RUNMODEL, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={**ENV, **(env or {})},
    )


def _only_run(root: Path) -> Path:
    [folder] = [p for p in root.iterdir() if (p / "config.json").is_file()]
    return folder


@pytest.fixture(scope="module")
def straight(project: Path) -> Path:
    done = _runmodel("run", "run.toml", "--runs-dir", "straight", "--no-progress", cwd=project)
    assert done.returncode == 0, done.stderr
    return _only_run(project / "straight")


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = torch.load(folder / "model.pt", weights_only=True)
    return state


@pytest.fixture
def small_disk(tmp_path: Path) -> object:
    """An 8 MB tmpfs, mounted here for the test (as root), unmounted after."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        pytest.skip(
            f"a small tmpfs cannot be mounted here ({made.stderr.strip()}): the "
            f"full-disk test needs root and mount(2)"
        )
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_full_disk_fails_the_run_with_a_valid_status_and_the_resume_is_exact(
    project: Path, straight: Path, small_disk: Path
) -> None:
    runs, filler = small_disk / "runs", small_disk / "filler"
    failed = _runmodel(
        "run",
        str(project / "run.toml"),
        "--runs-dir",
        str(runs),
        "--no-progress",
        cwd=project,
        env={"FILL": str(filler), "FILL_AT": "1"},
    )
    assert failed.returncode == 1, failed.stderr
    assert "DiskFullError" in failed.stderr and "No space left on device" in failed.stderr
    folder = _only_run(runs)
    status = json.loads((folder / "status.json").read_text())  # whole, valid JSON
    assert status["status"] == "failed" and status["error"].startswith("DiskFullError")
    assert len(status["traceback"]) <= 2003
    assert not (folder / ".runmodel-reserve").exists()  # freed for that write
    listed = _runmodel("runs", str(runs), cwd=project)
    assert listed.returncode == 0 and f"{folder.name}  failed" in listed.stdout, listed.stdout

    filler.unlink()  # space is back
    resumed = _runmodel("resume", str(folder), "--no-progress", cwd=project)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((folder / "status.json").read_text())["status"] == "finished"
    got, want = _weights(folder), _weights(straight)
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)


def test_a_damaged_status_reads_damaged_and_the_run_still_resumes(
    project: Path, straight: Path, tmp_path: Path
) -> None:
    folder = tmp_path / straight.name
    shutil.copytree(straight, folder)
    (folder / "status.json").write_text('{"status": "runn')  # cut short
    listed = _runmodel("runs", str(tmp_path), cwd=project)
    assert listed.returncode == 0 and "damaged" in listed.stdout, listed.stdout
    resumed = _runmodel("resume", str(folder), "--epochs", "4", "--no-progress", cwd=project)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((folder / "status.json").read_text())["status"] == "finished"


def test_resuming_a_run_whose_checkpoints_are_all_unreadable_is_refused_leaving_it_as_it_was(
    project: Path, straight: Path, tmp_path: Path
) -> None:
    folder = tmp_path / straight.name
    shutil.copytree(straight, folder)
    for checkpoint in (folder / "checkpoint").glob("ckpt-*.pt"):
        checkpoint.write_bytes(os.urandom(1000))
    before = (folder / "status.json").read_bytes()
    refused = _runmodel("resume", str(folder), "--epochs", "4", "--no-progress", cwd=project)
    assert refused.returncode == 2, refused.stderr
    errors = [line for line in refused.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "no readable checkpoint" in errors[0], refused.stderr
    assert "Traceback" not in refused.stderr
    assert (folder / "status.json").read_bytes() == before  # still finished, to the byte

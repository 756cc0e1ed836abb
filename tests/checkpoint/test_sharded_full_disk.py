"""Sharded checkpoints (``fsdp``, torchrun, 2 processes on gloo) on a disk that fills up: a
real tmpfs of 3 MB, filled by rank 0 just before the epoch-2 save. Synchronous or in the
background, every process stops with the one ``DiskFullError`` a plain save gives, naming
the checkpoint (not DCP's ``CheckpointException`` or a raw ``RuntimeError``, and not one
process failing while the other hangs in a collective); the failed save leaves nothing,
the checkpoint before it is whole, and once space is back the run resumes from it. At
the resumed run's end ``engine.storage.full_model_state`` gathers the whole model onto
rank 0 (every process takes part), as a run folder's ``model.pt`` of an fsdp run needs.

Mounting a tmpfs needs root (and the right to mount): elsewhere the module is skipped,
saying so.
"""

from __future__ import annotations

import json
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from runmodel.checkpoint.export import export

import warm as subprocess
from helpers import with_child_net
from launching import finish, launch, torchrun_args

LIMIT_S = 240
EPOCHS = 3  # 8 steps an epoch in each of the 2 processes

CHILD = with_child_net(
    textwrap.dedent('''
    """python child.py RUNS.json: the classifier under fsdp, for each training of the list
    in turn ({"disk": DISK, "out": OUT, "epochs": E, "resume": None, "fill_at": -1,
    "async_save": False, "leave_run_states": False}), a Checkpoint each epoch in DISK/ckpt;
    fill_at=e: rank 0 fills DISK before the save at the end of epoch index e
    (leave_run_states: leaving room for the processes' run states, not for their shards).
    Errors, the gathered model and the training's exit code ("code": 3 when it raised) go to
    OUT."""
    import json
    import os
    import sys

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import runmodel
    from runmodel.packs import Checkpoint

    N, EVAL_N, FEATURES, CLASSES = 64, 17, 8, 3


    CHILD_NET


    rank = os.environ["RANK"]


    def train(disk, out, epochs, resume=None, fill_at=-1, async_save=False,
              leave_run_states=False):
        engine = runmodel.Engine(progress=False)
        checkpoint = Checkpoint(f"{disk}/ckpt", every="1ep", keep=2, async_save=async_save)
        engine.attach(checkpoint)

        @engine.on("epoch_end", rank=0, priority=5000)  # before the save (the others wait)
        def fill_the_disk(engine):
            if engine.state.epoch != fill_at:
                return
            checkpoint.wait()  # the save before is written (an async one: in the background)
            leave = 0
            if leave_run_states:  # as large as the last save's, in pages
                last = sorted(p for p in os.scandir(f"{disk}/ckpt") if p.name.startswith("ckpt-"))
                leave = sum(-(-entry.stat().st_size // 4096) * 4096 for entry in
                            os.scandir(last[-1].path) if entry.name.startswith("run-"))
            free = os.statvfs(disk)
            ballast = os.open(f"{disk}/ballast", os.O_CREAT | os.O_WRONLY)
            try:
                os.posix_fallocate(ballast, 0, free.f_bavail * free.f_frsize - leave)
            finally:
                os.close(ballast)

        @engine.on("teardown")
        def gather(engine):
            if engine.state.error is None:  # every process: a collective
                state = engine.storage.full_model_state(engine.model)
                if rank == "0":
                    torch.save(state, f"{out}/gathered.pt")
                else:
                    with open(f"{out}/gathered-{rank}", "w") as file:
                        file.write(repr(state))

        try:
            engine.run(Net(), epochs=epochs, backend="fsdp", resume=resume)
        except Exception as error:
            with open(f"{out}/error-{rank}", "w") as file:
                file.write(f"{type(error).__name__}: {error}\\n"
                           f"{error.__cause__!r} {error.__suppress_context__}")
            return 3
        return 0


    with open(sys.argv[1]) as file:
        for run in json.load(file):
            code = train(**run)
            if rank == "0":
                with open(f"{run['out']}/code", "w") as file:
                    file.write(str(code))
''')
)


def torchrun(root: Path, *runs: dict[str, object]) -> subprocess.Popen[str]:
    """child.py under torchrun, 2 processes, training ``runs`` in turn (each one's out
    folder made)."""
    for run in runs:
        Path(str(run["out"])).mkdir(parents=True, exist_ok=True)
    listed = root / f"runs-{len(list(root.glob('runs-*.json')))}.json"
    listed.write_text(json.dumps([{"epochs": EPOCHS, **run} for run in runs]))
    return launch(torchrun_args(root / "child.py", listed), root)


def code_of(out: Path, launched: int) -> int:
    """A training's exit code, or its launch's where it wrote none."""
    return int((out / "code").read_text()) if (out / "code").exists() else launched or -1


def mount_tmpfs(folder: Path) -> None:
    folder.mkdir()
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(folder)],
            check=True,
            capture_output=True,
            text=True,
        )
    except (OSError, subprocess.CalledProcessError) as error:
        why = getattr(error, "stderr", None) or error
        pytest.skip(
            f"a full disk is a 3 MB tmpfs, and one cannot be mounted here (it needs "
            f"root and the right to mount): {str(why).strip()}"
        )


class Runs:
    """The two full-disk trainings (each on its own tmpfs) in one launch, then the
    synchronous one resumed once its disk has space again."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "child.py").write_text(CHILD)
        self.disks = {kind: root / f"disk-{kind}" for kind in ("sync", "async")}
        self.results: dict[str, tuple[int, str]] = {}
        self.left: dict[str, list[str]] = {}  # the checkpoint folder after a full-disk run
        self.mounted: list[Path] = []
        for disk in self.disks.values():
            mount_tmpfs(disk)
            self.mounted.append(disk)
        self._thread = threading.Thread(target=self._run_all, daemon=True)
        self._thread.start()

    def out(self, name: str) -> Path:
        return self.root / f"out-{name}"

    def _run_all(self) -> None:
        """One launch fills each disk in turn (the processes go on to the next training
        after a failed one, as they would in a new launch), then one resumes the
        synchronous run once its disk has space again."""
        code, _, err = finish(
            torchrun(
                self.root,
                *(
                    {
                        "disk": str(disk),
                        "out": str(self.out(kind)),
                        "fill_at": 1,
                        "async_save": kind == "async",
                        "leave_run_states": kind == "async",
                    }
                    for kind, disk in self.disks.items()
                ),
            )
        )
        for kind in self.disks:
            self.results[kind] = (code_of(self.out(kind), code), err)
            self.left[kind] = sorted(p.name for p in (self.disks[kind] / "ckpt").iterdir())
        (self.disks["sync"] / "ballast").unlink()  # space is back
        disk = self.disks["sync"]
        resumed = {"disk": str(disk), "out": str(self.out("resumed")), "resume": str(disk / "ckpt")}
        self.results["resumed"] = finish(torchrun(self.root, resumed))[::2]  # code, stderr

    def result(self, name: str) -> tuple[int, str]:
        self._thread.join(timeout=3 * LIMIT_S)
        assert name in self.results, f"the {name} launch did not end"
        return self.results[name]

    def close(self) -> None:
        self._thread.join(timeout=3 * LIMIT_S)
        for disk in self.mounted:
            subprocess.run(["umount", str(disk)], check=False, capture_output=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    made = None
    try:
        made = Runs(tmp_path_factory.mktemp("full_disk"))
        yield made
    finally:
        if made is not None:
            made.close()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_full_disk_stops_every_process_with_one_disk_full_error(runs: Runs, kind: str) -> None:
    # sync: no room left, each process's run state fails (once one failing alone left the
    # other hanging in DCP's collective); async: room for the run states, not the shards
    # (DCP's CheckpointException, around each process's OSError)
    code, err = runs.result(kind)
    assert code != 0, err[-3000:]
    folder = runs.disks[kind] / "ckpt" / "ckpt-00002-0000000016"
    for rank in (0, 1):
        error = (runs.out(kind) / f"error-{rank}").read_text()
        assert error == (
            f"DiskFullError: writing {str(folder)!r} failed: No space left on "
            f"device ([Errno 28]); free some space (or raise the file-size limit) "
            f"and resume the run: the files written before are intact\nNone True"
        )
    # the failed save left nothing (its staging folder went); the one before is whole
    assert runs.left[kind] == ["ckpt-00001-0000000008"]


def test_once_space_is_back_the_run_resumes_and_gathers_its_model_on_rank_0(
    runs: Runs, tmp_path: Path
) -> None:
    code, err = runs.result("resumed")
    assert code == 0, err[-3000:]
    ckpt = runs.disks["sync"] / "ckpt"
    assert sorted(p.name for p in ckpt.iterdir()) == [
        "ckpt-00002-0000000016",
        "ckpt-00003-0000000024",
    ]
    used, out = export(ckpt, tmp_path / "last.pt")  # the weights the run ended with
    assert used.name == "ckpt-00003-0000000024"
    final = torch.load(out, weights_only=True)
    gathered = torch.load(runs.out("resumed") / "gathered.pt", weights_only=True)
    assert list(gathered) == list(final) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    for name, value in final.items():
        assert torch.equal(gathered[name], value), name
    assert (runs.out("resumed") / "gathered-1").read_text() == "None"  # rank 1 takes part

"""Faults of sharded saves (torchrun, gloo, CPU), in one 2-process ``fsdp`` launch:

- a staging folder whose writers were killed (SIGKILL) is removed, one whose writer is
  alive (it holds the staging folder's shared lock) is kept: liveness is the lock, not a
  pid;
- parameters that hold NaN on one process's shards only stop every process with the same
  error before the save, and the checkpoints before it are kept.
"""

from __future__ import annotations

import os
import signal
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_fsdp import MODEL, finish, launch

import warm as subprocess

# a writer of a sharded save's staging folder: holds its shared lock, writes a shard,
# says so and waits (to be killed, or to outlive the run)
WRITER = """
import sys, time
from pathlib import Path
from runmodel._io import shared_lock
with shared_lock(sys.argv[1]):
    (Path(sys.argv[1]) / "__0_0.distcp").write_bytes(b"x" * 10_000)
    print("writing", flush=True)
    time.sleep(600)
"""

CHILD = textwrap.dedent('''
    """net.py's Net, checkpointed each epoch; at the end of epoch 2, before its save,
    process rank 1 puts NaN into its own shard of the first weight."""
    import torch

    import runmodel
    from net import Net
    from runmodel.packs import Checkpoint

    engine = runmodel.Engine()
    engine.attach(Checkpoint("ckpt", every="1ep", keep=None))


    @engine.on("epoch_end", rank=1, priority=5000)  # before the checkpoint's hook
    def diverge(engine):
        if engine.state.epoch == 1:
            with torch.no_grad():
                next(engine.model.module.parameters()).to_local().fill_(float("nan"))


    engine.run(Net(), epochs=3, backend="fsdp")
''')

DEAD, LIVE = ".ckpt-00009-0000000099.tmp-dead0000", ".ckpt-00009-0000000098.tmp-live0000"


def writer(folder: Path) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(folder)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert process.stdout is not None and process.stdout.readline() == "writing\n"
    return process


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, str, Path]]:
    root = tmp_path_factory.mktemp("fsdp_faults")
    (root / "net.py").write_text(MODEL)
    (root / "child.py").write_text(CHILD)
    ckpt = root / "ckpt"
    dead = writer(ckpt / DEAD)
    dead.send_signal(signal.SIGKILL)  # killed mid-write: its lock goes with it
    assert dead.wait(timeout=30) == -signal.SIGKILL
    live = writer(ckpt / LIVE)
    try:
        path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
        process = launch(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node",
                "2",
                str(root / "child.py"),
            ],
            root,
            PYTHONPATH=path,
        )
        code, _, err = finish(process)
        yield code, err, ckpt
    finally:
        live.kill()
        live.wait()


def test_a_dead_writers_staging_folder_goes_and_a_live_ones_stays(
    run: tuple[int, str, Path],
) -> None:
    ckpt = run[2]
    names = sorted(p.name for p in ckpt.iterdir())
    assert DEAD not in names, names
    assert LIVE in names, names


def test_nan_on_one_process_stops_every_process_before_the_save(run: tuple[int, str, Path]) -> None:
    code, err, ckpt = run
    assert code != 0, err[-3000:]
    refusal = "FloatingPointError: not saving the checkpoint of epoch 2, step 16: parameters "
    # rank 0's shards are finite: it refuses on rank 1's verdict, all-reduced
    assert f"[rank0]: {refusal}of another process's shards hold NaN or inf" in err, err[-3000:]
    assert f"[rank1]: {refusal}0.weight hold NaN or inf" in err, err[-3000:]
    assert [p.name for p in ckpt.iterdir() if p.name.startswith("ckpt-")] == [
        "ckpt-00001-0000000008"
    ]  # the good one kept, no NaN one made visible

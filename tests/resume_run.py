"""The training that tests/faults/test_exact_resume.py kills and resumes: run in processes of
their own (forked from a forkserver that imported torch once), killed with SIGKILL.

A small MLP with dropout, Adam, a shuffled DataLoader of 60 samples in batches of 8 (8
batches an epoch, the last one short), 4 epochs; a checkpoint after every step.
"""

from __future__ import annotations

import os
import resource
import signal
import time
from pathlib import Path
from typing import Any

import torch
import torch._dynamo  # the first optimizer step imports it: do it once, here
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import runmodel
import runmodel.checkpoint
import runmodel.checkpoint.writer
import runmodel.engine  # the rest of runmodel, also once in the forkserver
from runmodel.packs import Checkpoint

EPOCHS, SAMPLES, BATCH = 4, 60, 8
BATCHES = -(-SAMPLES // BATCH)  # per epoch
STEPS = EPOCHS * BATCHES


class Net(runmodel.TorchModel):
    def __init__(self, workers: int, own_generator: bool = False) -> None:
        super().__init__("cpu")
        self.workers, self.own_generator = workers, own_generator
        torch.manual_seed(0)
        self.module = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))

    def setup(self, setup_options: dict[str, object] | None = None) -> None:
        g = torch.Generator().manual_seed(1)
        x = torch.randn(SAMPLES, 6, generator=g)
        self.optimizer = torch.optim.Adam(self.module.parameters(), lr=1e-2)
        self.loss_fn = nn.MSELoss()
        self.train_data = DataLoader(
            TensorDataset(x, x.sum(1, keepdim=True)),
            batch_size=BATCH,
            shuffle=True,
            num_workers=self.workers,
            generator=torch.Generator().manual_seed(5) if self.own_generator else None,
            persistent_workers=self.workers > 0,
            # what a script gets on Linux; a process forked by
            # the forkserver would start its workers through it
            multiprocessing_context="fork" if self.workers else None,
        )


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def train(
    folder: str,
    workers: int,
    kill: tuple[str, int] | None,
    out: str,
    options: dict[str, Any] | None = None,
) -> None:
    """Train; resume from ``folder`` if it holds a checkpoint; die at ``kill``:
    ``("step", k)`` after step k and its checkpoint, ``("epoch", e)`` as epoch e starts,
    ``("save", k)`` in the middle of writing the k-th checkpoint (written, not renamed),
    ``("full", k)``: the disk is full from step k on (a file-size limit smaller than a
    checkpoint: writes fail with EFBIG), and the run's error goes to ``out + ".error"``.
    ``options``: ``async_save``, ``every`` (default ``"1st"``) of the Checkpoint pack,
    ``own_generator`` (the loader's). Writes the final parameters to ``out``."""
    torch.set_num_threads(1)
    options = options or {}
    engine = runmodel.Engine()
    if folder:
        engine.attach(
            Checkpoint(
                folder,
                every=options.get("every", "1st"),
                keep=2,
                async_save=options.get("async_save", False),
            )
        )
    if kill is not None:
        kind, at = kill
        if kind == "full":  # before the checkpoint of step `at`
            engine.on("runstep", _fill_disk, once=at)
        elif kind == "step":  # after the checkpoint of step `at` (priority below Checkpoint's)
            engine.on("runstep", lambda e: _die(), once=at, priority=-2000)
        elif kind == "epoch":
            engine.on("epoch_start", lambda e: _die(), once=at)
        elif options.get("async_save", False):
            kill_mid_async_save(at)
        else:
            replace, saves = os.replace, [0]

            def replace_then_die(source: str, target: str) -> None:
                saves[0] += 1
                if saves[0] == at:  # the temporary file is complete and fsynced
                    _die()
                replace(source, target)

            runmodel.checkpoint.format.os.replace = replace_then_die  # type: ignore[attr-defined]
    model = Net(workers, options.get("own_generator", False))
    resume = "auto" if folder else None
    try:
        engine.run(model, epochs=EPOCHS, resume=resume)
    except OSError as error:
        if kill is None or kill[0] != "full":
            raise
        Path(out + ".error").write_text(
            f"{type(error).__name__}: {error}\n{error.__cause__!r} {error.__suppress_context__}"
        )
        return
    torch.save([p.detach() for p in model.module.parameters()], out)


def kill_mid_async_save(at: int) -> None:
    """The ``at``-th checkpoint that ``Checkpoint(async_save=True)``'s writer process
    writes kills the training's process with SIGKILL once written and fsynced, before its
    rename (the writer process, forked from this one, dies with it)."""
    training, replace, saves = os.getpid(), os.replace, [0]

    def replace_then_die(source: str, target: str) -> None:
        if os.getpid() != training and os.path.basename(target).startswith("ckpt-"):
            saves[0] += 1
            if saves[0] == at:  # the temporary file is complete and fsynced
                os.kill(os.getppid(), signal.SIGKILL)
                time.sleep(60)  # killed with its parent
        replace(source, target)

    runmodel.checkpoint.format.os.replace = replace_then_die  # type: ignore[attr-defined]


FULL = 4096  # bytes: a file-size limit below a checkpoint's size


def _fill_disk(engine: runmodel.Engine) -> None:
    # what a full disk does to the writes of this process (and of a Checkpoint's writer
    # process): a file past FULL bytes fails with EFBIG (not the SIGXFSZ signal that
    # would kill it)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    limit = (FULL, resource.getrlimit(resource.RLIMIT_FSIZE)[1])
    resource.setrlimit(resource.RLIMIT_FSIZE, limit)
    for pack in engine.table.packs.values():
        process = getattr(getattr(pack, "_writer", None), "_process", None)
        if process is not None:
            resource.prlimit(process.pid, resource.RLIMIT_FSIZE, limit)


def log_until_full(kind: str, folder: str) -> None:
    """Train with a ``kind`` pack (``run_log`` or ``tensorboard``) writing into ``folder``;
    from the 3rd step on, a file may grow by 16 bytes more at most (a disk filling up).
    The run's error goes to ``folder/error``."""
    from runmodel.packs import RunLog, TensorBoard

    torch.set_num_threads(1)
    engine = runmodel.Engine()
    engine.attach(
        RunLog(Path(folder) / "run.log") if kind == "run_log" else TensorBoard(Path(folder) / "tb")
    )

    def fill(engine: runmodel.Engine) -> None:
        biggest = max(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(
            resource.RLIMIT_FSIZE, (biggest + 16, resource.getrlimit(resource.RLIMIT_FSIZE)[1])
        )

    engine.on("runstep", fill, once=2)
    try:
        engine.run(Net(0), epochs=EPOCHS)
    except OSError as error:
        hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
        resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
        Path(folder, "error").write_text(
            f"{type(error).__name__}: {error}\n{error.__cause__!r} {error.__suppress_context__}"
        )


def status_until_full(folder: str) -> None:
    """Write a config run's status file, then again on a disk that has no room for it;
    what was raised goes to ``folder/error``."""
    from runmodel._io import write_json

    path = Path(folder) / "status.json"
    write_json(path, {"status": "running"})
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    resource.setrlimit(resource.RLIMIT_FSIZE, (64, hard))
    try:
        write_json(path, {"status": "failed", "error": "x" * 100})
    except OSError as error:
        resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
        Path(folder, "error").write_text(
            f"{type(error).__name__}: {error}\n{error.__cause__!r} {error.__suppress_context__}"
        )

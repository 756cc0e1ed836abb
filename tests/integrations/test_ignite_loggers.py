"""An experiment tracker's ignite logger attached to a runmodel run through
``engine.ignite``, unchanged: ignite's ``WandBLogger``, with Weights & Biases in offline
mode (it writes its run to a local folder and contacts no server), its run file read back
record by record.

Skipped where wandb is not installed (the dev extra has it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import runmodel

from helpers import make_data

BLOCK = 32 * 1024  # the run file's records are laid out in blocks, as a LevelDB log's
HEADER = 7  # the file's header (":W&B", a magic number, a version); each record's too


def records(path: Path) -> list[bytes]:
    """The records of a W&B run file (``run-ID.wandb``): a LevelDB-style log, whose
    records each have a 7-byte header (checksum, length, kind: whole, first, middle,
    last) and never cross a 32 KiB block's end."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    found, parts, at = [], b"", HEADER
    while at + HEADER <= len(data):
        if BLOCK - at % BLOCK < HEADER:  # the rest of a block is padding
            at += BLOCK - at % BLOCK
            continue
        length, kind = int.from_bytes(data[at + 4 : at + 6], "little"), data[at + 6]
        parts += data[at + HEADER : at + HEADER + length]
        at += HEADER + length
        if kind in (1, 4):  # a whole record, or a record's last part
            found.append(parts)
            parts = b""
    return found


def history(run_file: Path) -> list[dict[str, Any]]:
    """The rows a run logged (``wandb.log``), as its run file holds them."""
    from wandb.proto import wandb_internal_pb2

    rows = []
    for data in records(run_file):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return rows


def test_wandb_logger_through_engine_ignite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wandb = pytest.importorskip("wandb", reason="wandb is not installed (the dev extra has it)")
    from ignite.engine import Events
    from ignite.handlers.wandb_logger import WandBLogger

    monkeypatch.setenv("WANDB_MODE", "offline")  # nothing leaves this machine
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    torch.manual_seed(0)
    module = nn.Linear(4, 3)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    model = runmodel.TorchModel.from_parts(
        module,
        optimizer=optimizer,
        loss_fn=nn.CrossEntropyLoss(),
        train_data=make_data(4, 8, 4, classes=3),
    )
    engine = runmodel.Engine(progress=False)
    losses: list[float] = []
    engine.on("runstep", lambda e: losses.append(e.state.loss.item()))
    trainer = engine.ignite
    logger = WandBLogger(project="runmodel-test", dir=str(tmp_path), mode="offline")
    try:  # the lines an ignite user writes for an ignite trainer, unchanged
        logger.attach_output_handler(
            trainer,
            event_name=Events.ITERATION_COMPLETED,
            tag="training",
            output_transform=lambda o: {"loss": o["loss"]},
        )
        logger.attach_opt_params_handler(
            trainer, event_name=Events.ITERATION_STARTED, optimizer=optimizer
        )
        engine.run(model, epochs=2)
    finally:
        logger.close()
        wandb.teardown()  # its service process ends with the run, not with pytest
    (run_file,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    rows = history(run_file)
    logged = [row for row in rows if "training/loss" in row]
    assert [row["training/loss"] for row in logged] == pytest.approx(losses, rel=1e-6)
    assert [row["_step"] for row in logged] == list(range(1, 9))  # ignite's 1-based iteration
    assert [row["lr/group_0"] for row in logged] == [0.1] * 8

"""The storage seam: a run's checkpoints are written and read through ``engine.storage``,
the backend's when it has one (``Backend.storage()``: fsdp's sharded folders), else the
engine's own (plain files). The Checkpoint pack keeps the policy; the core resumes
through the storage, importing no checkpoint code. (Sharded storage in real processes:
test_sharded_full_disk.py.)"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import runmodel
from runmodel.backends import Plain
from runmodel.checkpoint import FileStorage
from runmodel.core import BareEngine
from runmodel.modes import as_mode
from runmodel.packs import Checkpoint

from helpers import assert_equal_params, dropout_mlp, files


class RecordingStorage(FileStorage):
    """Plain files, each call noted: what a storage of one's own (another store, another
    layout) would be asked."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def save(
        self, path: Path, snapshot: dict[str, Any], then: Callable[[], None] | None = None
    ) -> None:
        self.calls.append(("save", path.name))
        super().save(path, snapshot, then)

    def load(self, path: str | os.PathLike[str], model: Any) -> tuple[Path, dict[str, Any]]:
        self.calls.append(("load", Path(path).name))
        return super().load(path, model)


class StoringBackend(Plain):
    """The plain backend, giving the run a storage of its own (as fsdp gives its)."""

    def __init__(self, storage: RecordingStorage) -> None:
        super().__init__()
        self._storage = storage

    def storage(self) -> RecordingStorage:
        return self._storage


def test_the_engine_s_own_storage_is_plain_files() -> None:
    engine = runmodel.Engine()
    assert isinstance(engine.storage, FileStorage)
    model = dropout_mlp()
    model.setup()
    state = engine.storage.full_model_state(model)
    assert state is not None and list(state) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    for name, value in model.module.state_dict().items():
        assert torch.equal(state[name], value), name


def test_checkpoints_go_through_the_backend_s_storage_and_resume_reads_through_it(
    tmp_path: Path,
) -> None:
    storage, seen = RecordingStorage(), []
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path, every="1ep", keep=1))
    engine.on("setup", lambda e: seen.append(e.storage))
    engine.run(dropout_mlp(), epochs=2, backend=StoringBackend(storage))
    assert seen == [storage] and engine.storage is not storage  # the run's alone
    assert storage.calls == [
        ("save", "ckpt-00001-0000000004.pt"),
        ("save", "ckpt-00002-0000000008.pt"),
    ]
    assert files(tmp_path) == ["ckpt-00002-0000000008.pt"]  # pruned by the pack's keep=1
    straight = dropout_mlp()
    runmodel.Engine().run(straight, epochs=3)
    again, resumed = runmodel.Engine(), dropout_mlp()
    again.attach(Checkpoint(tmp_path, every="1ep", keep=1))
    again.run(resumed, epochs=3, backend=StoringBackend(storage), resume=tmp_path)
    assert storage.calls[2:] == [("load", tmp_path.name), ("save", "ckpt-00003-0000000012.pt")]
    assert_equal_params(resumed, straight)


def test_a_core_engine_without_storage_says_what_to_give_it(tmp_path: Path) -> None:
    engine = BareEngine()
    assert engine.storage is None
    with pytest.raises(
        ValueError,
        match=r"resume= reads the checkpoint through the engine's "
        r"checkpoint storage, and this engine has none",
    ):
        engine.run(dropout_mlp(), as_mode("train"), epochs=1, resume=tmp_path)
    engine.attach(Checkpoint(tmp_path / "ckpt"))
    with pytest.raises(
        ValueError,
        match=r"Checkpoint writes through the engine's checkpoint "
        r"storage.*runmodel\.core\.BareEngine\(storage=",
    ):
        engine.run(dropout_mlp(), as_mode("train"), epochs=1)
    given = BareEngine(storage=FileStorage())
    given.attach(Checkpoint(tmp_path / "given"))
    given.run(dropout_mlp(), as_mode("train"), epochs=1)
    assert files(tmp_path / "given") == ["ckpt-00001-0000000004.pt"]

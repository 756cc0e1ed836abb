"""Damaged, foreign and unsafe checkpoint files: resume skips each with a warning that
says what is wrong with it and goes on from the newest good one, never runs code from a
file, and never advises loading one unsafely."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import runmodel
from runmodel.packs import Checkpoint

NEWEST = "ckpt-00009-0000000099.pt"


def model() -> runmodel.TorchModel:
    torch.manual_seed(0)
    x = torch.randn(8, 3)
    return runmodel.TorchModel.from_parts(
        nn.Linear(3, 1),
        optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
        loss_fn=nn.MSELoss(),
        train_data=[(x[i : i + 2], x[i : i + 2].sum(1, keepdim=True)) for i in range(0, 8, 2)],
    )


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A good checkpoint's bytes: after epoch 1 (step 4)."""
    folder = tmp_path_factory.mktemp("good")
    engine = runmodel.Engine()
    engine.attach(Checkpoint(folder))
    engine.run(model(), epochs=1)
    return (folder / "ckpt-00001-0000000004.pt").read_bytes()


class RunsCode:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {Path.cwd() / 'ran'}",))


def damaged(kind: str, good: bytes, path: Path) -> None:
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        path.write_bytes(good[: len(good) // 2])
    elif kind == "integer format":
        torch.save({"format": 2, "weights": torch.zeros(3)}, path)
    elif kind == "not a dict":
        torch.save([1, 2, 3], path)
    else:
        torch.save({"format": 2, "engine": RunsCode()}, path)


REASONS = {
    "empty": "it is empty (0 bytes): its write was cut short",
    "truncated": "it is cut short or damaged (",
    "integer format": "it holds no runmodel checkpoint (a 'format' of 2, but no engine",
    "not a dict": "it holds no runmodel checkpoint",
    "unsafe": "it holds an object whose loading would run code (posix.system)",
}


@pytest.mark.parametrize("kind", list(REASONS))
def test_a_bad_newest_checkpoint_is_skipped_saying_why(
    kind: str,
    good: bytes,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    (folder / "ckpt-00001-0000000004.pt").write_bytes(good)
    damaged(kind, good, folder / NEWEST)
    engine = runmodel.Engine()
    engine.attach(Checkpoint(folder))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = engine.run(model(), epochs=2, resume="auto")
    assert (result.steps, result.epochs) == (8, 2)  # went on from the good one
    skipped = [str(w.message) for w in caught if "skipping" in str(w.message)]
    assert len(skipped) == 1 and f"{NEWEST}': {REASONS[kind]}" in skipped[0], skipped
    assert "weights_only" not in skipped[0]
    err = capsys.readouterr().err
    assert "resuming from" in err and NEWEST not in err  # announced once read, not before
    assert not (tmp_path / "ran").exists()


def test_an_unsafe_file_given_as_resume_is_one_error_without_unsafe_advice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    damaged("unsafe", b"", tmp_path / NEWEST)
    with pytest.raises(ValueError) as caught:
        runmodel.Engine().run(model(), epochs=1, resume=tmp_path / NEWEST)
    assert "would run code" in str(caught.value)
    assert "weights_only=False" not in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    assert not (tmp_path / "ran").exists()


def test_attaching_a_pack_twice_names_the_key_it_has() -> None:
    engine, pack = runmodel.Engine(), Checkpoint("unused")
    engine.attach(pack)
    with pytest.raises(
        ValueError,
        match=r"this Checkpoint pack is attached already, as "
        r"'checkpoint'; make a new instance",
    ):
        engine.attach(pack)
    with pytest.raises(ValueError, match=r"as 'checkpoint#2'"):
        engine.attach(twice := Checkpoint("other"), twice)

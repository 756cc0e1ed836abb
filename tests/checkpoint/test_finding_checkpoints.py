"""Finding checkpoints (``runmodel.checkpoint.names``, the one module that knows their
names): a folder's checkpoints newest first, files and whole sharded folders alike, and
the newest readable one, skipping damaged ones with a warning that says why and whether
an older one is tried."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import runmodel
from runmodel.checkpoint import names

from helpers import dropout_mlp, train_with_checkpoints


def sharded_folder(path: Path, whole: bool = True) -> Path:
    """A folder laid out as a sharded save leaves it (empty files)."""
    path.mkdir(parents=True)
    for name in ("__0_0.distcp", "run-0.pt", "run-1.pt", *([names.METADATA] if whole else [])):
        (path / name).write_bytes(b"")
    return path


def test_names_say_where_a_run_resumed_from_them_starts() -> None:
    assert names.file_name(3, 69) == "ckpt-00003-0000000069.pt"
    assert names.folder_name(3, 69) == "ckpt-00003-0000000069"
    assert names.best_file_name("eval_loss", 0.1234567, 3, 69) == (
        "best-eval_loss=0.123457-00003-0000000069.pt"
    )
    for name in (
        "ckpt-00003-0000000069.pt",
        "ckpt-00003-0000000069",
        "best-eval_loss=0.123457-00003-0000000069.pt",
    ):
        assert names.position(Path(name)) == (3, 69)
    assert names.position(Path("notes.txt")) == (-1, -1)


def test_files_and_whole_sharded_folders_newest_first(tmp_path: Path) -> None:
    for name in (
        "ckpt-00001-0000000008.pt",
        "ckpt-00002-0000000016.pt",
        "best-loss=0.5-00002-0000000016.pt",
        "notes.txt",
    ):
        (tmp_path / name).write_bytes(b"")
    sharded_folder(tmp_path / "ckpt-00003-0000000020")
    sharded_folder(tmp_path / "ckpt-00004-0000000030", whole=False)  # lost its index
    sharded_folder(tmp_path / ".ckpt-00005-0000000040.tmp-abc")  # a staging folder
    assert [p.name for p in names.checkpoints_in(tmp_path)] == [
        "ckpt-00003-0000000020",
        "ckpt-00002-0000000016.pt",
        "ckpt-00001-0000000008.pt",
    ]
    assert names.newest(names.checkpoints_in(tmp_path)) == tmp_path / "ckpt-00003-0000000020"
    assert names.saved_world(tmp_path / "ckpt-00003-0000000020") == 2


def test_a_run_folder_s_checkpoint_folder_and_the_best_alone(tmp_path: Path) -> None:
    best = tmp_path / "checkpoint"
    best.mkdir()
    for name in ("best-loss=0.5-00001-0000000008.pt", "best-loss=0.25-00003-0000000024.pt"):
        (best / name).write_bytes(b"")
    assert [p.name for p in names.checkpoints_in(tmp_path)] == [
        "best-loss=0.25-00003-0000000024.pt",
        "best-loss=0.5-00001-0000000008.pt",
    ]
    assert names.checkpoints_in(tmp_path / "nowhere") == []


def test_the_only_checkpoint_unreadable_names_no_older_one(tmp_path: Path) -> None:
    (tmp_path / "ckpt-00001-0000000004.pt").write_bytes(b"cut")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(
            FileNotFoundError,
            match=r"no readable checkpoint in .*: all 1 are "
            r"damaged",
        ):
            runmodel.Engine().run(dropout_mlp(), epochs=1, resume=tmp_path)
    said = [str(w.message) for w in caught if "skipping" in str(w.message)]
    assert len(said) == 1 and "ckpt-00001-0000000004.pt" in said[0], said
    assert "older" not in said[0], said  # there is none


def test_an_unreadable_newest_is_skipped_for_the_one_before(tmp_path: Path) -> None:
    train_with_checkpoints(tmp_path, epochs=2, keep=None)
    (tmp_path / "ckpt-00002-0000000008.pt").write_bytes(b"")
    with pytest.warns(
        UserWarning,
        match=r"skipping unreadable checkpoint .*ckpt-00002-"
        r"0000000008\.pt': it is empty \(0 bytes\): its write "
        r"was cut short; trying an older one",
    ):
        used, snapshot = runmodel.checkpoint.load(tmp_path)
    assert used.name == "ckpt-00001-0000000004.pt"
    assert snapshot["engine"]["counters"]["step"] == 4

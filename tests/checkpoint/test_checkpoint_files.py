"""Reading a checkpoint file: what cannot be read is one ``ValueError`` that names the
file and says what is wrong with it (cut short, not a torch file, holding code), never
a raw error of torch's reader; ``runmodel eval`` with such a file reads it through the
same reader. The file format's own behaviour (contents, atomic writes, hostile and
foreign files while resuming) is in test_resume_from_files.py and
test_damaged_checkpoints.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from runmodel import checkpoint
from runmodel.checkpoint.export import model_state
from runmodel.runs.weights import load_weights

from helpers import dropout_mlp, train_with_checkpoints


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real checkpoint file, after one epoch of a small model."""
    folder = tmp_path_factory.mktemp("saved")
    train_with_checkpoints(folder, epochs=1)
    return folder / "ckpt-00001-0000000004.pt"


@pytest.mark.parametrize("cut", [0.5, 0.999])
def test_a_truncated_checkpoint_is_one_clear_error_naming_it(
    saved: Path, tmp_path: Path, cut: float
) -> None:
    # cut near its end, torch's reader raised a bare OSError: [Errno 22] Invalid argument
    path = tmp_path / "ckpt-00001-0000000004.pt"
    data = saved.read_bytes()
    path.write_bytes(data[: int(len(data) * cut)])
    with pytest.raises(ValueError) as caught:
        checkpoint.read(path)
    message = str(caught.value)
    assert message.startswith(
        f"{str(path)!r} is not a readable checkpoint: it is cut short "
        f"or damaged ({path.stat().st_size} bytes)"
    ), message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_evaluating_with_a_truncated_checkpoint_says_so_in_one_error(
    saved: Path, tmp_path: Path
) -> None:
    """What ``runmodel eval RUN --checkpoint FILE`` loads its weights with."""
    path = tmp_path / "cut.pt"
    path.write_bytes(saved.read_bytes()[:-10])
    with pytest.raises(
        ValueError,
        match=r"cut\.pt' is not a readable checkpoint: it is cut "
        r"short or damaged",
    ):
        load_weights(dropout_mlp(), path)


def test_random_bytes_are_not_called_code(tmp_path: Path) -> None:
    path = tmp_path / "noise.pt"
    path.write_bytes(os.urandom(3000))
    with pytest.raises(ValueError) as caught:
        checkpoint.read(path)
    message = str(caught.value)
    assert "run code" not in message, message
    assert message == (
        f"{str(path)!r} is not a readable checkpoint: its 3000 bytes are not a "
        f"file torch.save writes (a zip archive): another kind of file, or "
        f"overwritten"
    )


class _RunsCode:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("true",))


def test_a_file_naming_a_function_is_still_called_code(tmp_path: Path) -> None:
    path = tmp_path / "planted.pt"
    torch.save({"format": 2, "engine": _RunsCode()}, path)
    with pytest.raises(
        ValueError,
        match=r"it holds an object whose loading would run code "
        r"\((posix|os)\.system\)",
    ):
        checkpoint.read(path)


def test_the_weights_of_a_checkpoint_a_bare_state_dict_and_a_foreign_file(
    saved: Path, tmp_path: Path
) -> None:
    state = model_state(saved)
    assert state["optimizer"] is None and list(state["module"]) == [
        "0.weight",
        "0.bias",
        "2.weight",
        "2.bias",
    ]
    torch.save(state["module"], tmp_path / "model.pt")  # an export: the weights alone
    alone = model_state(tmp_path / "model.pt")
    assert alone["optimizer"] is None
    for name, value in state["module"].items():
        assert torch.equal(alone["module"][name], value), name
    (tmp_path / "notes.pt").write_text("not weights")
    with pytest.raises(
        ValueError,
        match=r"notes\.pt' is not a readable checkpoint: its 11 "
        r"bytes are not a file torch.save writes",
    ):
        model_state(tmp_path / "notes.pt")

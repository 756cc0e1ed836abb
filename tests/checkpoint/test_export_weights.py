"""``runmodel export``: a checkpoint's module weights as one plain file that
``torch.load(weights_only=True)`` loads into the bare module (a sharded checkpoint's:
tests/backends/test_fsdp.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from runmodel.checkpoint.export import export
from runmodel.cli import main

from helpers import dropout_mlp, files, train_with_checkpoints


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    """A Checkpoint pack's folder after 2 epochs, and the weights the run ended with."""
    folder = tmp_path_factory.mktemp("trained")
    model, _ = train_with_checkpoints(folder, epochs=2)
    return folder, {k: v.clone() for k, v in model.module.state_dict().items()}


def test_a_folder_exports_its_newest_checkpoint_s_weights(
    trained: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path
) -> None:
    folder, final = trained
    used, out = export(folder, tmp_path / "model.pt")
    assert (used.name, out) == ("ckpt-00002-0000000008.pt", tmp_path / "model.pt")
    weights = torch.load(out, weights_only=True)
    assert list(weights) == list(final)
    for name, value in final.items():
        assert torch.equal(weights[name], value), name
    module = dropout_mlp().module
    module.load_state_dict(weights)  # the bare module takes it as it is
    assert files(tmp_path) == ["model.pt"]  # no temporary file left


def test_exporting_onto_a_folder_names_the_folder(
    trained: tuple[Path, dict[str, torch.Tensor]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    folder, _ = trained
    out = tmp_path / "weights"
    out.mkdir()
    with pytest.raises(IsADirectoryError) as caught:
        export(folder, out)
    assert str(caught.value) == (
        f"{str(out)!r} is a folder: the export is one file; give a "
        f"file path, such as {str(out / 'model.pt')!r}"
    )
    assert main(["export", str(folder), str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{out}' is a folder" in err and ".tmp" not in err, err
    assert list(out.iterdir()) == [] and files(tmp_path) == ["weights"]


def test_a_folder_without_checkpoints_says_what_export_takes(tmp_path: Path) -> None:
    with pytest.raises(
        FileNotFoundError,
        match=r"no checkpoint to export at .*\(a checkpoint "
        r"file, a sharded checkpoint folder",
    ):
        export(tmp_path, tmp_path / "model.pt")

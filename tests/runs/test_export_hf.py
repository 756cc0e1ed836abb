"""``runmodel export RUN_DIR DIR --format hf``: a run of a tiny Hugging Face BERT (built
from a config: no download) saved with its module's ``save_pretrained``, checked by
loading it back, and ``from_pretrained(DIR)`` gives the run's logits; a module without
``save_pretrained`` is refused with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import runmodel
from runmodel.cli import main
from runmodel.runs.export import save_pretrained
from runmodel.runs.weights import choose_weights

transformers = pytest.importorskip("transformers")

MODEL = """\
import torch
from transformers import BertConfig, BertForSequenceClassification

import runmodel

CONFIG = dict(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
              intermediate_size=32, max_position_embeddings=16, num_labels=3)


def batches():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 40, (24, 6), generator=g)
    labels = ids[:, 0] % 3
    return [{"input_ids": ids[i:i + 8], "labels": labels[i:i + 8]} for i in range(0, 24, 8)]


class TinyBert(runmodel.TorchModel):
    def __init__(self, device=None, init_options=None):
        super().__init__(device, init_options)
        torch.manual_seed(0)
        self.module = BertForSequenceClassification(BertConfig(**CONFIG))

    def setup(self, setup_options=None):
        self.optimizer = torch.optim.AdamW(self.module.parameters(), lr=1e-2)
        self.train_data = self.eval_data = batches()
"""


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("hf")
    (folder / "tinybert.py").write_text(MODEL)
    args = ["run", str(folder / "tinybert.py"), "--epochs", "2", "--device", "cpu"]
    assert main([*args, "--runs-dir", str(folder / "runs"), "--no-progress"]) == 0
    [found] = (folder / "runs").iterdir()
    return found


def test_the_export_loads_back_with_from_pretrained(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tinybert"
    assert main(["export", str(run_dir), str(out), "--format", "hf"]) == 0
    err = capsys.readouterr().err
    assert f" as hf to {out}" in err and f"checked: from_pretrained({out})'s outputs" in err
    loaded = transformers.BertForSequenceClassification.from_pretrained(out).eval()
    module = transformers.BertForSequenceClassification(loaded.config)
    module.load_state_dict(
        torch.load(choose_weights(run_dir), weights_only=True)["model"]["module"]
    )
    ids = torch.randint(0, 40, (5, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(input_ids=ids).logits, module.eval()(input_ids=ids).logits
        )
    assert loaded.config.num_labels == 3


def test_a_module_without_save_pretrained_is_refused(tmp_path: Path) -> None:
    model = runmodel.TorchModel.from_parts(torch.nn.Linear(2, 2), device="cpu")
    with pytest.raises(ValueError, match=r"save_pretrained .* and Linear has none; export its "):
        save_pretrained(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()

"""Options (issue 19, part 2): a ``--set`` key that names no config field is a usage error
(exit 2) with a did-you-mean; a model option the model does not declare is ignored with
one warning (a did-you-mean when one is close), and an ignored option enters neither the
run folder's name nor its hash."""

from __future__ import annotations

import json
import re
import uuid
import warnings
from pathlib import Path

import pytest

from runmodel.cli import main
from runmodel.config.runconfig import load_config
from runmodel.models import TorchModel
from runmodel.runs import prepare

MODEL = '''\
import torch
from torch import nn

import runmodel


class Small(runmodel.TorchModel):
    init_defaults = {{"hidden": 8, "seed": 0}}

    def __init__(self, device=None, init_options=None):
        super().__init__(device, init_options)
        torch.manual_seed(self.init_options["seed"])
        self.module = nn.Sequential(nn.Linear(4, self.init_options["hidden"]), nn.ReLU(),
                                    nn.Linear(self.init_options["hidden"], 2))

    def setup(self, setup_options=None):
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=0.1)
        self.loss_fn = nn.CrossEntropyLoss()
        x = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
        self.train_data = [(x[:8], (x[:8, 0] > 0).long()), (x[8:], (x[8:, 0] > 0).long())]


runmodel.register_model({name!r}, Small)
'''


@pytest.fixture
def config(tmp_path: Path) -> Path:
    name = f"small-{uuid.uuid4().hex[:8]}"
    (tmp_path / "small.py").write_text(MODEL.format(name=name))
    path = tmp_path / "config.toml"
    path.write_text(f'imports = ["small.py"]\nepochs = 1\ndevice = "cpu"\n[model]\n'
                    f'type = "{name}"\nargs = {{ hidden = 16 }}\n[[packs]]\ntype = "progress"\n')
    return path


def test_a_misspelt_model_option_warns_once_and_names_no_folder(config: Path) -> None:
    root = config.parent / "runs"
    plain = load_config(config)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prepared = prepare(load_config(config, ["model.args.hiden=64"]), root,
                           base=config.parent)
    [warning] = [str(w.message) for w in caught]
    assert warning == ("Small: unknown init option 'hiden' ignored; did you mean 'hidden'? "
                       "(known: hidden, seed)")
    # the folder and the hash are the plain config's: the option changed nothing
    assert prepared.directory == root / plain.run_name()
    assert "hiden" not in prepared.directory.name
    assert prepared.config == plain and prepared.config.digest() == plain.digest()
    prepared.run()
    written = json.loads((prepared.directory / "config.json").read_text())
    assert written["model"]["args"] == {"hidden": 16}
    assert prepared.model.module[0].out_features == 16  # the declared option, not the typo


def test_the_command_line_warns_once_and_runs_in_the_plain_configs_folder(
        config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = config.parent / "runs"
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # shown as the command line shows it, on stderr
        warnings.showwarning = _to_stderr
        assert main(["run", str(config), "--runs-dir", str(root), "--set",
                     "model.args.hiden=64", "--set", "model.args.sede=3"]) == 0
    err = capsys.readouterr().err
    assert err.count("unknown init option") == 2
    assert "unknown init option 'hiden' ignored; did you mean 'hidden'?" in err
    assert "unknown init option 'sede' ignored; did you mean 'seed'?" in err
    assert [p.name for p in root.iterdir()] == [load_config(config).run_name()]


def _to_stderr(message: Warning | str, category: type[Warning], filename: str, lineno: int,
               file: object = None, line: str | None = None) -> None:
    import sys

    print(f"{category.__name__}: {message}", file=sys.stderr)


@pytest.mark.parametrize(("key", "close"), [("epoch=2", "epochs"), ("sed=1", "seed"),
                                            ("modle.args.hidden=3", "model"),
                                            ("pack.0.type=x", "packs")])
def test_a_set_key_naming_no_config_field_is_a_usage_error(
        config: Path, capsys: pytest.CaptureFixture[str], key: str, close: str) -> None:
    root = config.parent / "runs"
    assert main(["run", str(config), "--runs-dir", str(root), "--set", key]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert re.fullmatch(rf"runmodel run: error: --set '{re.escape(key)}': unknown key "
                        rf"'{key.split('.')[0].split('=')[0]}' \(did you mean '{close}'\?\); "
                        rf"valid keys: .*", line), line
    assert not root.exists()


def test_a_script_models_unknown_option_warns_with_a_did_you_mean() -> None:
    class Net(TorchModel):
        init_defaults = {"hidden": 8}

    with pytest.warns(UserWarning) as caught:
        model = Net(init_options={"hiden": 3})
    assert [str(w.message) for w in caught] == [
        "Net: unknown init option 'hiden' ignored; did you mean 'hidden'? (known: hidden)"]
    assert model.init_options == {"hidden": 8}

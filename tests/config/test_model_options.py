"""Options (issue 19, part 2; issue 28): a ``--set`` key that names no config field is a
usage error (exit 2) with a did-you-mean, and so is a ``--set model.args.NAME`` the model
does not declare; from Python, a model option the model does not declare is ignored with
one warning (a did-you-mean when one is close), and an ignored option enters neither the
run folder's name nor its hash."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest

from runmodel.cli import main
from runmodel.config.overrides import ConfigError
from runmodel.config.runconfig import load_config
from runmodel.models import TorchModel
from runmodel.runs import prepare

MODEL = """\
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
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    name = f"small-{uuid.uuid4().hex[:8]}"
    (tmp_path / "small.py").write_text(MODEL.format(name=name))
    path = tmp_path / "config.toml"
    path.write_text(
        f'imports = ["small.py"]\nepochs = 1\ndevice = "cpu"\n[model]\n'
        f'type = "{name}"\nargs = {{ hidden = 16 }}\n[[packs]]\ntype = "progress"\n'
    )
    return path


def test_a_misspelt_model_option_in_a_config_is_refused_and_names_no_folder(
    config: Path,
) -> None:
    """Issue 38 (it warned before, issue 19): a config's option the model does not
    declare is refused as on the command line, with the close name and what the model
    declares, before any folder is made."""
    root = config.parent / "runs"
    with pytest.raises(ConfigError) as caught:
        prepare(load_config(config, ["model.args.hiden=64"]), root, base=config.parent)
    assert str(caught.value).endswith(
        "declares no init option 'hiden' (did you mean 'hidden'?); its init options: hidden, seed"
    ), caught.value
    assert not root.exists()


@pytest.mark.parametrize("command", ["run", "describe"])
def test_on_the_command_line_a_model_option_the_model_does_not_declare_is_a_usage_error(
    config: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """Issue 28: ``--set model.args.hiden=64`` stops before anything is written, naming
    the close name and what the model declares (in Python, the option is warned about
    and ignored, as above)."""
    root = config.parent / "runs"
    name = load_config(config).model.type_
    given = ["--set", "model.args.hiden=64", "--set", "model.args.sede=3"]
    extra = ["--runs-dir", str(root)] if command == "run" else []
    assert main([command, str(config), *extra, *given]) == 2
    captured = capsys.readouterr()
    [line] = captured.err.splitlines()
    assert line == (
        f"runmodel {command}: error: --set 'model.args.hiden=64': Small "
        f"(model {name!r}) declares no init option 'hiden' (did you mean "
        f"'hidden'?); its init options: hidden, seed"
    )
    assert captured.out == ""
    assert not root.exists()


#: A model registered by a factory function: it declares no options, so any it is given
#: goes through.
FACTORY = """\
import torch
from torch import nn

import runmodel


class Small(runmodel.TorchModel):
    def __init__(self, device=None, width=8):
        super().__init__(device)
        self.module = nn.Linear(4, width)

    def setup(self, setup_options=None):
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=0.1)
        self.loss_fn = lambda output, target: output.pow(2).mean()
        self.train_data = [(torch.ones(2, 4), torch.zeros(2))]


runmodel.register_model({name!r}, lambda name, device, **args: Small(device, **args))
"""


def test_a_model_that_declares_no_options_takes_them_with_one_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = f"factory-{uuid.uuid4().hex[:8]}"
    (tmp_path / "factory.py").write_text(FACTORY.format(name=name))
    config = tmp_path / "config.toml"
    config.write_text(
        f'imports = ["factory.py"]\nepochs = 1\ndevice = "cpu"\n[model]\ntype = "{name}"\n'
    )
    root = tmp_path / "runs"
    assert (
        main(
            [
                "run",
                str(config),
                "--runs-dir",
                str(root),
                "--set",
                "model.args.width=3",
                "--no-progress",
            ]
        )
        == 0
    )
    [warning, where] = capsys.readouterr().err.splitlines()
    assert warning == (
        f"runmodel: warning: model {name!r} declares no init options "
        f"(init_defaults), so these go to it unchecked: --set "
        f"'model.args.width=3'"
    )
    [run_dir] = root.iterdir()
    assert where == f"run directory: {run_dir}"
    assert json.loads((run_dir / "config.json").read_text())["model"]["args"] == {"width": 3}


@pytest.mark.parametrize(
    ("key", "close"),
    [
        ("epoch=2", "epochs"),
        ("sed=1", "seed"),
        ("modle.args.hidden=3", "model"),
        ("pack.0.type=x", "packs"),
    ],
)
def test_a_set_key_naming_no_config_field_is_a_usage_error(
    config: Path, capsys: pytest.CaptureFixture[str], key: str, close: str
) -> None:
    root = config.parent / "runs"
    assert main(["run", str(config), "--runs-dir", str(root), "--set", key]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert re.fullmatch(
        rf"runmodel run: error: --set '{re.escape(key)}': unknown key "
        rf"'{key.split('.')[0].split('=')[0]}' \(did you mean '{close}'\?\); "
        rf"valid keys: .*",
        line,
    ), line
    assert not root.exists()


def test_a_script_models_unknown_option_warns_with_a_did_you_mean() -> None:
    class Net(TorchModel):
        init_defaults = {"hidden": 8}

    with pytest.warns(UserWarning) as caught:
        model = Net(init_options={"hiden": 3})
    assert [str(w.message) for w in caught] == [
        "Net: unknown init option 'hiden' ignored; did you mean 'hidden'? (known: hidden)"
    ]
    assert model.init_options == {"hidden": 8}

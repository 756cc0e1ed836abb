"""Issue 38's silent traps above the engine, each made impossible or loud: a config run
calls the ``configure`` of the files it imports alone (and ``configure(engine, model)``
sees the model's resolved options; ``[setup]`` passes setup options); a config's unknown
model option is refused as ``--set`` refuses it; a file whose run is set up under its
``__main__`` block is a script for every command; the sweep's probe does not check what
only a run produces; ``export --format pt2`` gives ``setup`` its resolved options;
``export`` of a run folder takes the weights ``eval`` takes, and says which.

One config run of a tiny model (three epochs, a best checkpoint that is not the last)
serves the export tests."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from runmodel.checkpoint.export import model_state
from runmodel.cli import main
from runmodel.config.runconfig import load_config
from runmodel.packs import GradClip, Unfreeze
from runmodel.runs.config_run import prepare

NET = """\
import torch
from torch import nn

import runmodel
from runmodel.packs import GradClip


class Net(runmodel.TorchModel):
    init_defaults = {"layers": 2}
    setup_defaults = {"lr": 0.1}

    def __init__(self, device=None, init_options=None):
        super().__init__(device, init_options)
        torch.manual_seed(0)
        layers = [nn.Linear(4, 4) for _ in range(self.init_options["layers"])]
        self.module = nn.Sequential(*layers, nn.Linear(4, 3))

    def setup(self, setup_options=None):
        self.lr = setup_options["lr"]  # the resolved options, never None
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=self.lr)
        self.loss_fn = nn.CrossEntropyLoss()
        g = torch.Generator().manual_seed(0)
        x = torch.randn(32, 4, generator=g)
        y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
        self.train_data = [(x[i : i + 8], y[i : i + 8]) for i in range(0, 32, 8)]
        self.eval_data = self.train_data
"""

MODEL_FILE = f"""\
{NET}

runmodel.register_model("NAME", Net)


def configure(engine):
    engine.attach(GradClip(1.0))
"""


def model_file(name: str, pack: str = "GradClip(1.0)") -> str:
    """A model file registering ``Net`` as ``name`` (a name per test: each file is another
    place), whose ``configure(engine)`` attaches ``pack``."""
    kind = pack.partition("(")[0]
    return (
        MODEL_FILE.replace('"NAME"', f'"{name}"')
        .replace("GradClip(1.0)", pack)
        .replace("import GradClip", f"import {kind}")
    )


CONFIG = """\
imports = [{imports}]
epochs = {epochs}
device = "cpu"
[model]
type = "{model}"
args = {{ layers = 2{more} }}
{rest}
"""


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def config(
    folder: Path, imports: str, model: str, *, epochs: int = 1, more: str = "", rest: str = ""
) -> Path:
    text = CONFIG.format(imports=imports, epochs=epochs, model=model, more=more, rest=rest)
    return write(folder, "run.toml", text)


# -- configure: the imported files' alone; it sees the model -----------------------------------


def test_a_config_run_calls_the_configure_of_its_imports_not_of_the_models_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "trap38_pkg"
    package.mkdir()
    write(package, "__init__.py", "")
    write(package, "nets.py", model_file("trap38_pkg_net"))
    monkeypatch.syspath_prepend(str(tmp_path))
    write(tmp_path, "recipe.py", "from trap38_pkg.nets import Net  # registers it\n")
    path = config(
        tmp_path,
        '"recipe.py"',
        "trap38_pkg_net",
        rest='[[packs]]\ntype = "grad_clip"\nargs = { max_norm = 5.0 }',
    )
    prepared = prepare(load_config(path), directory=tmp_path / "run", base=tmp_path)
    clips = [p for p in prepared.engine.table.packs.values() if isinstance(p, GradClip)]
    assert [c.max_norm for c in clips] == [5.0]  # the config's; nets.configure not called


def test_configure_sees_the_models_resolved_options_and_configs_give_setup_options(
    tmp_path: Path,
) -> None:
    source = model_file("trap38_sized_net").replace(
        "def configure(engine):\n    engine.attach(GradClip(1.0))",
        "def configure(engine, model):  # the top layer first, one more each epoch\n"
        "    layers = model.init_options['layers']\n"
        "    engine.attach(Unfreeze({e: [str(layers - e)] for e in range(layers + 1)}))",
    )
    source = source.replace(
        "from runmodel.packs import GradClip", "from runmodel.packs import Unfreeze"
    )
    write(tmp_path, "net.py", source)
    path = config(
        tmp_path, '"net.py"', "trap38_sized_net", more=", layers = 3", rest="[setup]\nlr = 0.5"
    )
    path.write_text(path.read_text().replace("layers = 2, layers = 3", "layers = 3"))
    prepared = prepare(load_config(path), directory=tmp_path / "run", base=tmp_path)
    [unfreeze] = [p for p in prepared.engine.table.packs.values() if isinstance(p, Unfreeze)]
    assert sorted(unfreeze.schedule) == [0, 1, 2, 3], unfreeze.schedule
    assert prepared.built.setup_options == {"lr": 0.5}
    prepared.run()
    assert prepared.model.lr == 0.5


# -- a config's unknown model option: refused, as on --set -------------------------------------


def test_a_configs_unknown_model_option_is_refused_with_a_did_you_mean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path, "net.py", model_file("trap38_typo_net"))
    path = config(tmp_path, '"net.py"', "trap38_typo_net", more=", layres = 3")
    assert main(["run", str(path), "--runs-dir", str(tmp_path / "runs"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "declares no init option 'layres' (did you mean 'layers'?)" in err, err
    assert not (tmp_path / "runs").exists()


# -- a file whose run is set up under __main__: a script for every command ---------------------

TRAIN_SCRIPT = f"""\
{NET}

if __name__ == "__main__":
    engine = runmodel.Engine()
    engine.attach(GradClip(0.5))
    engine.run(Net(), epochs=1)
"""


def test_describe_runs_a_file_set_up_under_main_as_a_script(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train = write(tmp_path, "train.py", TRAIN_SCRIPT)
    assert main(["describe", str(train)]) == 0
    assert "grad_clip" in capsys.readouterr().out  # the __main__ block's pack is there

    assert main(["describe", f"{train}:Net"]) == 0  # named: a model source, and said so
    captured = capsys.readouterr()
    assert "grad_clip" not in captured.out
    assert '`if __name__ == "__main__":` block of' in captured.err, captured.err

    assert main(["run", str(train), "--runs-dir", str(tmp_path / "runs")]) == 2
    assert f"run it with `python {train}`" in capsys.readouterr().err


# -- the sweep's probe ---------------------------------------------------------------------------


def test_the_sweeps_probe_accepts_a_best_checkpoint_beside_evaluate(tmp_path: Path) -> None:
    pytest.importorskip("optuna")
    from runmodel.sweeps.probe import check_metric
    from runmodel.sweeps.spec import read_spec

    write(tmp_path, "net.py", model_file("trap38_swept_net", "Evaluate()"))
    rest = (
        '[[packs]]\ntype = "checkpoint"\nargs = { best = ["eval_accuracy", "max"] }\n'
        '[sweep]\nmetric = "eval_accuracy"\ndirection = "max"\ntrials = 1\n'
        '[sweep.params]\n"model.args.layers" = { choice = [1, 2] }'
    )
    path = config(tmp_path, '"net.py"', "trap38_swept_net", rest=rest)
    check_metric(read_spec(path))  # no "no metric 'eval_accuracy' ... at epoch 0, step 0"


# -- export: setup's options, the same weights as eval, said -----------------------------------


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A config run of three epochs whose best checkpoint (by the highest eval loss:
    the first epoch's) is not its last."""
    folder = tmp_path_factory.mktemp("traps38")
    write(folder, "net.py", model_file("trap38_net", "Evaluate()"))
    rest = '[[packs]]\ntype = "checkpoint"\nargs = { keep = 1, best = ["eval_loss", "max"] }'
    path = config(folder, '"net.py"', "trap38_net", epochs=3, rest=rest)
    assert main(["run", str(path), "--runs-dir", str(folder / "runs"), "--no-progress"]) == 0
    [found] = (folder / "runs").iterdir()
    return found


def test_export_pt2_gives_setup_its_resolved_options(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "net.pt2"
    assert main(["export", str(run_dir), str(out), "--format", "pt2"]) == 0, capsys.readouterr()
    assert torch.export.load(out).module()(torch.zeros(2, 4)).shape == (2, 3)


def test_export_and_eval_take_the_best_checkpoint_and_say_so(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    [best] = run_dir.glob("checkpoint/best-*.pt")
    out = tmp_path / "net.pt"
    assert main(["export", str(run_dir), str(out)]) == 0
    line = capsys.readouterr().err.splitlines()[-1]
    assert best.name in line and line.endswith("(the best checkpoint)"), line
    exported, kept = torch.load(out, weights_only=True), model_state(best)["module"]
    assert all(torch.equal(exported[k], kept[k]) for k in kept)

    assert main(["eval", str(run_dir)]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "runmodel eval:" in line]
    assert said and "at its best checkpoint, with " in said[0] and best.name in said[0], said

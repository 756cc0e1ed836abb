"""``runmodel export RUN_DIR OUT --format pt2|onnx``: the digits model of a config run (one
epoch, with an EMA pack) exported through torch.export and torch.onnx (dynamo), each
checked against the module on a batch; a PATH that is no run folder, and a missing ONNX
extra, are one line and exit 2; ``--averaged`` exports the EMA's weights."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from runmodel.checkpoint.export import averaged_weights
from runmodel.cli import main
from runmodel.runs.weights import choose_weights

ROOT = Path(__file__).resolve().parents[2]
CONFIG = f'''\
imports = ["{ROOT / "examples" / "digits.py"}"]
epochs = 1
seed = 0
device = "cpu"

[model]
type = "digits"
args = {{ hidden = 32 }}

[[packs]]
type = "checkpoint"

[[packs]]
type = "ema"
args = {{ decay = 0.9 }}
'''
ONNX_MISSING = [
    name for name in ("onnx", "onnxscript", "onnxruntime") if importlib.util.find_spec(name) is None
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A config run of examples/digits.py, cut to one epoch, with an EMA pack."""
    folder = tmp_path_factory.mktemp("export")
    (folder / "digits.toml").write_text(CONFIG)
    assert (
        main(
            [
                "run",
                str(folder / "digits.toml"),
                "--runs-dir",
                str(folder / "runs"),
                "--no-progress",
            ]
        )
        == 0
    )
    [found] = (folder / "runs").iterdir()
    return found


def digits_module(run_dir: Path) -> tuple[torch.nn.Module, torch.Tensor]:
    """The run's module with its checkpoint's weights, and a batch of its test data."""
    import sys

    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from digits import Digits, digits_split
    finally:
        sys.path.remove(str(ROOT / "examples"))
    model = Digits(device="cpu", init_options={"hidden": 32, "seed": 0})
    weights = torch.load(choose_weights(run_dir), weights_only=True)
    model.module.load_state_dict(weights["model"]["module"])
    _, test = digits_split(0)
    return model.module.eval(), test.tensors[0][:37]


def check_line(stderr: str, fmt: str) -> str:
    [line] = [line for line in stderr.splitlines() if line.startswith("checked:")]
    assert "batches of 256 and 128 match the module's (torch.testing.assert_close" in line
    assert "exported " in stderr and f" as {fmt} to " in stderr
    return line


def test_pt2_export_of_the_digits_run_matches_the_module(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "digits.pt2"
    assert main(["export", str(run_dir), str(out), "--format", "pt2"]) == 0
    check_line(capsys.readouterr().err, "pt2")
    program = torch.export.load(out).module()
    module, batch = digits_module(run_dir)
    with torch.no_grad():  # another batch size than the example's: the batch is dynamic
        torch.testing.assert_close(program(batch), module(batch))
        assert program(batch[:5]).shape == (5, 10)


@pytest.mark.skipif(
    bool(ONNX_MISSING),
    reason=f"the onnx extra is not installed (no "
    f"{', '.join(ONNX_MISSING)}): pip install 'runmodel[onnx]'",
)
def test_onnx_export_of_the_digits_run_matches_the_module(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import onnxruntime

    out = tmp_path / "digits.onnx"
    assert main(["export", str(run_dir), str(out), "--format", "onnx"]) == 0
    check_line(capsys.readouterr().err, "onnx")
    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    module, batch = digits_module(run_dir)
    [name] = [i.name for i in session.get_inputs()]
    [logits] = session.run(None, {name: batch.numpy()})
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(logits), module(batch), rtol=1e-4, atol=1e-5)


def test_a_missing_onnx_extra_is_one_line_saying_what_to_install(
    run_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(__import__("sys").modules, "onnxruntime", None)  # as if not installed
    assert main(["export", str(run_dir), str(tmp_path / "m.onnx"), "--format", "onnx"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("runmodel export: error: runmodel export --format onnx needs ")
    assert "pip install 'runmodel[onnx]'" in err and "Traceback" not in err
    assert not (tmp_path / "m.onnx").exists()


def test_a_program_needs_a_run_folder(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = choose_weights(run_dir)
    assert main(["export", str(checkpoint), str(tmp_path / "m.pt2"), "--format", "pt2"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line == (
        f"runmodel export: error: --format pt2 exports a run's model, made as the "
        f"run's config, model source or script makes it: PATH must be a run "
        f"folder, and {checkpoint} is not one (a checkpoint alone holds weights; "
        f"--format state_dict exports those)"
    )
    # the state dict stays the default, for any checkpoint
    assert main(["export", str(checkpoint), str(tmp_path / "m.pt")]) == 0
    assert set(torch.load(tmp_path / "m.pt", weights_only=True)) == {
        "1.weight",
        "1.bias",
        "3.weight",
        "3.bias",
    }


def test_averaged_exports_the_ema_weights(run_dir: Path, tmp_path: Path) -> None:
    checkpoint = choose_weights(run_dir)
    assert main(["export", str(checkpoint), str(tmp_path / "ema.pt"), "--averaged"]) == 0
    exported = torch.load(tmp_path / "ema.pt", weights_only=True)
    ema = averaged_weights(checkpoint)
    plain = torch.load(checkpoint, weights_only=True)["model"]["module"]
    assert all(torch.equal(exported[k], ema[k]) for k in ema)
    assert not torch.equal(exported["1.weight"], plain["1.weight"])
    # and as a program: the averaged weights are the ones exported
    out = tmp_path / "ema.pt2"
    assert main(["export", str(run_dir), str(out), "--format", "pt2", "--averaged"]) == 0
    module, batch = digits_module(run_dir)
    module.load_state_dict(ema)
    with torch.no_grad():
        torch.testing.assert_close(torch.export.load(out).module()(batch), module(batch))
    assert json.loads((run_dir / "status.json").read_text())["status"] == "finished"


def test_eval_averaged_evaluates_the_ema_weights(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``runmodel eval RUN_DIR --averaged``: the EMA's weights, recorded apart in eval.json;
    a run without an average says so in one line."""
    assert main(["eval", str(run_dir), "--averaged", "--json"]) == 0
    assert main(["eval", str(run_dir), "--json"]) == 0
    evaluated = json.loads((run_dir / "eval.json").read_text())
    [plain] = [key for key in evaluated if not key.endswith(" (averaged)")]
    averaged = evaluated[f"{plain} (averaged)"]["metrics"]
    assert averaged["loss"] != evaluated[plain]["metrics"]["loss"]
    module, _ = digits_module(run_dir)
    module.load_state_dict(averaged_weights(choose_weights(run_dir)))
    import sys

    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from digits import digits_split
    finally:
        sys.path.remove(str(ROOT / "examples"))
    x, y = digits_split(0)[1].tensors
    with torch.no_grad():
        loss = torch.nn.functional.cross_entropy(module(x), y).item()
    assert averaged["loss"] == pytest.approx(loss, rel=1e-5)
    capsys.readouterr()

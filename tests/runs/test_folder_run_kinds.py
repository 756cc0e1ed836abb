"""A run in a derived folder is one thing whatever started it (``runs/folder_run.py``): a
config's run, a model source's train run and a sweep's trial leave folders with the same
files, the same status keys, and their parameters on TensorBoard's HParams dashboard.

One run of each kind, of the digits example for one epoch: the config run and the model
source's run in this process, the trial in a real ``runmodel sweep``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from runmodel.cli import main
from runmodel.config.runconfig import load_config
from runmodel.runs import execute
from runmodel.runs.source_run import IDENTITY
from runmodel.runs.table import flatten

import warm as subprocess

pytest.importorskip("sklearn", reason="the digits example needs scikit-learn")
pytest.importorskip("optuna", reason="a sweep's trial needs optuna")

DIGITS = Path(__file__).resolve().parents[2] / "examples" / "digits.py"
CONFIG = f"""imports = [{json.dumps(str(DIGITS))}]
epochs = 1
seed = 0
[model]
type = "digits"
args = {{ hidden = 32 }}
[optimizer]
type = "adam"
args = {{ lr = 0.005 }}
"""
SWEEP = """[sweep]
metric = "eval_accuracy"
trials = 1
[sweep.params]
"optimizer.args.lr" = { choice = [0.005] }
"""


def files(folder: Path) -> set[str]:
    """The folder's files, relative, an event file by its folder (its name has a time)."""
    found = set()
    for path in folder.rglob("*"):
        if path.is_file():
            name = str(path.relative_to(folder))
            found.add(str(path.parent.relative_to(folder)) if ".tfevents." in name else name)
    return found


def hparams(folder: Path) -> dict[str, Any]:
    """The HParams the run's TensorBoard events hold."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    events = EventAccumulator(str(folder / "tensorboard"))
    events.Reload()
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    start = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    return {key: value.WhichOneof("kind") for key, value in start.hparams.items()}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One folder of each kind."""
    root = tmp_path_factory.mktemp("kinds")
    (root / "digits.toml").write_text(CONFIG)
    (root / "search.toml").write_text(CONFIG + SWEEP)
    # the sweep's processes run beside this one's two runs (two cores, seconds of imports)
    sweep = subprocess.Popen(
        [sys.executable, "-m", "runmodel", "sweep", "search.toml", "--runs-dir", "sweeps"],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        config_run, source_run = _runs_here(root)
        out, err = sweep.communicate(timeout=600)
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.wait()
    assert sweep.returncode == 0, out + err
    (trial,) = (p.parent for p in (root / "sweeps" / "search").glob("*/config.json"))
    return {"config": config_run, "source": source_run, "trial": trial}


def _runs_here(root: Path) -> tuple[Path, Path]:
    """The config run and the model source's run, in this process."""
    _, config_run = execute(
        load_config(root / "digits.toml"), root / "config", base=root, progress=False
    )
    here = os.getcwd()
    os.chdir(root)
    try:
        code = main(["run", str(DIGITS), "--epochs", "1", "--set", "hidden=32", "--no-progress"])
    finally:
        os.chdir(here)
    assert code == 0
    (source_run,) = (p.parent for p in (root / "runs").glob("*/run.json"))
    return config_run, source_run


def test_every_kind_leaves_the_same_files(folders: dict[str, Path]) -> None:
    found = {kind: files(folder) for kind, folder in folders.items()}
    assert found["config"] == found["trial"]
    # a config's own file is its canonical config; the rest is every run folder's
    assert found["config"] - found["source"] == {"config.json"}
    assert found["source"] <= found["config"]
    assert {"run.json", "status.json", "metrics.json", "run.log", "model.pt"} <= found["source"]


def test_every_kind_records_the_same_status_and_result_keys(folders: dict[str, Path]) -> None:
    status = {k: set(json.loads((f / "status.json").read_text())) for k, f in folders.items()}
    assert status["config"] == status["source"] == status["trial"]
    metrics = {k: json.loads((f / "metrics.json").read_text()) for k, f in folders.items()}
    assert {k: set(m) for k, m in metrics.items()} == {k: set(metrics["config"]) for k in metrics}
    assert {k: set(m["metrics"]) for k, m in metrics.items()} == {
        k: {"loss", "eval_accuracy", "eval_loss"} for k in metrics
    }
    assert {
        k: json.loads((f / "status.json").read_text())["status"] for k, f in folders.items()
    } == {k: "finished" for k in folders}


def test_every_kind_puts_what_makes_it_on_the_hparams_dashboard(folders: dict[str, Path]) -> None:
    """What makes the run, as its record or config says (values that are not numbers,
    strings or booleans, such as a missing backend, have no place on the dashboard)."""

    def scalars(data: dict[str, Any]) -> set[str]:
        return {k for k, v in flatten(data).items() if isinstance(v, (bool, int, float, str))}

    for kind in ("config", "trial"):
        config = json.loads((folders[kind] / "config.json").read_text())
        assert set(hparams(folders[kind])) == scalars(config)
    record = json.loads((folders["source"] / "run.json").read_text())
    identity = {key: record[key] for key in IDENTITY}
    assert set(hparams(folders["source"])) == scalars(identity)
    assert {"source", "model", "init_options.hidden", "seed", "epochs"} <= scalars(identity)

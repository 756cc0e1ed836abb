"""``runmodel sweep``: real config runs of the digits model, one or two epochs per trial,
each trial in its own process; the study read back from Optuna's journal file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")

import runmodel  # noqa: E402
from runmodel.cli import main  # noqa: E402
from runmodel.config.runconfig import load_config  # noqa: E402

from helpers import finish_group  # noqa: E402

DIGITS = Path(__file__).resolve().parent.parent / "examples" / "digits.py"


def write_config(folder: Path, sweep: str, epochs: int = 1) -> Path:
    path = folder / "search.toml"
    path.write_text(f"""imports = [{json.dumps(str(DIGITS))}]
epochs = {epochs}
seed = 0
[model]
type = "digits"
args = {{ hidden = 32 }}
[optimizer]
type = "adam"
args = {{ lr = 0.005 }}
{sweep}""")
    return path


TWO_PARAMS = """[sweep]
metric = "eval_accuracy"
trials = 4
[sweep.params]
"optimizer.args.lr" = { log_uniform = [1e-3, 3e-2] }
"model.args.hidden" = { int = [16, 96] }
"""


def trials(folder: Path) -> list[optuna.trial.FrozenTrial]:
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    storage = JournalStorage(JournalFileBackend(str(folder / "study.journal")))
    return optuna.load_study(study_name=folder.name, storage=storage).trials


def run_folders(folder: Path) -> list[Path]:
    return sorted(p.parent for p in folder.glob("*/config.json"))


def command(*args: str, cwd: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "runmodel", *args], cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "OMP_NUM_THREADS": "1", **env},
                            start_new_session=True)  # killed with its trials


def finish(process: subprocess.Popen[str]) -> tuple[str, str]:
    return finish_group(process, 300)


def test_two_jobs_finish_exactly_the_trials_asked_for_and_the_runs_compare(
        tmp_path: Path) -> None:
    config = write_config(tmp_path, TWO_PARAMS)
    process = command("sweep", str(config), "--jobs", "2", cwd=tmp_path)
    out, err = finish(process)
    assert process.returncode == 0, out + err
    folder = tmp_path / "runs" / "search"
    study = trials(folder)
    assert [t.state.name for t in study] == ["COMPLETE"] * 4  # none lost, none extra
    folders = run_folders(folder)
    assert len(folders) == 4
    values = {}
    for run in folders:
        metrics = json.loads((run / "metrics.json").read_text())["metrics"]
        values[run.name] = metrics["eval_accuracy"]
    assert sorted(t.value for t in study) == sorted(values.values())
    summary = json.loads((folder / "sweep.json").read_text())
    assert summary["best"]["value"] == max(values.values())
    assert Path(summary["best"]["run_dir"]).name == max(values, key=values.__getitem__)
    # listed best first, the swept values as columns
    listed = subprocess.run([sys.executable, "-m", "runmodel", "runs", str(folder)],
                            capture_output=True, text=True, check=True).stdout.splitlines()
    assert "model.args.hidden" in listed[0] and "optimizer.args.lr" in listed[0]
    shown = [line.split()[0] for line in listed[2:]]
    assert shown == sorted(values, key=lambda name: -values[name])
    # each trial on TensorBoard's HParams dashboard, in the run's own event folder
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    best = Path(summary["best"]["run_dir"])
    events = EventAccumulator(str(tmp_path / best / "tensorboard"))
    events.Reload()
    from tensorboard.plugins.hparams import plugin_data_pb2

    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    start = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    assert start.hparams["model.args.hidden"].number_value == summary["best"]["params"][
        "model.args.hidden"]
    assert [p.name for p in (tmp_path / best / "tensorboard").iterdir() if p.is_dir()] == []
    plotted = subprocess.run([sys.executable, "-m", "runmodel", "plot", str(folder), "-o",
                              str(tmp_path / "sweep.png")], capture_output=True, text=True)
    assert plotted.returncode == 0, plotted.stderr
    assert (tmp_path / "sweep.png").stat().st_size > 10_000


# A pack that holds the second trial of a sweep at its second epoch's start (its first
# epoch saved), where the test kills the sweep: no race with the trial's own pace.
GATE = """
import os, time
import runmodel

class Gate(runmodel.Pack):
    name = "gate"

    @runmodel.hook("epoch_start")
    def hold(self, engine):
        path = os.environ.get("GATE")
        if path and engine.state.epoch == 1:
            with open(path, "a") as file:
                file.write("here\\n")
            with open(path) as file:
                if len(file.readlines()) >= 2:
                    time.sleep(600)

runmodel.register_pack("gate", Gate)
"""


def test_a_sweep_killed_mid_trial_resumes_that_trial_and_ends_with_exactly_the_trials(
        tmp_path: Path) -> None:
    (tmp_path / "gate.py").write_text(GATE)
    config = write_config(tmp_path, TWO_PARAMS.replace("[sweep]", "[[packs]]\ntype = "
                                                       "\"gate\"\n[sweep]"), epochs=2)
    config.write_text(config.read_text().replace("imports = [", "imports = [\"gate.py\", "))
    folder, gate = tmp_path / "runs" / "search", tmp_path / "gate.txt"
    process = command("sweep", str(config), cwd=tmp_path, GATE=str(gate))
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not (  # the second trial saved its first epoch
            gate.exists() and len(gate.read_text().splitlines()) >= 2):
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    finish(process)
    assert sum(1 for run in run_folders(folder) if any(run.glob("checkpoint/*.pt"))) == 2
    killed = trials(folder)
    assert [t.state.name for t in killed] == ["COMPLETE", "RUNNING"]
    again = command("sweep", str(config), cwd=tmp_path)
    out, err = finish(again)
    assert again.returncode == 0, out + err
    study = trials(folder)
    assert [t.state.name for t in study] == ["COMPLETE"] * 4
    assert len(run_folders(folder)) == 4  # the killed trial resumed, not duplicated
    assert "resuming from" in (folder / "trial-0001.log").read_text()


PRUNING = """[sweep]
metric = "eval_accuracy"
trials = 4
sampler = { type = "random" }
pruner = { type = "median", args = { n_startup_trials = 2 } }
seed = 2  # the random sampler draws: good, good, hopeless, hopeless
[sweep.params]
"optimizer.args.lr" = { choice = [0.01, 1e-7] }
"model.args.hidden" = { int = [16, 96] }
"""


def test_a_pruner_stops_trials_in_a_hopeless_region_and_marks_them(tmp_path: Path) -> None:
    assert callable(runmodel.sweep) and runmodel.sweeps.__name__ == "runmodel.sweeps"
    config = write_config(tmp_path, PRUNING, epochs=2)
    result = runmodel.sweep(config, runs_dir=tmp_path / "runs", echo=False)
    study = trials(result.directory)
    pruned = [t for t in study if t.state.name == "PRUNED"]
    assert pruned and all(t.params["optimizer.args.lr"] == 1e-7 for t in pruned)
    assert result.complete + result.pruned == 4 and result.pruned == len(pruned)
    for trial in pruned:  # stopped after its first epoch, and shown as pruned
        run = Path(trial.user_attrs["run_dir"])
        assert json.loads((run / "status.json").read_text())["status"] == "pruned"
        assert json.loads((run / "metrics.json").read_text())["epochs"] == 1
    listed = subprocess.run([sys.executable, "-m", "runmodel", "runs", str(tmp_path / "runs")],
                            capture_output=True, text=True, check=True).stdout
    assert listed.count(" pruned ") == len(pruned)


@pytest.mark.parametrize(("given", "expected"), [
    (["--param", "model.args.hiden={int = [16, 64]}"], "no option 'hiden' (did you mean "
                                                      "'hidden'?)"),
    (["--param", "optimizer.args.lrr={uniform = [0.1, 0.2]}"], "(did you mean 'lr'?)"),
    (["--param", "epoch={int = [1, 3]}"], "unknown key 'epoch' (did you mean 'epochs'?)"),
    (["--param", "epochs={int = [3, 3]}"], "is empty: LOW must be below HIGH"),
    (["--param", "optimizer.args.lr={uniform = [0.1, 0.01]}"], "is inverted"),
    (["--param", "model.args.hidden={choice = []}"], "choice needs a non-empty list"),
    (["--param", "epochs={int = [1, 3]}", "--trials", "0"], "trials is a whole number >= 1"),
    (["--param", "epochs=[1, 3]"], "a space is {uniform = [LOW, HIGH]}"),
    ([], "a sweep needs parameters to search"),
    (["--param", "epochs={int = [1, 3]}", "--metric", "eval_acuracy"],
     "metric 'eval_acuracy': the config's run does not produce it (did you mean "
     "'eval_accuracy'?)"),
    (["--param", "epochs={int = [1, 3]}", "--metric", "f1"],
     "it produces: eval_accuracy, eval_loss, loss."),
])
def test_bad_input_exits_2_before_any_trial_creating_nothing(
        tmp_path: Path, given: list[str], expected: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path, '[sweep]\nmetric = "eval_accuracy"\n')
    code = main(["sweep", str(config), "--runs-dir", str(tmp_path / "runs"), *given])
    err = capsys.readouterr().err
    assert code == 2 and expected in err, err
    assert err.count("error") == 1 and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_run_on_a_config_with_a_sweep_table_runs_the_base_config(tmp_path: Path) -> None:
    with_table = load_config(write_config(tmp_path, TWO_PARAMS))
    without = load_config(write_config(tmp_path, ""))
    assert with_table == without and with_table.run_name() == without.run_name()


def test_trials_failing_in_a_row_stop_the_sweep_with_the_last_error(tmp_path: Path) -> None:
    config = write_config(tmp_path, """[sweep]
metric = "eval_accuracy"
trials = 5
[sweep.params]
"model.args.hidden" = { int = [-9, -1] }
""")
    process = command("sweep", str(config), cwd=tmp_path)
    out, err = finish(process)
    assert process.returncode == 1, out + err
    assert "3 trials failed in a row; the last: ValueError: init option 'hidden' must be at " \
           "least 1" in err, err
    assert [t.state.name for t in trials(tmp_path / "runs" / "search")] == ["FAIL"] * 3

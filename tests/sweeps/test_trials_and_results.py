"""``runmodel sweep``: real config runs of a small classifier (``clusters.py``), one or
two epochs per trial, each trial in its own process; the study read back from Optuna's
journal file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("optuna")

from sweeping import (
    TWO_PARAMS,
    command,
    finish,
    run_folders,
    states,
    trials,
    write_config,
)

import runmodel
from runmodel.cli import main
from runmodel.config.runconfig import load_config


def test_two_jobs_finish_exactly_the_trials_asked_for_and_the_runs_compare(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_config(tmp_path, TWO_PARAMS)  # 3 trials: an odd one for 2 jobs
    process = command("sweep", str(config), "--jobs", "2", cwd=tmp_path)
    out, err = finish(process)
    assert process.returncode == 0, out + err
    folder = tmp_path / "runs" / "search"
    study = trials(folder)
    assert [t.state.name for t in study] == ["COMPLETE"] * 3  # none lost, none extra
    folders = run_folders(folder)
    assert len(folders) == 3
    values = {}
    for run in folders:
        metrics = json.loads((run / "metrics.json").read_text())["metrics"]
        values[run.name] = metrics["eval_accuracy"]
    assert sorted(t.value for t in study) == sorted(values.values())
    summary = json.loads((folder / "sweep.json").read_text())
    assert summary["best"]["value"] == max(values.values())
    assert Path(summary["best"]["run_dir"]).name == max(values, key=values.__getitem__)
    # listed best first, the swept values as columns; not to a terminal and without
    # COLUMNS, so whole (the listing and the plot run in this process: they import no more)
    monkeypatch.delenv("COLUMNS", raising=False)
    capsys.readouterr()
    assert main(["runs", str(folder)]) == 0
    listed = capsys.readouterr().out.splitlines()
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
    assert (
        start.hparams["model.args.hidden"].number_value
        == summary["best"]["params"]["model.args.hidden"]
    )
    assert [p.name for p in (tmp_path / best / "tensorboard").iterdir() if p.is_dir()] == []
    plotted = main(["plot", str(folder), "-o", str(tmp_path / "sweep.png")])
    assert plotted == 0, capsys.readouterr().err
    assert (tmp_path / "sweep.png").stat().st_size > 10_000


PRUNING = """[sweep]
metric = "eval_accuracy"
trials = 3
sampler = { type = "random" }
pruner = { type = "median", args = { n_startup_trials = 2 } }
seed = 2  # the random sampler draws: good, good, hopeless
[sweep.params]
"optimizer.args.lr" = { choice = [0.01, 1e-7] }
"model.args.hidden" = { int = [16, 96] }
"""


def test_a_pruner_stops_trials_in_a_hopeless_region_and_marks_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert callable(runmodel.sweep) and runmodel.sweeps.__name__ == "runmodel.sweeps"
    config = write_config(tmp_path, PRUNING, epochs=2)
    result = runmodel.sweep(config, runs_dir=tmp_path / "runs", echo=False)
    study = trials(result.directory)
    pruned = [t for t in study if t.state.name == "PRUNED"]
    assert pruned and all(t.params["optimizer.args.lr"] == 1e-7 for t in pruned)
    assert result.complete + result.pruned == 3 and result.pruned == len(pruned)
    for trial in pruned:  # stopped after its first epoch, and shown as pruned
        run = Path(trial.user_attrs["run_dir"])
        assert json.loads((run / "status.json").read_text())["status"] == "pruned"
        assert json.loads((run / "metrics.json").read_text())["epochs"] == 1
    monkeypatch.delenv("COLUMNS", raising=False)  # whole rows
    capsys.readouterr()
    assert main(["runs", str(tmp_path / "runs")]) == 0
    assert capsys.readouterr().out.count(" pruned ") == len(pruned)


def test_run_on_a_config_with_a_sweep_table_runs_the_base_config(tmp_path: Path) -> None:
    with_table = load_config(write_config(tmp_path, TWO_PARAMS))
    without = load_config(write_config(tmp_path, ""))
    assert with_table == without and with_table.run_name() == without.run_name()


def test_trials_failing_in_a_row_stop_the_sweep_with_the_last_error(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        """[sweep]
metric = "eval_accuracy"
trials = 5
[sweep.params]
"model.args.hidden" = { int = [-9, -1] }
""",
    )
    process = command("sweep", str(config), cwd=tmp_path)
    out, err = finish(process)
    assert process.returncode == 1, out + err
    assert (
        "3 trials failed in a row; the last: ValueError: init option 'hidden' must be at "
        "least 1" in err
    ), err
    assert states(tmp_path / "runs" / "search") == ["FAIL"] * 3

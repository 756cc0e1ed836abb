"""A run as one thing (issue 18): its folder, the rules of a checkpoint or run folder, its
continuation and extension, and its evaluation, from a script and from the command line.

The command-line and script tests run real processes (``python script.py``, ``python -m
runmodel``) on the digits example; each module-scoped fixture runs its processes once and
the tests read what they left. The rules that need no process of their own run here, on
the small models of helpers.py.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import runmodel
from runmodel.packs import Checkpoint
from runmodel.runs import list_runs

import warm as subprocess
from helpers import RUN_FOLDER, dropout_mlp, train_with_checkpoints

ROOT = Path(__file__).resolve().parents[2]
DIGITS_CONFIG = ROOT / "examples" / "configs" / "digits.toml"
TIMEOUT = 180
ENV = {
    **os.environ,
    "PYTHONIOENCODING": "utf-8",
    "OMP_NUM_THREADS": "1",
    "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
}
RUNMODEL = (sys.executable, "-m", "runmodel")

pytest.importorskip("sklearn", reason="the digits example needs scikit-learn")

#: A training script, not a model source (its model comes from the digits example):
#: ``python train.py EPOCHS RUN_DIR [HIDDEN]``. With RUNMODEL_TEST_HOLD=FILE, its setup
#: waits until FILE exists (a live run for a second process to meet).
SCRIPT = f"""\
import json, os, sys, time
from pathlib import Path
sys.path.insert(0, {str(ROOT / "examples")!r})
import runmodel
from runmodel.packs import Checkpoint, Evaluate
from digits import Digits

epochs, run_dir = int(sys.argv[1]), sys.argv[2]
hidden = int(sys.argv[3]) if len(sys.argv) > 3 else 32
engine = runmodel.Engine()
engine.attach(Checkpoint("checkpoint", best=("eval_accuracy", "max")), Evaluate())
steps = []
engine.on("runstep", lambda e: steps.append(e.state.step))
hold = os.environ.get("RUNMODEL_TEST_HOLD")
if hold:
    @engine.on("setup")
    def wait(engine):
        Path(hold + ".started").write_text(str(os.getpid()))
        while not Path(hold).exists():
            time.sleep(0.05)
try:
    result = engine.run(Digits(init_options={{"hidden": hidden}}), epochs=epochs,
                        run_dir=run_dir, resume=os.environ.get("RESUME") or None)
finally:
    print("steps run:", len(steps))
print(json.dumps({{"metrics": result.metrics, "files": result.files}}))
"""


def start(*command: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``command`` started; ``ended`` awaits it. Commands that touch nothing of each
    other's run side by side: the machine has two cores, and each process spends seconds
    importing torch."""
    return subprocess.Popen(
        command,
        cwd=cwd,
        env=env or ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def ended(process: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
    try:
        out, err = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def run(
    *command: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return ended(start(*command, cwd=cwd, env=env))


def snapshot(directory: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``directory``: size and modification time."""
    return {
        str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


# -- a script run: its folder and the rules ----------------------------------------------------


@pytest.fixture(scope="module")
def script_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A script run with run_dir, met while it runs by a second process; then a fresh
    run and a mismatched model into its folder; then the command line on it."""
    cwd = tmp_path_factory.mktemp("script")
    (cwd / "train.py").write_text(SCRIPT)
    seen: dict[str, Any] = {"cwd": cwd, "run_dir": cwd / "runs" / "digits"}
    # its own folder (runs/other) only, and stopped at the script's engine.run
    describe = start(*RUNMODEL, "describe", "train.py", "2", "runs/other", cwd=cwd)
    hold = cwd / "hold"
    first = subprocess.Popen(
        [sys.executable, "train.py", "2", "runs/digits"],
        cwd=cwd,
        env={**ENV, "RUNMODEL_TEST_HOLD": str(hold)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + TIMEOUT
        while not Path(f"{hold}.started").exists():
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.05)
        seen["first_pid"] = first.pid
        seen["while_running"] = run(sys.executable, "train.py", "2", "runs/digits", cwd=cwd)
        hold.write_text("go")
        seen["first"] = first.communicate(timeout=TIMEOUT)
        seen["first_rc"] = first.returncode
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    run_dir = seen["run_dir"]
    seen["files"] = snapshot(run_dir)
    seen["again"] = run(sys.executable, "train.py", "2", "runs/digits", cwd=cwd)
    seen["wider"] = run(
        sys.executable, "train.py", "2", "runs/digits", "48", cwd=cwd, env={**ENV, "RESUME": "auto"}
    )
    seen["files_after"] = snapshot(run_dir)
    evaluate = start(*RUNMODEL, "eval", "runs/digits", "--json", cwd=cwd)  # eval.json alone
    seen["runs"] = run(*RUNMODEL, "runs", "runs", cwd=cwd)
    (cwd / "runs" / "profile-x").mkdir()  # a folder that is no run, among the glob's
    seen["plot"] = run(
        *RUNMODEL, "plot", "runs/digits", "runs/profile-x", "-o", "plot.png", cwd=cwd
    )
    seen["eval"] = ended(evaluate)
    seen["describe"] = ended(describe)
    yield seen


def test_a_script_run_gets_a_run_folder(script_run: dict[str, Any]) -> None:
    assert script_run["first_rc"] == 0, script_run["first"][1]
    result = json.loads(script_run["first"][0].splitlines()[-1])
    run_dir: Path = script_run["run_dir"]
    held = sorted({name.split("/")[0] for name in script_run["files"]})
    assert held == RUN_FOLDER
    record = json.loads((run_dir / "run.json").read_text())
    assert record["script"] == str(script_run["cwd"] / "train.py")
    assert record["argv"] == ["2", "runs/digits"] and record["cwd"] == str(script_run["cwd"])
    assert record["epochs"] == 2 and record["packs"]["checkpoint"] == "Checkpoint"
    assert set(record["versions"]) == {"python", "torch", "runmodel"}
    status = json.loads((run_dir / "status.json").read_text())
    assert status["status"] == "finished" and status["run"] == record["id"]
    # best and last: public, in the result and the status (named inside the folder there);
    # relative folders inside run_dir
    assert {k: str(run_dir / v) for k, v in status["files"].items()} == {
        k: str(script_run["cwd"] / v) for k, v in result["files"].items()
    }
    assert Path(result["files"]["best_checkpoint"]).parent == Path("runs/digits/checkpoint")
    assert Path(result["files"]["last_checkpoint"]).name == "ckpt-00002-0000000046.pt"
    saved = torch.load(script_run["cwd"] / result["files"]["last_checkpoint"], weights_only=True)
    assert saved["engine"]["run"]["id"] == record["id"]  # every checkpoint names its run


def test_a_second_process_stops_naming_the_live_ones_pid(script_run: dict[str, Any]) -> None:
    second = script_run["while_running"]
    assert second.returncode != 0
    assert f"is the folder of a run that is running now (pid {script_run['first_pid']}" in (
        second.stderr
    )
    assert "steps run: 0" in second.stdout  # refused before the run began


def test_a_second_run_into_the_folder_stops_at_setup_changing_nothing(
    script_run: dict[str, Any],
) -> None:
    again = script_run["again"]
    assert again.returncode != 0
    last = again.stderr.strip().splitlines()[-1]
    assert "runs/digits holds a run already" in last and 'resume="auto"' in last, last
    assert "another run_dir" in last
    assert "steps run: 0" in again.stdout
    assert script_run["files_after"] == script_run["files"]  # sizes and mtimes


def test_a_mismatched_model_names_the_parameter_and_both_shapes(script_run: dict[str, Any]) -> None:
    wider = script_run["wider"]
    assert wider.returncode != 0
    assert (
        "the first parameter that differs is 1.weight: checkpoint (32, 64), Digits (48, 64)"
    ) in wider.stderr, wider.stderr
    assert "steps run: 0" in wider.stdout


def test_the_cli_lists_plots_evaluates_and_describes_a_script_run(
    script_run: dict[str, Any],
) -> None:
    cwd, run_dir = script_run["cwd"], script_run["run_dir"]
    listed = script_run["runs"]
    assert listed.returncode == 0, listed.stderr
    [row] = [line for line in listed.stdout.splitlines() if line.startswith("digits ")]
    assert row.split()[:2] == ["digits", "finished"] and "46" in row.split()
    plotted = script_run["plot"]
    assert plotted.returncode == 0, plotted.stderr
    assert (cwd / "plot.png").stat().st_size > 0
    assert plotted.stderr.count("skipping") == 1 and "profile-x" in plotted.stderr
    evaluated = script_run["eval"]
    assert evaluated.returncode == 0, evaluated.stderr
    result = json.loads(evaluated.stdout[evaluated.stdout.index("{") :])  # after the script's
    metrics = json.loads((run_dir / "metrics.json").read_text())
    best = json.loads((run_dir / "status.json").read_text())["files"]["best_checkpoint"]
    assert Path(best).name.startswith("best-eval_accuracy=")
    assert result["mode"] == "eval" and set(result["metrics"]) == {"loss", "accuracy"}
    assert result["metrics"]["accuracy"] == pytest.approx(
        float(Path(best).stem.split("=")[1].rsplit("-", 2)[0]), abs=1e-5
    )
    assert metrics["metrics"]["eval_accuracy"] <= result["metrics"]["accuracy"] + 1e-6
    recorded = json.loads((run_dir / "eval.json").read_text())
    assert list(recorded) == [f"checkpoint/{Path(best).name}"]
    assert sorted(p.name for p in (cwd / "runs").iterdir()) == ["digits", "profile-x"]
    described = script_run["describe"]
    assert described.returncode == 0, described.stderr
    assert "\nmodel: Digits from train.py\n" in described.stdout
    assert "checkpoint.save" in described.stdout and "evaluate" in described.stdout
    assert "steps run: 0" in described.stdout  # the script stopped at its engine.run
    assert not (cwd / "runs" / "other").exists()


# -- a config run: evaluated, then extended --------------------------------------------------


@pytest.fixture(scope="module")
def config_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    cwd = tmp_path_factory.mktemp("config")
    seen: dict[str, Any] = {"cwd": cwd}
    common = ("--runs-dir", "runs", "--no-progress", "--set", "model.args.hidden=32")
    # the straight 4-epoch run, beside the others in a folder of its own
    seen["four_cwd"] = tmp_path_factory.mktemp("config_four")
    four = start(
        *RUNMODEL, "run", str(DIGITS_CONFIG), "--epochs", "4", *common, cwd=seen["four_cwd"]
    )
    seen["two"] = run(*RUNMODEL, "run", str(DIGITS_CONFIG), "--epochs", "2", *common, cwd=cwd)
    [run_dir] = (cwd / "runs").iterdir()
    seen["run_dir"] = run_dir
    seen["reported"] = json.loads((run_dir / "metrics.json").read_text())["metrics"]
    seen["folders"] = sorted(p.name for p in cwd.rglob("*") if p.is_dir())
    seen["eval"] = run(*RUNMODEL, "eval", str(run_dir), "--json", cwd=cwd)
    seen["folders_after_eval"] = sorted(p.name for p in cwd.rglob("*") if p.is_dir())
    seen["status_before_shortened"] = (run_dir / "status.json").read_bytes()
    seen["shortened"] = run(*RUNMODEL, "resume", str(run_dir), "--epochs", "1", cwd=cwd)
    seen["status_after_shortened"] = json.loads((run_dir / "status.json").read_text())
    seen["status_bytes_after_shortened"] = (run_dir / "status.json").read_bytes()
    seen["extended"] = run(
        *RUNMODEL, "resume", str(run_dir), "--epochs", "4", "--no-progress", cwd=cwd
    )
    seen["four"] = ended(four)
    return seen


def test_a_resume_refused_at_setup_exits_2_and_leaves_the_run_as_it_was(
    config_run: dict[str, Any],
) -> None:
    shortened = config_run["shortened"]
    assert shortened.returncode == 2, shortened.stderr
    assert "error: ValueError: epochs=1, but the run did 2 epochs already" in shortened.stderr
    assert "refused at setup, before the first step" in shortened.stderr
    status = config_run["status_after_shortened"]
    assert status["status"] == "finished" and status["epochs"] == 2, status
    # left as it was, to the byte (a script's refused run leaves its folder unchanged too)
    assert config_run["status_bytes_after_shortened"] == config_run["status_before_shortened"]


def test_runmodel_eval_reports_the_accuracy_the_run_reported(config_run: dict[str, Any]) -> None:
    assert config_run["two"].returncode == 0, config_run["two"].stderr
    evaluated = config_run["eval"]
    assert evaluated.returncode == 0, evaluated.stderr
    run_dir = config_run["run_dir"]
    result = json.loads(evaluated.stdout)
    reported = config_run["reported"]["eval_accuracy"]
    assert result["metrics"]["accuracy"] == pytest.approx(reported, abs=1e-6)
    assert (
        json.loads((run_dir / "eval.json").read_text())["checkpoint/ckpt-00002-0000000046.pt"][
            "metrics"
        ]
        == result["metrics"]
    )
    assert list(result["metrics"]) == ["loss", "accuracy"]  # each metric once
    assert config_run["folders_after_eval"] == config_run["folders"]  # no new folder
    assert "eval.json" in json.dumps(result["files"])


def test_an_extended_config_run_equals_a_run_started_with_the_larger_number(
    config_run: dict[str, Any],
) -> None:
    extended = config_run["extended"]
    assert extended.returncode == 0, extended.stderr
    assert "after 92 steps, 4 epochs" in extended.stdout
    four = config_run["four"]
    assert four.returncode == 0, four.stderr
    run_dir = config_run["run_dir"]
    [straight] = (config_run["four_cwd"] / "runs").iterdir()
    assert straight.name != run_dir.name  # a config of 4 epochs is another run
    a = torch.load(run_dir / "model.pt", weights_only=True)
    b = torch.load(straight / "model.pt", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # bit-identical
    # the run's folder and config stay; it shows the epochs it has now
    assert json.loads((run_dir / "config.json").read_text())["epochs"] == 2
    [listed] = [r for r in list_runs(config_run["cwd"] / "runs") if r.path == run_dir]
    assert listed.config["epochs"] == 4 and listed.steps == 92
    assert "extended: epochs 2 -> 4" in (run_dir / "run.log").read_text()


# -- the rules, in this process -----------------------------------------------------------------


def test_best_and_last_are_public_and_keep_0_keeps_only_the_best(tmp_path: Path) -> None:
    engine = runmodel.Engine()
    scores = iter([0.5, 0.9, 0.7])
    engine.on("epoch_end", lambda e: e.state.metrics.update(score=next(scores)), priority=10)
    pack = Checkpoint(tmp_path, keep=0, best=("score", "max"))
    engine.attach(pack)
    result = engine.run(dropout_mlp(), epochs=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best-score=0.9-00002-0000000008.pt"]
    assert pack.best_path == tmp_path / "best-score=0.9-00002-0000000008.pt"
    assert pack.last_path is None
    assert result.files == {"best_checkpoint": str(pack.best_path)}
    again = runmodel.Engine()
    again.attach(Checkpoint(tmp_path, keep=0, best=("score", "max")))
    again.on("epoch_end", lambda e: e.state.metrics.update(score=0.1), priority=10)
    resumed = again.run(dropout_mlp(), epochs=3, resume="auto")  # from the best
    assert resumed.steps == 12
    with pytest.raises(ValueError, match=r"keep= must be .* or 0 with best="):
        Checkpoint(tmp_path, keep=0)


def test_continuing_with_fewer_epochs_is_an_error_and_as_many_trains_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train_with_checkpoints(tmp_path, epochs=2)
    steps: list[int] = []
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path))
    engine.on("runstep", lambda e: steps.append(e.state.step))
    with pytest.raises(
        ValueError,
        match=r"epochs=1, but the run did 2 epochs already .*ask "
        r"for 2 or more",
    ):
        engine.run(dropout_mlp(), epochs=1, resume="auto")
    with pytest.raises(ValueError, match=r"steps=5, but the run did 8 steps already"):
        engine.run(dropout_mlp(), steps=5, resume="auto")
    capsys.readouterr()
    result = engine.run(dropout_mlp(), epochs=2, resume="auto")
    assert steps == [] and (result.steps, result.epochs) == (8, 2)
    said = [line for line in capsys.readouterr().err.splitlines() if "nothing to train" in line]
    assert len(said) == 1 and "has done its 2 epochs (8 steps) already" in said[0]


def test_the_checkpoint_folder_rules(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path / "new"))
    engine.run(dropout_mlp(), epochs=1, resume="auto")  # an empty folder: start, saying so
    assert "no checkpoint in" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="no such checkpoint file or directory"):
        runmodel.Engine().run(dropout_mlp(), epochs=1, resume=tmp_path / "nothing")
    before = sorted((tmp_path / "new").iterdir())
    fresh = runmodel.Engine()
    fresh.attach(Checkpoint(tmp_path / "new"))
    with pytest.raises(
        FileExistsError,
        match=r"holds the checkpoints of run \w+, started .*"
        r'resume="auto", give this run another folder, '
        r"or use Checkpoint\(.*overwrite=True\)",
    ):
        fresh.run(dropout_mlp(), epochs=1)
    assert sorted((tmp_path / "new").iterdir()) == before
    # a checkpoint written before runs had records counts as one run's: it continues
    old = torch.load(before[-1], weights_only=True)
    del old["engine"]["run"]
    torch.save(old, before[-1])
    assert engine.run(dropout_mlp(), epochs=2, resume="auto").steps == 8


LINE = """
import torch
from torch import nn
import runmodel

class Line(runmodel.TorchModel):
    def __init__(self, device=None, init_options=None):
        super().__init__(device, init_options)
        torch.manual_seed(0)
        self.module = nn.Linear(1, 1)

    def setup(self, setup_options=None):
        x = torch.linspace(-1, 1, 64).unsqueeze(1)
        self.train_data = [(x[i:i + 16], 3 * x[i:i + 16] - 1) for i in range(0, 64, 16)]
        self.eval_data = self.train_data
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=0.1)
        self.loss_fn = nn.MSELoss()
"""


def test_eval_mode_without_trained_weights_warns_once_and_a_folder_of_no_run_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from runmodel.cli import main
    from runmodel.runs.script import is_script

    source = tmp_path / "line.py"
    source.write_text(LINE)
    assert not is_script(str(source))  # a model source keeps its meaning
    assert main(["run", str(source), "--mode", "eval"]) == 0
    err = capsys.readouterr().err
    assert err.count("warning") == 1 and "`runmodel eval RUN_DIR`" in err
    assert main(["eval", str(tmp_path)]) == 2
    assert "is not a run folder" in capsys.readouterr().err
    script = tmp_path / "train.py"
    script.write_text("from line import Line\nimport runmodel\nrunmodel.Engine().run(Line())\n")
    assert is_script(str(script))


def test_a_continued_run_reports_the_checkpoints_learning_rate(tmp_path: Path) -> None:
    from torch.optim import lr_scheduler

    from runmodel.packs import LRSchedule

    def engine() -> runmodel.Engine:
        made = runmodel.Engine()
        made.attach(
            LRSchedule(lambda opt: lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)),
            Checkpoint(tmp_path),
        )
        return made

    trained = engine().run(dropout_mlp(), epochs=2)
    again = engine().run(dropout_mlp(), epochs=2, resume="auto")  # nothing to train
    assert again.metrics["lr"] == trained.metrics["lr"] < 0.1  # not the optimizer's own

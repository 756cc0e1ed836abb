"""One run path: a script's ``run_dir=`` run, a config run and a model source's run
(``runmodel run tiny.py``) are one engine run in one run folder, written by one writer;
Ctrl-C ends them the same way (real subprocesses, a real SIGINT to the process group, as a
terminal sends it).

One small model file serves every run here: a config imports it, a script imports it, the
command runs it as a model source, and its ``configure(engine)`` hook slows the steps down
from ``READY_AT`` on, saying "ready", so that the Ctrl-C lands in the middle of an epoch.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import warm as subprocess
from helpers import RUN_FOLDER, signal_when_ready

TIMEOUT = 180  # seconds for one child; each takes a few
EPOCHS, BATCHES = 3, 8  # steps 0-7 are epoch 0; READY_AT = 11 lands in epoch 1
READY_AT = 11
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8"}
RUNMODEL = (sys.executable, "-m", "runmodel")

MODEL = textwrap.dedent('''
    """A small classifier with train and eval data, registered as "tiny"."""
    import os
    import time

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import runmodel
    from runmodel.packs import Evaluate


    class Tiny(runmodel.TorchModel):
        def __init__(self, device=None, init_options=None):
            super().__init__(device, init_options)
            self.module = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.1),
                                        nn.Linear(16, 2))

        def setup(self, setup_options=None):
            g = torch.Generator().manual_seed(0)
            x = torch.randn(128, 8, generator=g)
            y = (x[:, 0] + x[:, 1] > 0).long()
            self.train_data = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True,
                                         generator=torch.Generator().manual_seed(1))
            self.eval_data = DataLoader(TensorDataset(x[:64], y[:64]), batch_size=32)
            self.optimizer = torch.optim.SGD(self.module.parameters(), lr=0.1)
            self.loss_fn = nn.CrossEntropyLoss()


    runmodel.register_model("tiny", Tiny)


    def configure(engine):
        """Evaluate every epoch; with READY_AT, slow steps from there on, saying so."""
        engine.attach(Evaluate())
        ready_at = int(os.environ.get("READY_AT", "-1"))
        if ready_at >= 0:
            @engine.on("runstep", when=lambda e: e.state.step >= ready_at)
            def slowly(engine):
                print("ready", flush=True)
                time.sleep(0.05)
''')

CONFIG = textwrap.dedent(f"""
    imports = ["tiny.py"]
    epochs = {EPOCHS}
    seed = 0

    [model]
    type = "tiny"
""")

#: The script: the same model, seeded as a config run seeds (``seed = 0``), the config
#: run's default packs, in ``run_dir`` (argv[1]); continued with resume="auto".
SCRIPT = textwrap.dedent(f"""
    import os
    import random
    import sys

    import numpy
    import torch

    import runmodel
    from runmodel.packs import Checkpoint, TensorBoard

    import tiny

    random.seed(0)
    torch.manual_seed(0)
    numpy.random.seed(0)
    run_dir = sys.argv[1]
    engine = runmodel.Engine(Checkpoint("checkpoint"), TensorBoard("tensorboard"),
                             progress=False)
    tiny.configure(engine)
    preempt = os.environ.get("PREEMPT")  # a signal name: the run is preempted by it
    engine.run(tiny.Tiny(), epochs={EPOCHS}, run_dir=run_dir, resume="auto",
               preempt_signals=(preempt,) if preempt else ())
""")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("one_path")
    (folder / "tiny.py").write_text(MODEL)
    (folder / "run.toml").write_text(CONFIG)
    (folder / "train.py").write_text(SCRIPT)
    return folder


def _run(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT, env=env or ENV
    )


def _config_dir(project: Path, runs: str) -> Path:
    [folder] = (project / runs).iterdir()
    return folder


#: ``runmodel run`` of the model file as a model source: seeded as the config run is
#: (seed 0), in a run folder derived from it, with the config runs' default packs.
SOURCE_RUN = (*RUNMODEL, "run", "tiny.py", "--epochs", str(EPOCHS), "--no-progress")


@pytest.fixture(scope="module")
def straight(project: Path) -> dict[str, Any]:
    """One uninterrupted script run, config run and model source's run of the same
    model, side by side (each in its own folder; two cores, and seconds of imports each)."""
    started = [
        subprocess.Popen(
            args, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV
        )
        for args in (
            (sys.executable, "train.py", "runs-script/straight"),
            (*RUNMODEL, "run", "run.toml", "--runs-dir", "runs-config", "--no-progress"),
            (*SOURCE_RUN, "--runs-dir", "runs-source"),
        )
    ]
    try:
        for process in started:
            _, err = process.communicate(timeout=TIMEOUT)
            assert process.returncode == 0, err
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.wait()
    return {
        "script": project / "runs-script" / "straight",
        "config": _config_dir(project, "runs-config"),
        "source": _config_dir(project, "runs-source"),
    }


def _read(folder: Path, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / name).read_text())
    return data


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = torch.load(folder / "model.pt", weights_only=True)
    return state


def _assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = _weights(a), _weights(b)
    assert sorted(wa) == sorted(wb) and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_script_run_and_a_config_run_leave_the_same_folder(straight: dict[str, Any]) -> None:
    script, config = straight["script"], straight["config"]
    assert sorted(os.listdir(script)) == RUN_FOLDER
    assert sorted(os.listdir(config)) == sorted([*RUN_FOLDER, "config.json"])
    s_status, c_status = _read(script, "status.json"), _read(config, "status.json")
    assert sorted(s_status) == sorted(c_status)
    for key in ("status", "epochs", "steps", "extensions", "resumed_from", "files"):
        assert s_status[key] == c_status[key], key
    assert s_status["status"] == "finished" and s_status["files"]["last_checkpoint"] == (
        "checkpoint/ckpt-00003-0000000024.pt"
    )
    s_metrics, c_metrics = _read(script, "metrics.json"), _read(config, "metrics.json")
    assert sorted(s_metrics) == sorted(c_metrics)
    # measured once training is done, on the trained weights: the same numbers
    evaluated = {k: v for k, v in s_metrics["metrics"].items() if k.startswith("eval_")}
    assert sorted(evaluated) == ["eval_accuracy", "eval_loss"]
    assert evaluated == {k: v for k, v in c_metrics["metrics"].items() if k.startswith("eval_")}
    assert s_metrics["steps"] == c_metrics["steps"] == EPOCHS * BATCHES
    _assert_same_weights(script, config)
    assert _read(script, "run.json")["kind"] == "script"
    assert _read(config, "run.json")["kind"] == "config"


def _ctrl_c_when_ready(
    args: list[str],
    cwd: Path,
    *,
    close_output: bool = False,
    send: signal.Signals = signal.SIGINT,
    env: dict[str, str] | None = None,
) -> tuple[int, str]:
    """Once it says "ready", Ctrl-C ``args`` as a terminal does (SIGINT to its process
    group; or ``send``): ``helpers.signal_when_ready`` with READY_AT."""
    run_env = {**ENV, "READY_AT": str(READY_AT), **(env or {})}
    return signal_when_ready(
        args, cwd, send, env=run_env, timeout=TIMEOUT, close_output=close_output
    )


def _assert_interrupted_mid_epoch(folder: Path, how: str = "interrupted") -> int:
    """Status interrupted (or preempted), a checkpoint at the step reached (mid-epoch),
    and the partial epoch neither evaluated nor logged; returns that step."""
    status = _read(folder, "status.json")
    assert status["status"] == how, status
    step = status["step"]
    assert READY_AT < step < 2 * BATCHES  # in epoch 1, after the Ctrl-C's step
    assert status["files"]["last_checkpoint"] == f"checkpoint/ckpt-00001-{step:010d}.pt"
    assert (folder / status["files"]["last_checkpoint"]).is_file()
    log = (folder / "run.log").read_text()
    assert log.count(" epoch 1 step") == 1 and " epoch 2 step" not in log, log
    assert not (folder / "metrics.json").exists()
    return int(step)


def _tensorboard_points(folder: Path, tag: str) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    steps = []
    for events in sorted((folder / "tensorboard").glob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        if tag in accumulator.Tags()["scalars"]:
            steps += [event.step for event in accumulator.Scalars(tag)]
    return steps


@pytest.mark.parametrize("kind", ["script", "config", "source"])
def test_ctrl_c_ends_a_script_run_and_a_config_run_alike_and_both_resume_exactly(
    kind: str, project: Path, straight: dict[str, Any]
) -> None:
    """``python train.py`` (``run_dir=``), ``runmodel run CONFIG`` and ``runmodel run
    tiny.py`` (a model source): the same outcome, exit 130 from the command line."""
    if kind == "script":
        folder = project / "runs-script" / "interrupted"
        code, err = _ctrl_c_when_ready([sys.executable, "train.py", str(folder)], project)
        assert code == -signal.SIGINT, err  # ended as Ctrl-C ends Python: 130 in a shell
        assert (
            err.rstrip().splitlines()[-1].startswith("runmodel.Interrupted: interrupted: Ctrl-C")
        ), err
    else:
        given = ["run.toml"] if kind == "config" else ["tiny.py", "--epochs", str(EPOCHS)]
        code, err = _ctrl_c_when_ready(
            [*RUNMODEL, "run", *given, "--runs-dir", f"runs-interrupted-{kind}", "--no-progress"],
            project,
        )
        assert code == 130, err
        folder = _config_dir(project, f"runs-interrupted-{kind}")
        assert _read(folder, "run.json")["kind"] == kind
    step = _assert_interrupted_mid_epoch(folder)
    said = [line for line in err.splitlines() if "stopped the run" in line]
    assert len(said) == 1 and f"after step {step}; saved " in said[0], err

    if kind == "source":  # it says how to go on: the command that continues it
        assert f"continue it with `runmodel resume {folder.relative_to(project)}`" in said[0]
        # seeded as a config run is (seed 0): the same model, trained the same
        _assert_same_weights(straight["source"], straight["config"])
    again = (
        _run(sys.executable, "train.py", str(folder), cwd=project)
        if kind == "script"
        else _run(*RUNMODEL, "resume", str(folder), "--no-progress", cwd=project)
    )
    assert again.returncode == 0, again.stderr
    assert _read(folder, "status.json")["status"] == "finished"
    _assert_same_weights(folder, straight[kind])
    log = (folder / "run.log").read_text()
    assert [log.count(f" epoch {n} step") for n in (1, 2, 3)] == [1, 1, 1], log
    # one point per epoch: none for the partial epoch
    assert _tensorboard_points(folder, "train/eval_accuracy") == [8, 16, 24]
    assert (
        _read(folder, "metrics.json")["metrics"] == _read(straight[kind], "metrics.json")["metrics"]
    )


def test_a_closed_output_pipe_costs_neither_the_checkpoint_nor_the_status(project: Path) -> None:
    folder = project / "runs-script" / "piped"
    code, _ = _ctrl_c_when_ready(
        [sys.executable, "train.py", str(folder)], project, close_output=True
    )
    assert code == -signal.SIGINT
    _assert_interrupted_mid_epoch(folder)


def test_sigterm_preempts_a_script_run_that_watches_it_and_the_rerun_is_exact(
    project: Path, straight: dict[str, Any]
) -> None:
    folder = project / "runs-script" / "preempted"
    code, err = _ctrl_c_when_ready(
        [sys.executable, "train.py", str(folder)],
        project,
        send=signal.SIGTERM,
        env={"PREEMPT": "SIGTERM"},
    )
    assert code == -signal.SIGTERM, err  # ended as SIGTERM ends it: 143 in a shell
    assert err.rstrip().splitlines()[-1].startswith("runmodel.Preempted: preempted: SIGTERM"), err
    step = _assert_interrupted_mid_epoch(folder, "preempted")
    assert _read(folder, "status.json")["signal"] == "SIGTERM"
    assert f"SIGTERM stopped the run after step {step}; saved " in err
    again = _run(sys.executable, "train.py", str(folder), cwd=project)
    assert again.returncode == 0, again.stderr
    _assert_same_weights(folder, straight["script"])


def test_without_preempt_signals_a_scripts_sigterm_ends_it_as_before(project: Path) -> None:
    folder = project / "runs-script" / "terminated"
    code, _ = _ctrl_c_when_ready(
        [sys.executable, "train.py", str(folder)], project, send=signal.SIGTERM
    )
    assert code == -signal.SIGTERM
    assert _read(folder, "status.json")["status"] == "running"  # killed: nothing recorded

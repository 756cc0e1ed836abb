"""Preemption under the ``runmodel`` command (issue 30): SIGTERM, and the signals of
``--preempt-signal``, end a run as Ctrl-C does (it stops after its step, saves, its status
says ``preempted``) and the command exits 128 + the signal's number; ``runmodel resume``
continues it exactly. Under ``--nproc-per-node`` torchrun hands the signal on to its
processes, which stop at the same step. And whatever the command says last, a closed
output pipe never changes its exit code. Real subprocesses, real signals, real torchrun.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from runmodel.cli import launch, main
from runmodel.cli.parser import parser

import warm as subprocess
from helpers import signal_when_ready

TIMEOUT = 240  # seconds for one command; each takes a few (a launch of 2, ten or so)
EPOCHS, STEPS = 3, 8  # one process: 64 samples in batches of 8
READY_AT = 11  # epoch 1, 3 steps in: the signal lands in the middle of an epoch
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8"}
ENV.pop("TORCHELASTIC_RUN_ID", None)
RUNMODEL = (sys.executable, "-m", "runmodel")

MODEL = textwrap.dedent('''
    """A small classifier registered as "tiny"; SAMPLES (64) training samples."""
    import os
    import signal
    import time

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import runmodel
    from runmodel.packs import Evaluate

    SAMPLES = int(os.environ.get("SAMPLES", "64"))


    class Tiny(runmodel.TorchModel):
        def __init__(self, device=None, init_options=None):
            super().__init__(device, init_options)
            self.module = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.1),
                                        nn.Linear(16, 2))

        def setup(self, setup_options=None):
            g = torch.Generator().manual_seed(0)
            x = torch.randn(SAMPLES, 8, generator=g)
            y = (x[:, 0] + x[:, 1] > 0).long()
            self.train_data = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True,
                                         generator=torch.Generator().manual_seed(1))
            self.eval_data = DataLoader(TensorDataset(x[:32], y[:32]), batch_size=16)
            self.optimizer = torch.optim.SGD(self.module.parameters(), lr=0.1)
            self.loss_fn = nn.CrossEntropyLoss()


    runmodel.register_model("tiny", Tiny)


    def configure(engine):
        """Evaluate every epoch; from READY_AT on, slow steps (PAUSE s), saying "ready";
        at teardown, each process writes the step it stopped at into STOPPED."""
        engine.attach(Evaluate())
        ready_at = int(os.environ.get("READY_AT", "-1"))
        if ready_at >= 0:
            @engine.on("runstep", when=lambda e: e.state.step >= ready_at)
            def slowly(engine):
                print("ready", flush=True)
                time.sleep(float(os.environ.get("PAUSE", "0.05")))

        if os.environ.get("TERM_AT_SETUP"):  # a preemption before the run's first step
            engine.on("setup", lambda engine: os.kill(os.getpid(), signal.SIGTERM))

        @engine.on("teardown")
        def stopped_at(engine):
            if os.environ.get("STOPPED"):
                with open(f"{os.environ['STOPPED']}/stopped-{engine.state.rank}", "w") as f:
                    f.write(str(engine.state.step))
''')

CONFIG = textwrap.dedent(f"""
    imports = ["tiny.py"]
    epochs = {EPOCHS}

    [model]
    type = "tiny"
""")


def _run(*args: str | Path, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={**ENV, **env},
    )


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("preempt")
    (folder / "tiny.py").write_text(MODEL)
    (folder / "run.toml").write_text(CONFIG)
    return folder


@pytest.fixture(scope="module")
def straight(project: Path) -> Iterator[Path]:
    """The config's uninterrupted run (one process), started at once, in the
    background."""
    runs = project / "runs-straight"
    process = subprocess.Popen(
        [*RUNMODEL, "run", "run.toml", "--runs-dir", str(runs), "--no-progress"],
        cwd=project,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    waited: dict[str, Any] = {}

    def folder() -> Path:
        if not waited:
            waited["out"] = process.communicate(timeout=TIMEOUT)
            assert process.returncode == 0, waited["out"][1]
        [found] = runs.iterdir()
        return found

    try:
        yield folder  # type: ignore[misc]
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def _signal_when_ready(
    args: list[str],
    cwd: Path,
    send: signal.Signals,
    *,
    group: bool = True,
    close_output: bool = False,
    **env: str,
) -> tuple[int, str]:
    """``helpers.signal_when_ready`` with READY_AT and this module's limits."""
    run_env = {**ENV, "READY_AT": str(READY_AT), **env}
    return signal_when_ready(
        args, cwd, send, env=run_env, timeout=TIMEOUT, group=group, close_output=close_output
    )


def _read(folder: Path, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / name).read_text())
    return data


def _only(runs: Path) -> Path:
    [folder] = runs.iterdir()
    return folder


def _stopped_mid_epoch(folder: Path, how: str, sig: str | None = None) -> int:
    """The run's status (``how``, with the signal), its checkpoint at the step reached in
    the middle of epoch 1, the partial epoch neither evaluated nor logged; that step."""
    status = _read(folder, "status.json")
    assert status["status"] == how, status
    if sig is not None:
        assert status["signal"] == sig, status
    step = int(status["step"])
    assert READY_AT < step < 2 * STEPS, status
    assert status["files"]["last_checkpoint"] == f"checkpoint/ckpt-00001-{step:010d}.pt"
    assert (folder / status["files"]["last_checkpoint"]).is_file()
    log = (folder / "run.log").read_text()
    assert log.count(" epoch 1 step") == 1 and " epoch 2 step" not in log, log
    assert not (folder / "metrics.json").exists()
    return step


def _same_weights(a: Path, b: Path) -> None:
    wa = torch.load(a / "model.pt", weights_only=True)
    wb = torch.load(b / "model.pt", weights_only=True)
    assert sorted(wa) == sorted(wb) and all(torch.equal(wa[k], wb[k]) for k in wa)


# -- one process --------------------------------------------------------------------------------


def test_sigterm_preempts_a_config_run_exit_143_and_the_resume_is_exact(
    project: Path, straight: Any
) -> None:
    """SIGTERM is handled by default under the command: no option, nothing in the config
    (its folder, named by its hash, is the straight run's)."""
    runs = project / "runs-sigterm"
    code, err = _signal_when_ready(
        [*RUNMODEL, "run", "run.toml", "--runs-dir", str(runs), "--no-progress"],
        project,
        signal.SIGTERM,
    )
    assert code == 128 + signal.SIGTERM == 143, err
    folder = _only(runs)
    assert folder.name == straight().name  # the same config, the same hash
    step = _stopped_mid_epoch(folder, "preempted", "SIGTERM")
    said = [line for line in err.splitlines() if line.startswith("runmodel")]
    assert said[-1] == "runmodel: preempted by SIGTERM", err
    assert any(
        f"SIGTERM stopped the run after step {step}; saved " in line
        and f"continue it with `runmodel resume {folder}`" in line
        for line in said
    ), err

    again = _run(*RUNMODEL, "resume", folder, "--no-progress", cwd=project)
    assert again.returncode == 0, again.stderr
    assert _read(folder, "status.json")["status"] == "finished"
    _same_weights(folder, straight())
    assert _read(folder, "metrics.json")["metrics"] == _read(straight(), "metrics.json")["metrics"]


def test_a_signal_asked_for_preempts_a_model_sources_run_exit_128_plus_its_number(
    project: Path,
) -> None:
    runs = project / "runs-usr1"
    code, err = _signal_when_ready(
        [
            *RUNMODEL,
            "run",
            "tiny.py",
            "--epochs",
            str(EPOCHS),
            "--runs-dir",
            str(runs),
            "--no-progress",
            "--preempt-signal",
            "USR1",
        ],
        project,
        signal.SIGUSR1,
    )
    assert code == 128 + signal.SIGUSR1, err
    folder = _only(runs)
    assert _read(folder, "run.json")["kind"] == "source"
    _stopped_mid_epoch(folder, "preempted", "SIGUSR1")
    assert err.splitlines()[-1] == "runmodel: preempted by SIGUSR1", err


def test_a_preemption_before_the_first_step_waits_for_one_step(
    project: Path, straight: Any
) -> None:
    """SIGTERM before a run's first step (its setup): the run takes that step, saves it and
    exits 143, a new run and a resumed one alike, so a job signalled as it starts again
    (SLURM's early time-limit signal) still makes progress; the finished run is exact."""
    runs = project / "runs-at-setup"
    args = ["--no-progress"]
    first = _run(*RUNMODEL, "run", "run.toml", "--runs-dir", runs, *args, cwd=project,
                 TERM_AT_SETUP="1")  # fmt: skip
    assert first.returncode == 143, first.stderr[-4000:]
    folder = _only(runs)
    status = _read(folder, "status.json")
    assert (status["status"], int(status["step"])) == ("preempted", 1), status
    again = _run(*RUNMODEL, "resume", folder, *args, cwd=project, TERM_AT_SETUP="1")
    assert again.returncode == 143, again.stderr[-4000:]
    status = _read(folder, "status.json")
    assert (status["status"], int(status["step"])) == ("preempted", 2), status
    assert status["files"]["last_checkpoint"] == "checkpoint/ckpt-00000-0000000002.pt"

    done = _run(*RUNMODEL, "resume", folder, *args, cwd=project)
    assert done.returncode == 0, done.stderr[-4000:]
    _same_weights(folder, straight())
    assert _read(folder, "metrics.json")["metrics"] == _read(straight(), "metrics.json")["metrics"]


def test_the_launchers_preemption_line_says_who_kills_when(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """torchrun's ``--shutdown-timeout`` is when the processes are killed, except under
    SLURM, whose own SIGKILL comes when its KillWait (or a preemption's GraceTime) is up."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    def preempted(options: Any) -> None:
        raise SignalException("", signal.SIGTERM)

    monkeypatch.setattr("torch.distributed.run.run", preempted)
    args = parser().parse_args(["run", "model.py", "--nproc-per-node", "2"])
    said = []
    for job in (None, "4242"):
        if job is None:
            monkeypatch.delenv("SLURM_JOB_ID", raising=False)
        else:
            monkeypatch.setenv("SLURM_JOB_ID", job)
        assert launch.launch(args, ["run", "model.py"]) == 143
        said.append(capsys.readouterr().err.strip())
    assert said[0].endswith("save (30 s before torchrun ends them with SIGKILL)"), said
    assert said[1].endswith(
        "save (SIGKILL from torchrun 30 s on, or from SLURM once its KillWait (a preemption's "
        "GraceTime) is up, whichever comes first)"
    ), said


def test_a_closed_output_pipe_never_changes_the_exit_code(project: Path) -> None:
    """``runmodel run CONFIG 2>&1 | tee log`` and Ctrl-C: tee is gone before the command
    says its last words; they are dropped, the exit code stays 130 (not Python's 120 for
    an output it could not flush), the checkpoint and the status are written."""
    runs = project / "runs-piped"
    code, _ = _signal_when_ready(
        [*RUNMODEL, "run", "run.toml", "--runs-dir", str(runs)],
        project,
        signal.SIGINT,
        close_output=True,
    )
    assert code == 130
    _stopped_mid_epoch(_only(runs), "interrupted")


# -- the options --------------------------------------------------------------------------------


def test_the_launcher_hands_the_preemption_signals_and_the_grace_to_torchrun() -> None:
    from torch.distributed.run import get_args_parser

    def torchrun_options(*given: str) -> Any:
        args = parser().parse_args(["run", "model.py", "--nproc-per-node", "2", *given])
        return get_args_parser().parse_args(
            [
                *launch.torchrun_arguments(args),
                *launch.preemption_arguments(args),
                "-m",
                "runmodel",
                "run",
                "model.py",
            ]
        )

    default = torchrun_options()
    assert (default.signals_to_handle, default.shutdown_timeout) == (
        "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        30,
    )
    asked = torchrun_options(
        "--preempt-signal", "SIGUSR1", "--preempt-signal", "12", "--preempt-grace", "120"
    )
    assert (asked.signals_to_handle, asked.shutdown_timeout) == (
        "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2",
        120,
    )


@pytest.mark.parametrize(
    ("given", "error"),
    [
        (["--preempt-signal", "KILL"], "SIGKILL cannot be caught"),
        (["--preempt-signal", "SIGINT"], "SIGINT (Ctrl-C) interrupts every run already"),
        (["--preempt-signal", "SIGBOGUS"], "'SIGBOGUS' is not a signal"),
        (["--preempt-grace", "0"], "'0': give a whole number of seconds >= 1"),
    ],
)
def test_a_signal_that_cannot_preempt_is_a_usage_error(
    given: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as ended:
        main(["run", "model.py", *given])
    assert ended.value.code == 2
    assert error in capsys.readouterr().err


def test_preempt_signals_are_sigterm_and_those_asked_for() -> None:
    from runmodel.cli.commands import preempt_signals

    assert preempt_signals(argparse.Namespace()) == (signal.SIGTERM,)
    args = parser().parse_args(
        ["resume", "runs/x", "--preempt-signal", "USR1", "--preempt-signal", "TERM"]
    )
    assert preempt_signals(args) == (signal.SIGTERM, signal.SIGUSR1)


def test_sweep_heartbeat_reaches_the_sweep(
    project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "sweep.toml"
    config.write_text(
        CONFIG.replace('imports = ["tiny.py"]', f'imports = ["{project / "tiny.py"}"]')
        + '\n[sweep]\nmetric = "eval_accuracy"\n'
        "[sweep.params]\nepochs = {choice = [1, 2]}\n"
    )
    assert (
        main(["sweep", str(config), "--heartbeat", "0", "--runs-dir", str(tmp_path / "runs")]) == 2
    )
    assert "heartbeat is a whole number >= 1" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


# -- several processes ----------------------------------------------------------------------------


def test_sigterm_to_the_launcher_stops_every_process_at_the_same_step_and_saves(
    project: Path, tmp_path: Path
) -> None:
    """``runmodel run CONFIG --nproc-per-node 2``, SIGTERM to the launcher alone (as a
    scheduler sends it to the job's process): torchrun hands it on, the two processes stop
    at the same step (the stop agreement of issue 30), rank 0 saves it, the status says
    preempted, the launcher exits 143; ``runmodel resume`` finishes the run in 2
    processes again."""
    runs = project / "runs-ddp"
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    # 256 samples, 2 processes, batches of 8: 16 steps an epoch each; slow from step 3
    code, err = _signal_when_ready(
        [
            *RUNMODEL,
            "run",
            "run.toml",
            "--runs-dir",
            str(runs),
            "--no-progress",
            "--nproc-per-node",
            "2",
            "--set",
            "epochs=2",
        ],
        project,
        signal.SIGTERM,
        group=False,
        SAMPLES="256",
        READY_AT="3",
        PAUSE="0.2",
        STOPPED=str(stopped),
    )
    assert code == 143, err[-4000:]
    # one line says it for the run (the launcher), not one for each process
    assert [line for line in err.splitlines() if "preempted" in line] == [
        "runmodel run: preempted by SIGTERM: handed on to the run's processes, which stop "
        "after a step and save (30 s before torchrun ends them with SIGKILL)"
    ], err[-4000:]
    folder = _only(runs)
    status = _read(folder, "status.json")
    assert (status["status"], status.get("signal")) == ("preempted", "SIGTERM"), status
    step = int(status["step"])
    assert sorted(p.name for p in stopped.iterdir()) == ["stopped-0", "stopped-1"]
    assert {p.read_text() for p in stopped.iterdir()} == {str(step)}  # every process
    assert status["files"]["last_checkpoint"] == (
        f"checkpoint/ckpt-{step // 16:05d}-{step:010d}.pt"
    )
    assert (folder / status["files"]["last_checkpoint"]).is_file()

    again = _run(*RUNMODEL, "resume", folder, "--no-progress", cwd=project, SAMPLES="256")
    assert again.returncode == 0, again.stderr[-4000:]
    status = _read(folder, "status.json")
    assert (status["status"], status["world_size"]) == ("finished", 2)
    assert _read(folder, "metrics.json")["steps"] == 32

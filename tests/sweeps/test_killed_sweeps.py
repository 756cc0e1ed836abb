"""A sweep's process killed in mid-trial: on one machine its trial stops through the
Ctrl-C path (Linux's PR_SET_PDEATHSIG), a restarted sweep waits for it and resumes it;
across machines (two sweeps on one database, two host names) a living machine fails the
dead one's trial by its stale heartbeat and runs its values again, taking its run folder
over. Real processes and SIGKILLs; counts asserted, never a time limit."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
from pathlib import Path

import pytest

import warm as subprocess

pytest.importorskip("optuna")

from sweeping import (
    TWO_PARAMS,
    command,
    finish,
    lines,
    run_folders,
    states,
    trials,
    wait_for,
    write_config,
)

TWO_TRIALS = TWO_PARAMS.replace("trials = 3", "trials = 2")


def test_a_killed_sweep_stops_its_trial_and_a_restart_waits_for_it_then_resumes_it(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path, TWO_TRIALS, epochs=2, gate=True)
    folder, gate, release = tmp_path / "runs" / "search", tmp_path / "gate", tmp_path / "go"
    gated = {"GATE": str(gate), "GATE_RELEASE": str(release)}
    first = command("sweep", str(config), cwd=tmp_path, **gated)
    wait_for(lambda: lines(gate) >= 1, "the first trial held at its second epoch")
    os.kill(first.pid, signal.SIGKILL)  # the sweep alone: its trial lives on, held
    finish(first)
    log = folder / "trial-0000.log"
    # Linux sent the orphaned trial SIGINT: it stops after this step, as on Ctrl-C
    wait_for(lambda: "stopping after this step" in log.read_text(), "the trial's Ctrl-C")
    assert states(folder) == ["RUNNING"]
    assert [any(run.glob("checkpoint/*.pt")) for run in run_folders(folder)] == [True]
    out = tmp_path / "again.txt"
    again = command("sweep", str(config), "--jobs", "1", cwd=tmp_path, output=out, **gated)
    wait_for(lambda: "still runs here" in out.read_text(), "the restart seeing the trial")
    # the live trial counts against --jobs 1: nothing new starts beside it
    assert states(folder) == ["RUNNING"]
    assert sorted(p.name for p in folder.glob("trial-*.log")) == ["trial-0000.log"]
    release.touch()
    _, err = finish(again)
    assert again.returncode == 0, out.read_text() + err
    assert states(folder) == ["COMPLETE"] * 2
    assert len(run_folders(folder)) == 2  # the killed trial resumed, not duplicated
    assert "resuming from" in log.read_text()


def _other_host() -> tuple[str, ...]:
    """A command prefix that runs a process under another host name (a UTS namespace of
    its own: root and unshare)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("another host name needs root and unshare (util-linux)")
    prefix = ("unshare", "--uts", "sh", "-c", 'hostname runmodel-other && exec "$0" "$@"')
    tried = subprocess.run([*prefix, "hostname"], capture_output=True, text=True)
    if tried.returncode != 0 or tried.stdout.strip() != "runmodel-other":
        pytest.skip(f"unshare --uts does not work here: {tried.stderr.strip()}")
    return prefix


def test_a_machine_dying_mid_trial_leaves_its_trial_to_the_other_machine(tmp_path: Path) -> None:
    other = _other_host()
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    config = write_config(
        tmp_path, TWO_TRIALS.replace("[sweep]", "[sweep]\nheartbeat = 1"), epochs=2, gate=True
    )
    folder, gate = tmp_path / "runs" / "search", tmp_path / "gate"
    # this host's trials hold at their second epoch (the first saved); the other's pass
    here = command(
        "sweep",
        str(config),
        "--storage",
        storage,
        cwd=tmp_path,
        GATE=str(gate),
        GATE_HOST=socket.gethostname(),
    )
    wait_for(lambda: lines(gate) >= 1, "this host's trial held in its second epoch")
    out = tmp_path / "other.txt"
    there = command(
        "sweep",
        str(config),
        "--storage",
        storage,
        cwd=tmp_path,
        prefix=other,
        output=out,
        GATE=str(gate),
        GATE_HOST=socket.gethostname(),
    )
    wait_for(lambda: "started" in out.read_text(), "the other host's first trial")
    os.killpg(here.pid, signal.SIGKILL)  # this machine dies: its sweep and its trial
    finish(here)
    _, err = finish(there)
    assert there.returncode == 0, out.read_text() + err
    study = trials(folder, storage)
    failed = [t for t in study if t.state.name == "FAIL"]
    complete = [t for t in study if t.state.name == "COMPLETE"]
    assert len(failed) == 1 and len(complete) == 2 and len(study) == 3, study
    dead = failed[0]
    assert f"trial {dead.number} failed: no heartbeat for 3 s" in out.read_text()
    assert dead.user_attrs["owner"]["host"] == socket.gethostname()
    retried = [t for t in complete if t.system_attrs.get("failed_trial") == dead.number]
    assert len(retried) == 1 and retried[0].params == dead.params
    # every trial counted once: one run folder for each set of values, the dead trial's
    # taken over and continued from its checkpoint (the runs folder is shared here)
    assert len(run_folders(folder)) == 2
    run = Path(retried[0].user_attrs["run_dir"])
    status = json.loads((tmp_path / run / "status.json").read_text())
    assert status["status"] == "finished" and status["host"] == "runmodel-other"
    assert status["resumed_from"], status
    assert json.loads((tmp_path / run / "metrics.json").read_text())["epochs"] == 2
    text = (folder / f"trial-{retried[0].number:04d}.log").read_text()
    assert "taking its run folder over" in text and "resuming from" in text, text

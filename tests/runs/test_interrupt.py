"""A real Ctrl-C (SIGINT) in a Python script's run (issue 19).

The first Ctrl-C finishes the step under way; a Checkpoint pack saves it; one line says
where and how to go on; the script ends with KeyboardInterrupt (one short traceback, no
chained one) and the shell sees 130. Sent, as a terminal does, to the whole process
group, so DataLoader workers get it too. A second Ctrl-C stops at once. The run resumed
from that checkpoint ends with the weights of a run never interrupted, bit for bit.
"""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

import helpers
import warm as subprocess

TIMEOUT = 120  # seconds for one child

#: A script's training: ``build(directory, workers)`` makes the model and the engine; run
#: as a program it trains 3 epochs of 20 steps with ``resume="auto"``, saying "ready" (and
#: then going slowly, 20 ms a step) from step 25 on, so the test's Ctrl-C lands mid-epoch.
SCRIPT = textwrap.dedent("""
    import sys
    import time

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import runmodel
    from runmodel.packs import Checkpoint


    def build(directory, workers):
        torch.manual_seed(0)
        x = torch.randn(640, 8)
        y = (x[:, 0] > 0).long()
        model = runmodel.TorchModel.from_parts(
            nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.1), nn.Linear(16, 2)),
            optimizer=torch.optim.Adam, loss_fn=nn.CrossEntropyLoss(),
            train_data=DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True,
                                  num_workers=workers,
                                  generator=torch.Generator().manual_seed(1)))
        return model, runmodel.Engine(Checkpoint(directory, every="1ep", keep=None))


    if __name__ == "__main__":
        model, engine = build(sys.argv[1], int(sys.argv[2]))

        @engine.on("runstep", when=lambda e: e.state.step >= 25)
        def slowly(engine):
            print("ready", flush=True)
            time.sleep(0.02)

        engine.on("exception", lambda e: print("exception:", type(e.state.error).__name__,
                                               isinstance(e.state.error, KeyboardInterrupt),
                                               flush=True))
        engine.run(model, epochs=3, resume="auto")
""")


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ctrl_c") / "train_script.py"
    path.write_text(SCRIPT)
    return path


def _load(script: Path) -> object:
    sys.path.insert(0, str(script.parent))
    try:
        import train_script  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(script.parent))
    return train_script


@pytest.fixture(scope="module")
def straight(script: Path, tmp_path_factory: pytest.TempPathFactory) -> torch.Tensor:
    """The weights of the run never interrupted (here, in this process)."""
    model, engine = _load(script).build(tmp_path_factory.mktemp("straight"), 0)  # type: ignore[attr-defined]
    engine.run(model, epochs=3)
    return helpers.params(model)


def _ctrl_c_when_ready(args: list[str], cwd: Path, presses: int = 1) -> tuple[int, str, str]:
    """Run ``args``; once it prints "ready", Ctrl-C as a terminal sends it (to its whole
    process group) ``presses`` times; return its exit status, stdout and stderr."""
    proc = subprocess.Popen(
        args,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=helpers.default_ctrl_c,
        start_new_session=True,
    )  # its own group, as a terminal's job
    watchdog = threading.Timer(TIMEOUT, lambda: os.killpg(proc.pid, signal.SIGKILL))
    watchdog.start()
    try:
        assert proc.stdout is not None and proc.stderr is not None
        first = proc.stdout.readline()
        assert first == "ready\n", first + proc.stderr.read()
        os.killpg(proc.pid, signal.SIGINT)
        if presses == 2:  # the second once the first was taken: it says so on stderr
            while "stopping after this step" not in proc.stderr.readline():
                pass
            os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc.returncode, first + out, err


@pytest.mark.parametrize("workers", [0, 2])
def test_ctrl_c_saves_the_step_and_the_resume_is_exact(
    workers: int, script: Path, straight: torch.Tensor, tmp_path: Path
) -> None:
    directory = tmp_path / "ckpt"
    code, out, err = _ctrl_c_when_ready(
        [sys.executable, str(script), str(directory), str(workers)], tmp_path
    )
    assert code == -signal.SIGINT, err  # "killed by SIGINT": 130 in a shell
    assert "exception: Interrupted True" in out  # runmodel.Interrupted, a KeyboardInterrupt
    assert "During handling of the above exception" not in err
    assert "exited unexpectedly" not in err and "Error" not in err
    assert err.count("Traceback") == 1 and err.rstrip().splitlines()[-1].startswith(
        "runmodel.Interrupted: interrupted: Ctrl-C"
    )
    said = [line for line in err.splitlines() if "saved" in line]
    assert len(said) == 1 and 'resume="auto"' in said[0], err
    last = max(directory.glob("ckpt-*.pt"))
    assert str(last.relative_to(tmp_path)) in said[0]
    step = int(last.stem.split("-")[2])
    assert step > 25 and step % 20 != 0 and f"after step {step};" in said[0]  # mid-epoch

    # the same script again, here: resume="auto" goes on from that step
    model, engine = _load(script).build(directory, workers)  # type: ignore[attr-defined]
    result = engine.run(model, epochs=3, resume="auto")
    assert result.steps == 60
    assert torch.equal(helpers.params(model), straight)


def test_second_ctrl_c_stops_at_once(script: Path, tmp_path: Path) -> None:
    slow = tmp_path / "slow.py"  # a step that would take a minute
    slow.write_text(script.read_text().replace("time.sleep(0.02)", "time.sleep(60)"))
    code, out, err = _ctrl_c_when_ready(
        [sys.executable, str(slow), str(tmp_path / "ck"), "0"], tmp_path, presses=2
    )
    assert code == -signal.SIGINT, err
    assert "exception: KeyboardInterrupt True" in out  # raised mid-step
    assert "During handling of the above exception" not in err
    assert helpers.files(tmp_path / "ck") == ["ckpt-00001-0000000020.pt"]  # not step 25's

"""What stays prompt in a process of several (``session/interrupt.py``), with real signals
sent to real processes: a process whose run failed, or that is in its teardown, ends at
once on SIGTERM (torchrun sends it to the processes left after a failure, and at every
restart); a second signal more than 2 s after the first ends the process at once and
writes nothing; a second one sooner is the first again (a terminal's Ctrl-C that comes
from the terminal and from the launcher).

The processes are plain Python with torchrun's environment (``TORCHELASTIC_RUN_ID``,
``WORLD_SIZE=2``): a process of several, without a group or a backend's check, so that a
signal stops it alone. The stopping together itself is in test_ddp.py and test_fsdp.py,
under torchrun.
"""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

import warm as subprocess

LIMIT_S = 120

CHILD = textwrap.dedent('''
    """python child.py MODE: a tiny run with a checkpoint after every step; MODE says
    where it waits for the test (ready: a file it writes; go: a file the test writes)."""
    import os
    import sys
    import time

    import torch
    from torch import nn

    import runmodel
    from runmodel.packs import Checkpoint

    mode = sys.argv[1]


    def wait_for(name):
        while not os.path.exists(name):
            time.sleep(0.02)


    torch.manual_seed(0)
    module = nn.Linear(2, 1)
    data = [(torch.randn(4, 2), torch.randn(4, 1)) for _ in range(6)]
    model = runmodel.TorchModel.from_parts(
        module, optimizer=torch.optim.SGD(module.parameters(), lr=0.1), loss_fn=nn.MSELoss(),
        train_data=data)
    engine = runmodel.Engine(Checkpoint("ckpt", every="1st", keep=None), progress=False)

    @engine.on("step_start", once=2)
    def hold(engine):
        from runmodel.backends.distributed.stopping import REQUEST

        open("ready", "w").close()
        if mode == "teardown":
            raise RuntimeError("the run fails at step 2")
        while not REQUEST.signal:  # the handler ran: the first signal is recorded
            time.sleep(0.02)
        open("recorded", "w").close()
        wait_for("go")

    @engine.on("teardown")
    def slow_teardown(engine):
        if mode == "teardown":
            open("in-teardown", "w").close()
            time.sleep(600)  # what a teardown stuck on a dead peer looks like

    engine.run(model, epochs=1, preempt_signals=("SIGTERM",))
''')


@pytest.fixture
def child(tmp_path: Path) -> Path:
    (tmp_path / "child.py").write_text(CHILD)
    return tmp_path


def start(folder: Path, mode: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "TORCHELASTIC_RUN_ID": "test",
        "WORLD_SIZE": "2",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.Popen(
        [sys.executable, "child.py", mode],
        cwd=folder,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def wait_for(path: Path, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + LIMIT_S
    while not path.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()  # a child still waiting would hold communicate() forever
            _, err = process.communicate()
            pytest.fail(f"{path.name} never came:\n{err[-3000:]}")
        time.sleep(0.02)


def ended(process: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        _, err = process.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        _, err = process.communicate()
        pytest.fail(f"the process did not end within {LIMIT_S} s:\n{err[-3000:]}")
    return process.returncode, err


def checkpoints(folder: Path) -> list[str]:
    return sorted(p.name for p in (folder / "ckpt").glob("ckpt-*"))


def test_a_process_whose_run_failed_ends_at_once_on_sigterm_even_in_its_teardown(
    child: Path,
) -> None:
    """Its teardown would take 600 s; SIGTERM ends it now, as SIGTERM's default does."""
    process = start(child, "teardown")
    wait_for(child / "in-teardown", process)
    process.send_signal(signal.SIGTERM)
    code, err = ended(process)
    assert code == -signal.SIGTERM, err[-3000:]
    assert "stop together" not in err and "stopping after" not in err


def test_a_second_signal_2_s_after_the_first_ends_the_process_at_once_saving_nothing(
    child: Path,
) -> None:
    """The first SIGTERM asks the run to stop after its step (which waits); the second,
    more than 2 s later, ends the process at once: no checkpoint of the step under way."""
    process = start(child, "second")
    wait_for(child / "ready", process)
    saved = checkpoints(child)
    process.send_signal(signal.SIGTERM)
    wait_for(child / "recorded", process)
    time.sleep(2.5)  # more than 2 s after the first was handled (at least)
    process.send_signal(signal.SIGTERM)
    code, err = ended(process)
    assert code == -signal.SIGTERM, err[-3000:]
    assert "runmodel: SIGTERM: this process stops after this step" in err
    assert checkpoints(child) == saved == ["ckpt-00000-0000000001.pt", "ckpt-00000-0000000002.pt"]


def test_a_second_ctrl_c_within_2_s_is_the_first_again(child: Path) -> None:
    """Two SIGINTs back to back (a terminal's and the launcher's): the run stops after
    its step, saves it and ends as Ctrl-C ends it (KeyboardInterrupt), not at once."""
    process = start(child, "twice")
    wait_for(child / "ready", process)
    process.send_signal(signal.SIGINT)
    wait_for(child / "recorded", process)  # handled: the next one is a signal of its own
    process.send_signal(signal.SIGINT)
    time.sleep(0.2)  # handled by now, or soon after: ignored either way
    (child / "go").touch()
    code, err = ended(process)
    assert code == -signal.SIGINT, err[-3000:]
    assert "runmodel.Interrupted: interrupted: Ctrl-C (after step 3)" in err, err[-3000:]
    assert "ckpt-00000-0000000003.pt" in checkpoints(child)

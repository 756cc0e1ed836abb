"""A real Ctrl-C (SIGINT) in the middle of a run: teardown runs, the interrupt propagates."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import helpers

SCRIPT = textwrap.dedent("""
    import sys, time
    import runmodel

    class Endless(runmodel.Model):
        def step(self, batch):
            time.sleep(0.001)

        def run(self, runstep, steps=None):
            for epoch in runstep.epochs():
                i = 0
                while True:
                    runstep(i)
                    i += 1

        def teardown(self):
            print("model.teardown ran", flush=True)

    engine = runmodel.Engine()
    engine.on("runstep", lambda e: print("ready", flush=True), once=2)  # at step 2
    engine.on("exception", lambda e: print("exception:", type(e.state.error).__name__,
                                           flush=True))
    # the signal may land before or after step 2's counter moves on: either is >= 2
    engine.on("teardown", lambda e: print("teardown hook after step 2:", e.state.step >= 2,
                                          flush=True))
    engine.run(Endless(), epochs=1)
""")


def test_sigint_mid_run_tears_down_and_reraises() -> None:
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=helpers.default_ctrl_c)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert out.splitlines() == ["exception: KeyboardInterrupt", "teardown hook after step 2: True",
                                "model.teardown ran"]
    assert "KeyboardInterrupt" in err and "runmodel: raised in" in err
    assert proc.returncode == -signal.SIGINT  # Python exits "killed by SIGINT" after cleanup

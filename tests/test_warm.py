"""The suite's own launcher (``warm``): its zygote serves every test of a pytest process,
whichever thread started it, is started again where it was killed, and ends with that
process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

TESTS = Path(__file__).parent

#: A test process whose first warm child is started from a thread that then ends (as a
#: module's shared launch does), then starts another from the main thread.
SCRIPT = f"""
import sys, threading
sys.path.insert(0, {str(TESTS)!r})
import warm
said = []
def first():
    said.append(warm.run([sys.executable, "-c", "print('first')"], capture_output=True,
                         text=True, timeout=120).stdout.strip())
thread = threading.Thread(target=first)
thread.start(); thread.join()
second = warm.run([sys.executable, "-c", "print('second')"], capture_output=True, text=True,
                  timeout=120).stdout.strip()
first_zygote = warm._zygote.process
first_zygote.kill()  # from outside (the OOM killer, say): the next child gets a new one
first_zygote.wait()
third = warm.run([sys.executable, "-c", "print('third')"], capture_output=True, text=True,
                 timeout=120).stdout.strip()
print(*said, second, third, warm._zygote.process.pid, flush=True)
sys.stdin.read()  # until the test kills it
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"  # a zombie has ended; only its parent's wait is missing


def test_the_zygote_outlives_its_thread_comes_back_if_killed_and_ends_with_its_process() -> None:
    process = subprocess.Popen(
        [sys.executable, "-c", SCRIPT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "RUNMODEL_TESTS_COLD": "0"},
    )
    try:
        assert process.stdout is not None
        first, second, third, zygote = process.stdout.readline().split()
        assert (first, second, third) == ("first", "second", "third")
        assert _alive(int(zygote))
    finally:
        process.kill()  # SIGKILL: no exit handler of its runs
        process.wait()
    deadline = time.monotonic() + 60
    while _alive(int(zygote)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(int(zygote)), "the zygote outlived its test process"

"""What the sweep tests share: a config of a small classifier (``clusters.py``) with a
``[sweep]`` table, the study read back from its storage, the sweep command as a real
process, and a gate pack that holds a trial where a test kills something."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna

import warm as subprocess
from helpers import finish_group

MODEL = Path(__file__).resolve().parent / "clusters.py"

TWO_PARAMS = """[sweep]
metric = "eval_accuracy"
trials = 3
[sweep.params]
"optimizer.args.lr" = { log_uniform = [1e-3, 3e-2] }
"model.args.hidden" = { int = [16, 96] }
"""


def write_config(folder: Path, sweep: str, epochs: int = 1, gate: bool = False) -> Path:
    """``folder/search.toml``: the clusters model (8 steps an epoch), with ``sweep``
    after it; ``gate``: with the Gate pack (``GATE``)."""
    path = folder / "search.toml"
    imports = [str(MODEL)]
    packs = ""
    if gate:
        (folder / "gate.py").write_text(GATE)
        imports.insert(0, "gate.py")
        packs = '[[packs]]\ntype = "gate"\n'
    path.write_text(f"""imports = {json.dumps(imports)}
epochs = {epochs}
seed = 0
[model]
type = "clusters"
args = {{ hidden = 32 }}
[optimizer]
type = "adam"
args = {{ lr = 0.005 }}
{packs}{sweep}""")
    return path


# A pack that holds a trial at its second epoch's start (its first epoch saved) where a
# test kills something: no race with the trial's own pace. GATE: a file that gets one
# line (the pid) for each trial that comes by; the first GATE_PASS pass, the others wait
# until the file GATE_RELEASE exists; GATE_HOST: only on that host name.
GATE = """
import os, socket, time
import runmodel

class Gate(runmodel.Pack):
    name = "gate"

    @runmodel.hook("epoch_start")
    def hold(self, engine):
        path = os.environ.get("GATE")
        host = os.environ.get("GATE_HOST")
        if not path or engine.state.epoch != 1 or host not in (None, socket.gethostname()):
            return
        with open(path, "a") as file:
            file.write(f"{os.getpid()}\\n")
        with open(path) as file:
            if len(file.readlines()) <= int(os.environ.get("GATE_PASS", "0")):
                return
        release = os.environ.get("GATE_RELEASE", "")
        while not os.path.exists(release):
            time.sleep(0.05)

runmodel.register_pack("gate", Gate)
"""


def trials(folder: Path, storage: str | None = None) -> list[optuna.trial.FrozenTrial]:
    """The trials of the sweep in ``folder`` (its journal, or the database ``storage``)."""
    if storage is None:
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        found: Any = JournalStorage(JournalFileBackend(str(folder / "study.journal")))
    else:
        found = storage
    return optuna.load_study(study_name=folder.name, storage=found).trials


def states(folder: Path, storage: str | None = None) -> list[str]:
    return [t.state.name for t in trials(folder, storage)]


def run_folders(folder: Path) -> list[Path]:
    return sorted(p.parent for p in folder.glob("*/config.json"))


def command(
    *args: str, cwd: Path, prefix: tuple[str, ...] = (), output: Path | None = None, **env: str
) -> subprocess.Popen[str]:
    """``runmodel ARGS`` in a session of its own (killed with its trials); its stdout
    into ``output`` where given (a test reads it while it runs)."""
    out: Any = subprocess.PIPE if output is None else open(output, "w")  # noqa: SIM115
    try:
        return subprocess.Popen(
            [*prefix, sys.executable, "-m", "runmodel", *args],
            cwd=cwd,
            text=True,
            stdout=out,
            stderr=subprocess.PIPE,
            env={**os.environ, "OMP_NUM_THREADS": "1", **env},
            start_new_session=True,
        )
    finally:
        if output is not None:
            out.close()


def finish(process: subprocess.Popen[str]) -> tuple[str, str]:
    return finish_group(process, 300)


def wait_for(condition: Callable[[], bool], what: str, limit_s: float = 240) -> None:
    """Wait until ``condition()``; ``limit_s`` is far above what it needs (a hung run
    fails the test rather than the suite)."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"not seen in {limit_s} s: {what}"
        time.sleep(0.05)


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0

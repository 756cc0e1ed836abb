"""``runmodel resume`` of a run that needs torchrun (issue 29): a one-process ``fsdp`` config
run whose status is damaged continues under torchrun again, as its config says it must,
with no launcher option given. Real ``runmodel`` processes, a real torchrun launch (one
process, gloo on the CPU)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from runmodel.runs import read_status

import warm as subprocess
from helpers import with_child_net

LIMIT_S = 300

NET = with_child_net("""\
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import runmodel

N, EVAL_N, FEATURES, CLASSES = 16, 8, 6, 3  # 4 steps an epoch

CHILD_NET

runmodel.register_model("resume_relaunch_net", Net)
""")

CONFIG = """\
imports = ["net.py"]
epochs = 1
seed = 0
backend = {{ type = "fsdp" }}
[model]
type = "resume_relaunch_net"
"""


def runmodel_command(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("TORCHELASTIC_RUN_ID", None)
    return subprocess.run(
        [sys.executable, "-m", "runmodel", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
    )


def test_a_one_process_fsdp_run_resumes_under_torchrun_whatever_its_status_says(
    tmp_path: Path,
) -> None:
    (tmp_path / "net.py").write_text(NET)
    (tmp_path / "fsdp.toml").write_text(CONFIG.format())
    first = runmodel_command(
        tmp_path, "run", "fsdp.toml", "--nproc-per-node", "1", "--no-progress", "--json"
    )
    assert first.returncode == 0, first.stderr[-3000:]
    [run_dir] = (tmp_path / "runs").iterdir()
    status = json.loads((run_dir / "status.json").read_text())
    assert (status["status"], status["backend"], status["world_size"]) == ("finished", "fsdp", 1)
    # a status cut short (as a full disk once left it): it says nothing of the run's world
    (run_dir / "status.json").write_text(json.dumps(status)[:40])
    assert read_status(run_dir).get("world_size") is None
    resumed = runmodel_command(
        tmp_path, "resume", str(run_dir), "--epochs", "2", "--no-progress", "--json"
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    result = json.loads(resumed.stdout)
    assert (result["ended"], result["epochs"], result["steps"]) == ("completed", 2, 8)
    status = json.loads((run_dir / "status.json").read_text())
    assert (status["status"], status["backend"], status["world_size"], status["epochs"]) == (
        "finished",
        "fsdp",
        1,
        2,
    )

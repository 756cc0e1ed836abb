"""The batch script of ``docs/preemption.md`` under a real SLURM, opt-in (``pytest -m
slurm``): one node on 127.0.0.1 (``slurmctld``, ``slurmd`` and ``munged`` from Debian's
``slurm-wlm`` and ``munge``, as root), its state in a temporary folder. The test installs
nothing: without the daemons, or not as root, it is skipped and says why.

The script's job is requeued from outside (``scontrol requeue``), preempted by a job of a
partition of higher priority, sent its time limit's signal (``scancel --batch
--signal=USR1``: what ``--signal=B:USR1@N`` does), and cancelled (``scancel
--signal=TERM``: it saves and ends, not requeued; ``sbatch script --resume`` continues
it). The finished run is the straight run's, bit for bit: its weights, ``metrics.json``
and every number of ``run.log``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.slurm

DOCS = Path(__file__).resolve().parents[2] / "docs" / "preemption.md"
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "scontrol", "scancel", "squeue", "sinfo")
NPROC = 2  # the script's --nproc-per-node (and --cpus-per-task)
CRED_EXPIRE = 10  # s; a requeued job starts again this long (+1) after it ended (120 s by default)
WAIT = 300  # s for anything one job does
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8"}
ENV.pop("TORCHELASTIC_RUN_ID", None)

MODEL = textwrap.dedent('''
    """A small classifier registered as "tiny": 256 samples in batches of 8."""
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
            x = torch.randn(256, 8, generator=g)
            y = (x[:, 0] + x[:, 1] > 0).long()
            self.train_data = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True,
                                         generator=torch.Generator().manual_seed(1))
            self.eval_data = DataLoader(TensorDataset(x[:32], y[:32]), batch_size=16)
            self.optimizer = torch.optim.SGD(self.module.parameters(), lr=0.1)
            self.loss_fn = nn.CrossEntropyLoss()


    runmodel.register_model("tiny", Tiny)


    def configure(engine):
        """Evaluate every epoch; each step PAUSE s long, said by rank 0 with the job's
        restart count ("step 12 of start 1")."""
        engine.attach(Evaluate())
        pause = float(os.environ.get("PAUSE", "0"))
        start = os.environ.get("SLURM_RESTART_COUNT", "0")

        @engine.on("runstep")
        def slowly(engine):
            time.sleep(pause)
            if engine.state.rank == 0:
                print(f"step {engine.state.step} of start {start}", flush=True)
''')

CONFIG = textwrap.dedent("""
    imports = ["tiny.py"]
    epochs = 3

    [model]
    type = "tiny"
""")


def documented_script() -> str:
    """The batch script of docs/preemption.md, for this machine: its config, NPROC
    processes, no GPU."""
    [script] = re.findall(r"```bash\n(#!/bin/bash\n#SBATCH.*?)```", DOCS.read_text(), re.S)
    assert "--nproc-per-node 4" in script and "--cpus-per-task=4" in script, script
    script = script.replace("--nproc-per-node 4", f"--nproc-per-node {NPROC}")
    script = script.replace("--cpus-per-task=4", f"--cpus-per-task={NPROC}")
    script = re.sub(r"#SBATCH --gres=.*\n", "", script)
    return script.replace("digits.toml", "run.toml")


class Slurm:
    """A one-node SLURM the tests started: its commands, with its configuration."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.env = {**ENV, "SLURM_CONF": str(folder / "slurm.conf")}
        self.job_logs: list[Path] = []  # shown, with the daemons' logs, when a wait fails

    def __call__(self, *command: str, check: bool = True, **run: Any) -> str:
        run.setdefault("env", self.env)
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, **run)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)}: exit {done.returncode}: {done.stderr}")
        return done.stdout

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields of the job."""
        text = self("scontrol", "show", "job", "-o", job_id)
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def wait_for(self, what: str, check: Any, limit_s: float = WAIT) -> Any:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if found := check():
                return found
            time.sleep(0.5)
        logs = "".join(
            f"\n--- {log.name}\n" + log.read_text()[-3000:]
            for log in [*sorted(self.folder.glob("*.log")), *self.job_logs]
            if log.exists()
        )
        raise AssertionError(f"SLURM: no {what} within {limit_s:g} s{logs}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _conf(folder: Path) -> str:
    host, cpus = socket.gethostname(), os.cpu_count() or 1
    return textwrap.dedent(f"""
        ClusterName=runmodeltest
        SlurmctldHost={host}(127.0.0.1)
        SlurmctldPort={_free_port()}
        SlurmdPort={_free_port()}
        SlurmUser=root
        SlurmdUser=root
        AuthType=auth/munge
        CredType=cred/munge
        AuthInfo=socket={folder}/munge.socket,cred_expire={CRED_EXPIRE}
        StateSaveLocation={folder}/state
        SlurmdSpoolDir={folder}/spool
        SlurmctldPidFile={folder}/slurmctld.pid
        SlurmdPidFile={folder}/slurmd.pid
        SlurmctldLogFile={folder}/slurmctld.log
        SlurmdLogFile={folder}/slurmd.log
        ProctrackType=proctrack/linuxproc
        TaskPlugin=task/none
        JobAcctGatherType=jobacct_gather/none
        AccountingStorageType=accounting_storage/none
        MpiDefault=none
        SwitchType=switch/none
        SelectType=select/linear
        SchedulerParameters=sched_interval=2
        ReturnToService=2
        KillWait=30
        MinJobAge=3600
        JobRequeue=1
        PreemptType=preempt/partition_prio
        PreemptMode=REQUEUE
        NodeName=node NodeHostname={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
        PartitionName=low Nodes=node Default=YES PriorityTier=1 PreemptMode=REQUEUE GraceTime=60
        PartitionName=high Nodes=node PriorityTier=2 PreemptMode=OFF
    """)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slurm]:
    """munged, slurmctld and slurmd, started here and stopped (by their pids) at the end."""
    missing = [name for name in (*DAEMONS, *CLIENTS) if shutil.which(name) is None]
    if missing:
        pytest.skip(
            f"no SLURM here: {', '.join(missing)} not found (Debian: apt-get install "
            f"slurm-wlm munge)"
        )
    if os.geteuid() != 0:
        pytest.skip("a one-node SLURM needs root (slurmd starts the jobs' processes)")
    if (os.cpu_count() or 1) < NPROC:
        pytest.skip(f"the script's run needs {NPROC} CPUs")
    folder = tmp_path_factory.mktemp("slurm")
    for name in ("state", "spool"):
        (folder / name).mkdir()
    key = folder / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    (folder / "slurm.conf").write_text(_conf(folder))
    cluster = Slurm(folder)
    started: list[subprocess.Popen[bytes]] = []

    def start(*command: str, log: str) -> None:
        with open(folder / log, "wb") as out:
            started.append(
                subprocess.Popen(command, env=cluster.env, stdout=out, stderr=subprocess.STDOUT)
            )

    conf = str(folder / "slurm.conf")
    try:
        start(
            "munged", "--foreground", "--force", f"--socket={folder}/munge.socket",
            f"--key-file={key}", f"--pid-file={folder}/munged.pid",
            f"--seed-file={folder}/munged.seed", f"--log-file={folder}/munged.log",
            log="munged.out.log",
        )  # fmt: skip
        cluster.wait_for("munge socket", (folder / "munge.socket").exists, 30)
        start("slurmctld", "-D", "-i", "-f", conf, log="slurmctld.out.log")
        start("slurmd", "-D", "-N", "node", "-f", conf, log="slurmd.out.log")
        cluster.wait_for(
            "idle node",
            lambda: cluster("sinfo", "-h", "-o", "%t", check=False).strip() == "idle",
            60,
        )
        yield cluster
    finally:
        if started:
            jobs = cluster("squeue", "-h", "-o", "%i", check=False).split()
            if jobs:
                cluster("scancel", "--full", "--signal=KILL", *jobs, check=False)
                cluster("scancel", *jobs, check=False)
                deadline = time.monotonic() + 60  # their processes end before slurmd does
                while time.monotonic() < deadline and cluster("squeue", "-h", check=False):
                    time.sleep(1)
        for daemon in reversed(started):
            daemon.terminate()
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("slurm-project")
    (folder / "tiny.py").write_text(MODEL)
    (folder / "run.toml").write_text(CONFIG)
    (folder / "digits.sh").write_text(documented_script())
    return folder


def _steps_of_start(log: Path, start: int) -> int:
    text = log.read_text() if log.exists() else ""
    return len(re.findall(rf"^step \d+ of start {start}$", text, re.M))


def _numbers(log: str) -> list[str]:
    """What a run log records of the run: each epoch's line (its step, loss and metrics)
    and its last line, without their times."""
    lines = [line.split(" ", 2)[2] for line in log.splitlines()]
    return [line for line in lines if line.startswith("epoch ")] + lines[-1:]


def test_the_documented_script_requeues_resumes_and_ends_as_the_straight_run(
    slurm: Slurm, project: Path
) -> None:
    straight = subprocess.Popen(
        ["runmodel", "run", "run.toml", "--nproc-per-node", str(NPROC),
         "--runs-dir", "runs-straight", "--no-progress"],
        cwd=project, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    env = {**slurm.env, "PAUSE": "0.3"}
    job = slurm("sbatch", "--parsable", "digits.sh", cwd=project, env=env).strip()
    log = project / f"digits-{job}.log"
    slurm.job_logs.append(log)
    said: list[str] = []

    def progressed(start: int) -> None:
        """The job's start number ``start`` runs, and its run took two steps."""
        slurm.wait_for(f"two steps of start {start}", lambda: _steps_of_start(log, start) >= 2)

    def restarted(start: int) -> None:
        slurm.wait_for(f"start {start}", lambda: slurm.job(job)["Restarts"] == str(start))
        said.append(f"start {start} at {time.strftime('%T')}")

    progressed(0)
    slurm("scontrol", "requeue", job)  # from outside: SLURM requeues it
    restarted(1)
    progressed(1)
    high = slurm(
        "sbatch",
        "--parsable",
        "--partition=high",
        "--output=/dev/null",
        "--wrap=sleep 1",
        cwd=project,
    ).strip()  # preempts the job: SIGTERM to its srun step at once, the script requeues it
    restarted(2)
    slurm.wait_for("the preempting job's end", lambda: slurm.job(high)["JobState"] == "COMPLETED")
    progressed(2)
    slurm("scancel", "--batch", "--signal=USR1", job)  # what --signal=B:USR1@N sends
    restarted(3)
    progressed(3)
    slurm("scancel", "--signal=TERM", job)  # a user's cancel: the run saves, the job ends
    ended = slurm.wait_for(
        "the cancelled job's end",
        lambda: (j := slurm.job(job))["JobState"] not in ("RUNNING", "COMPLETING") and j,
    )
    assert (ended["JobState"], ended["ExitCode"], ended["Restarts"]) == ("FAILED", "143:0", "3")
    time.sleep(CRED_EXPIRE + 5)
    assert slurm.job(job)["JobState"] == "FAILED"  # and not requeued

    text = log.read_text()
    stops = re.findall(r"runmodel: (\w+) stopped the run after step (\d+); saved", text)
    assert [sig for sig, _ in stops] == ["SIGTERM", "SIGTERM", "SIGUSR1", "SIGTERM"], text
    assert text.count("preempted by") == 4, text  # one line for each stop, not one a process

    again = slurm("sbatch", "--parsable", "digits.sh", "--resume", cwd=project, env=env).strip()
    done = slurm.wait_for(
        "the continued job's end",
        lambda: (
            (j := slurm.job(again))["JobState"] not in ("PENDING", "RUNNING", "COMPLETING") and j
        ),
    )
    second = (project / f"digits-{again}.log").read_text()
    assert (done["JobState"], done["ExitCode"]) == ("COMPLETED", "0:0"), second

    out, _ = straight.communicate(timeout=WAIT)
    assert straight.returncode == 0, out
    [reference] = (project / "runs-straight").iterdir()
    [run] = (project / "runs").iterdir()
    assert reference.name == run.name
    assert json.loads((run / "status.json").read_text())["status"] == "finished"
    a = torch.load(run / "model.pt", weights_only=True)
    b = torch.load(reference / "model.pt", weights_only=True)
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
    metrics = [json.loads((r / "metrics.json").read_text())["metrics"] for r in (run, reference)]
    numbers = [_numbers((r / "run.log").read_text()) for r in (run, reference)]
    print(
        f"\nSLURM job {job}: {', '.join(said)}; stopped after steps "
        f"{[int(step) for _, step in stops]} by {[sig for sig, _ in stops]}; continued as job "
        f"{again}; weights bit-identical to the straight run's ({len(a)} tensors); metrics "
        f"{metrics[0]} (straight: {metrics[1]}); run.log {numbers[0]} (straight: {numbers[1]})"
    )
    assert metrics[0] == metrics[1]
    assert numbers[0] and numbers[0] == numbers[1]

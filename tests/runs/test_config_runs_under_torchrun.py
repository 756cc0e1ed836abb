"""Config runs in several processes: ``runmodel run CONFIG --nproc-per-node 2`` in real
torchrun processes (gloo, CPU), and ``runmodel resume`` of one.

The launches are started once for the module, together, and shared: a straight 3-epoch
ddp run, a 2-epoch fsdp run, and the straight run's config again with rank 1 SIGKILLed
in epoch 2 (then resumed with ``runmodel resume RUN_DIR``, which starts it again in 2
processes). Usage errors are checked in this process (they come before any launch).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from runmodel import cli
from runmodel.checkpoint.names import is_sharded
from runmodel.checkpoint.sharded import read_whole
from runmodel.config.registry import registries

import warm as subprocess
from helpers import with_child_net

LIMIT_S = 180

NET = with_child_net(
    textwrap.dedent('''
    """A tiny classifier, and which process is which."""
    import os
    import signal

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import runmodel

    N, EVAL_N, FEATURES, CLASSES = 32, 10, 6, 3  # 4 steps an epoch in each of 2 processes


    CHILD_DATASETS


    class Net(runmodel.TorchModel):
        def __init__(self, device=None, init_options=None):
            super().__init__(device, init_options)
            torch.manual_seed(0)
            self.module = nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(),
                                        nn.Linear(16, CLASSES))

        def setup(self, setup_options=None):
            train, test = datasets()
            self.optimizer = torch.optim.SGD(self.module.parameters(), lr=0.1, momentum=0.9)
            self.loss_fn = nn.CrossEntropyLoss()
            self.train_data = DataLoader(train, batch_size=4, shuffle=True)
            self.eval_data = DataLoader(test, batch_size=4)


    runmodel.register_model("tinynet", Net)


    def configure(engine):
        rank = os.environ.get("RANK")
        if rank is not None:  # the test compares the status's pid with rank 0's
            with open(f"rank{rank}.pid", "w") as f:
                f.write(str(os.getpid()))
        kill = os.environ.get("KILL_RANK_AT")  # RANK:STEP
        if kill:
            who, step = map(int, kill.split(":"))

            @engine.on("step_start", rank=who, once=step)
            def die(engine):  # as the OOM killer would
                os.kill(os.getpid(), signal.SIGKILL)
''')
)

CONFIG = 'imports = ["{net}"]\nepochs = {epochs}\nseed = 0\n{backend}\n[model]\ntype = "tinynet"\n'


def runmodel_command(cwd: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    environ = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    environ.pop("TORCHELASTIC_RUN_ID", None)
    return subprocess.Popen(
        [sys.executable, "-m", "runmodel", *args],
        cwd=cwd,
        env=environ,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )  # killed with its processes


def end(process: subprocess.Popen[str]) -> None:
    """End a launch: SIGTERM first, on which torchrun ends the processes it started (they
    run in sessions of their own, out of reach of a signal to the launch's group)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


def finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    try:
        out, err = process.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        end(process)
        out, err = process.communicate()
        return -1, out, err + f"\n(the launch did not end within {LIMIT_S}s)"
    return process.returncode, out, err


class Runs:
    """The launches, started together; awaited when a test needs one."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "net.py").write_text(NET)
        (root / "ddp.toml").write_text(CONFIG.format(net=root / "net.py", epochs=3, backend=""))
        (root / "fsdp.toml").write_text(
            CONFIG.format(net=root / "net.py", epochs=2, backend='backend = { type = "fsdp" }')
        )
        self.dirs = {name: root / name for name in ("straight", "fsdp", "killed")}
        for folder in self.dirs.values():
            folder.mkdir()
        self.results: dict[str, tuple[int, str, str]] = {}
        self.killed_status: dict[str, Any] = {}  # as the killed run left it
        self.closing = False
        self.processes: list[subprocess.Popen[str]] = []
        common = ("--nproc-per-node", "2", "--no-progress", "--json", "--runs-dir", "runs")
        self.threads = [
            self._start("straight", "run", str(root / "ddp.toml"), *common),
            self._start("fsdp", "run", str(root / "fsdp.toml"), *common),
            self._start(
                "killed",
                "run",
                str(root / "ddp.toml"),
                *common,
                KILL_RANK_AT="1:6",
                then=self._resume,
            ),
        ]

    def _start(self, name: str, *args: str, then: Any = None, **env: str) -> threading.Thread:
        def await_it() -> None:
            process = runmodel_command(self.dirs[name], *args, **env)
            self.processes.append(process)
            self.results[name] = finish(process)
            if then is not None:
                then()

        thread = threading.Thread(target=await_it, daemon=True)
        thread.start()
        return thread

    def _resume(self) -> None:
        if self.closing:
            return
        self.killed_status = json.loads((self.run_dir("killed") / "status.json").read_text())
        process = runmodel_command(
            self.dirs["killed"], "resume", str(self.run_dir("killed")), "--no-progress", "--json"
        )
        self.processes.append(process)
        self.results["resumed"] = finish(process)

    def result(self, name: str) -> tuple[int, str, str]:
        for thread in self.threads:
            if name not in self.results:
                thread.join(timeout=2 * LIMIT_S)
        assert name in self.results, f"the {name} launch did not end"
        return self.results[name]

    def ok(self, name: str) -> dict[str, Any]:
        code, out, err = self.result(name)
        assert code == 0, err[-4000:]
        result: dict[str, Any] = json.loads(out)
        return result

    def run_dir(self, name: str) -> Path:
        found = sorted((self.dirs[name] / "runs").iterdir())
        assert len(found) == 1, found
        return found[0]

    def close(self) -> None:
        self.closing = True
        for _ in range(50):  # a resume may start while the others are ended
            for process in self.processes:
                end(process)
            for thread in self.threads:
                thread.join(timeout=0.2)
            if not any(thread.is_alive() for thread in self.threads):
                return


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    made = Runs(tmp_path_factory.mktemp("config_torchrun"))
    try:
        yield made
    finally:
        made.close()


def weights(path: Path) -> dict[str, torch.Tensor]:
    loaded: dict[str, torch.Tensor] = torch.load(path, weights_only=True)
    return loaded


def test_a_ddp_config_run_in_2_processes_is_one_folder_that_rank_0_alone_wrote(runs: Runs) -> None:
    result = runs.ok("straight")
    assert (result["ended"], result["steps"], result["epochs"]) == ("completed", 12, 3)
    run_dir = runs.run_dir("straight")
    status = json.loads((run_dir / "status.json").read_text())
    assert status["status"] == "finished"
    assert (status["world_size"], status["nproc_per_node"], status["backend"]) == (2, 2, "ddp")
    rank_0 = int((runs.dirs["straight"] / "rank0.pid").read_text())
    assert status["pid"] == rank_0 != int((runs.dirs["straight"] / "rank1.pid").read_text())
    log = (run_dir / "run.log").read_text().splitlines()
    assert len(log) == 5, log  # one writer: each line once
    assert log[0].endswith(" start train: 0 epochs, 0 steps done")
    assert [" ".join(line.split()[2:6]) for line in log[1:4]] == [
        "epoch 1 step 4",
        "epoch 2 step 8",
        "epoch 3 step 12",
    ]
    assert log[4].endswith(" end: 3 epochs, 12 steps done")
    assert json.loads((run_dir / "config.json").read_text())["backend"]["type"] == "ddp"
    assert sorted(p.name for p in (run_dir / "checkpoint").iterdir()) == [
        "ckpt-00002-0000000008.pt",
        "ckpt-00003-0000000012.pt",
    ]
    assert (
        result["metrics"]["eval_accuracy"]
        == json.loads((run_dir / "metrics.json").read_text())["metrics"]["eval_accuracy"]
    )


def test_an_fsdp_run_leaves_plain_full_weights_and_runmodel_eval_uses_them(
    runs: Runs, capsys: pytest.CaptureFixture[str]
) -> None:
    result = runs.ok("fsdp")
    run_dir = runs.run_dir("fsdp")
    status = json.loads((run_dir / "status.json").read_text())
    assert (status["status"], status["backend"], status["world_size"]) == ("finished", "fsdp", 2)
    last = run_dir / "checkpoint" / "ckpt-00002-0000000008"
    assert is_sharded(last)
    # the last checkpoint (sharded) by default, and the exported final weights
    for asked, used in (([], last), (["--checkpoint", "model.pt"], run_dir / "model.pt")):
        code = cli.main(["eval", str(run_dir), "--json", *asked])  # registers the model here
        out, err = capsys.readouterr()
        assert code == 0, err
        assert f"with {used}\n" in err
        evaluated = json.loads(out)["metrics"]
        assert evaluated["accuracy"] == pytest.approx(result["metrics"]["eval_accuracy"], abs=1e-6)
        assert evaluated["loss"] == pytest.approx(result["metrics"]["eval_loss"], rel=1e-5)
    module = registries["model"].get("tinynet")("cpu").module
    module.load_state_dict(weights(run_dir / "model.pt"))  # the bare module, strict
    sharded = read_whole(last, optimizer=False)["module"]
    for name, value in module.state_dict().items():
        assert torch.equal(value, sharded[name]), name


def test_a_killed_rank_fails_the_run_and_its_status_names_that_rank(runs: Runs) -> None:
    code, _, err = runs.result("killed")
    assert code == 1, err[-3000:]
    assert "runmodel run: error: process rank 1 failed (killed by SIGKILL)" in err
    runs.result("resumed")
    status = runs.killed_status  # before the resume
    assert status["status"] == "failed"
    assert status["failed_rank"] == 1
    assert status["error"] == "process rank 1 failed (killed by SIGKILL)"


def test_resume_starts_again_in_2_processes_and_ends_as_the_uninterrupted_run(runs: Runs) -> None:
    result = runs.ok("resumed")
    assert (result["ended"], result["steps"], result["epochs"]) == ("completed", 12, 3)
    run_dir = runs.run_dir("killed")
    status = json.loads((run_dir / "status.json").read_text())
    assert (status["status"], status["world_size"]) == ("finished", 2)
    assert Path(status["resumed_from"]).parent.name == "checkpoint"
    resumed, straight = (
        weights(run_dir / "model.pt"),
        weights(runs.run_dir("straight") / "model.pt"),
    )
    assert resumed.keys() == straight.keys()
    for name, value in resumed.items():
        assert torch.equal(value, straight[name]), name  # bit-identical


def test_a_config_run_continues_in_another_number_of_processes_saying_so(
    runs: Runs, tmp_path: Path
) -> None:
    """The fsdp run of 2 processes, extended by an epoch in 1: its checkpoint resharded
    (issue 22), the world-size line on stderr, the status saying 1 process."""
    runs.ok("fsdp")
    run_dir = tmp_path / "runs" / runs.run_dir("fsdp").name
    shutil.copytree(runs.run_dir("fsdp"), run_dir)  # the fsdp test reads the original
    process = runmodel_command(
        tmp_path,
        "resume",
        str(run_dir),
        "--nproc-per-node",
        "1",
        "--epochs",
        "3",
        "--no-progress",
        "--json",
    )
    code, out, err = finish(process)
    assert code == 0, err[-4000:]
    assert "runmodel: resuming in 1 process(es) a checkpoint written by 2" in err, err
    assert (json.loads(out)["epochs"], json.loads(out)["ended"]) == (3, "completed")
    status = json.loads((run_dir / "status.json").read_text())
    assert (status["status"], status["world_size"], status["epochs"]) == ("finished", 1, 3)
    assert status["backend"] == "fsdp"  # a later resume relaunches under torchrun again


def test_a_conflicting_backend_or_a_run_there_already_is_refused_with_exit_2(
    runs: Runs, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        cli.main(["run", str(runs.root / "fsdp.toml"), "--nproc-per-node", "2", "--backend", "ddp"])
        == 2
    )
    err = capsys.readouterr().err
    assert "--backend ddp: the config names backend 'fsdp'" in err
    runs.ok("straight")  # found by rank 0 once launched: exit 2 through the launcher too
    again = runmodel_command(
        runs.dirs["straight"],
        "run",
        str(runs.root / "ddp.toml"),
        "--nproc-per-node",
        "2",
        "--runs-dir",
        "runs",
    )
    code, _, err = finish(again)
    assert code == 2, err[-3000:]
    assert "holds a run of this config already" in err, err[-3000:]


SWEEP = """imports = ["{net}"]
epochs = 3
seed = 0
[model]
type = "tinynet_sweep"
[optimizer]
type = "sgd"
args = {{ lr = 0.1, momentum = 0.9 }}
[[packs]]
type = "evaluate"
[sweep]
metric = "eval_loss"
direction = "min"
trials = 2
sampler = {{ type = "random" }}
pruner = {{ type = "median", args = {{ n_startup_trials = 1 }} }}
seed = 10  # the random sampler draws: lr 0.1, then 1e-7 (hopeless)
nproc_per_node = 2
[sweep.params]
"optimizer.args.lr" = {{ choice = [0.1, 1e-7] }}
"""


def test_a_sweep_trial_in_2_processes_is_pruned_on_every_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("optuna")
    import runmodel

    monkeypatch.chdir(tmp_path)  # the trials' working folder (net.py writes there)

    (tmp_path / "net.py").write_text(NET.replace('"tinynet"', '"tinynet_sweep"'))
    config = tmp_path / "search.toml"
    config.write_text(SWEEP.format(net=tmp_path / "net.py"))
    result = runmodel.sweep(config, runs_dir=tmp_path / "runs", echo=False)
    logs = "".join(p.read_text() for p in sorted(result.directory.glob("trial-*.log")))
    assert (result.complete, result.pruned, result.failed) == (1, 1, 0), logs[-4000:]
    assert result.best is not None and result.best["params"] == {"optimizer.args.lr": 0.1}
    pruned = [
        p
        for p in result.directory.iterdir()
        if (p / "config.json").is_file()
        and json.loads((p / "status.json").read_text())["status"] == "pruned"
    ]
    assert len(pruned) == 1
    status = json.loads((pruned[0] / "status.json").read_text())
    assert (status["world_size"], status["backend"]) == (2, "ddp")
    # both processes stopped after epoch 1 (one that went on would fail the run)
    assert json.loads((pruned[0] / "metrics.json").read_text())["epochs"] == 1

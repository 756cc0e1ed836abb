"""Run directories: what a config run writes, one directory per config, never overwritten,
restart and resume, status after errors, Ctrl-C and SIGKILL, and the command line on
configs (``runmodel run CONFIG``, ``runmodel runs``, ``runmodel resume``).

Each test writes a tiny model file that registers itself under a unique name, and TOML
configs that import it. Most runs are in-process (``runmodel.execute``, ``cli.main``);
real processes are used where the process matters: a first CLI run and a refused rerun,
a run killed with SIGKILL and resumed, and the digits example (started in the background
when this module's first test runs).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
import time
import types
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import runmodel
import runmodel.session.folder
from runmodel.cli import main
from runmodel.config.runconfig import RunConfig, load_config
from runmodel.runs import RunExists, execute, prepare, read_status, run_dir_for

import warm as subprocess
from helpers import RUN_FOLDER, make_data

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "examples" / "configs" / "digits.toml"
TIMEOUT = 120  # seconds, for any one command
ENV = {**os.environ, "PYTHONIOENCODING": "utf-8", "OMP_NUM_THREADS": "1"}
ENV.pop("TINY_SLEEP", None)
RUNMODEL = (sys.executable, "-m", "runmodel")

MODEL = '''\
"""A 3-class linear classifier on 4 fixed batches (registered as {name!r})."""

import os
import time

import torch
from torch import nn

import runmodel


def data():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 4, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    return x, y


class Tiny(runmodel.TorchModel):
    init_defaults = {{"fail_at": -1}}

    def __init__(self, device=None, init_options=None):
        super().__init__(device, init_options)
        torch.manual_seed(0)
        self.module = nn.Linear(4, 3)
        self.calls = 0

    def setup(self, setup_options=None):
        self.optimizer = torch.optim.Adam(self.module.parameters(), lr=0.5)  # the config's wins
        self.loss_fn = nn.CrossEntropyLoss()
        x, y = data()
        self.train_data = [(x[i:i + 8], y[i:i + 8]) for i in range(0, 32, 8)]
        self.eval_data = [(x[:16], y[:16]), (x[16:], y[16:])]

    def compute_output(self, batch):
        self.calls += 1
        if self.calls - 1 == self.init_options["fail_at"]:
            raise RuntimeError(f"boom at call {{self.calls - 1}}")
        time.sleep(float(os.environ.get("TINY_SLEEP", "0")))
        return self.module(batch[0])


runmodel.register_model({name!r}, Tiny)
'''


@dataclass
class Project:
    """A folder with the model file and the configs, and a runs root inside it."""

    dir: Path
    name: str

    @property
    def root(self) -> Path:
        return self.dir / "runs"

    def config(
        self,
        file: str = "config.toml",
        *,
        lr: float = 0.1,
        epochs: int = 3,
        seed: int = 0,
        packs: tuple[str, ...] = ("checkpoint", "tensorboard"),
        fail_at: int | None = None,
    ) -> Path:
        lines = [
            'imports = ["tiny.py"]',
            f"epochs = {epochs}",
            f"seed = {seed}",
            'device = "cpu"',
            "",
            "[model]",
            f'type = "{self.name}"',
        ]
        if fail_at is not None:
            lines.append(f"args = {{ fail_at = {fail_at} }}")
        lines += ["", "[optimizer]", 'type = "sgd"', f"args = {{ lr = {lr} }}"]
        if "checkpoint" in packs:
            lines += ["", "[[packs]]", 'type = "checkpoint"', 'args = { every = "1ep", keep = 2 }']
        if "tensorboard" in packs:
            lines += ["", "[[packs]]", 'type = "tensorboard"']
        path = self.dir / file
        path.write_text("\n".join(lines) + "\n")
        return path

    def load(self, **options: Any) -> RunConfig:
        return load_config(self.config(**options))


@pytest.fixture
def project(tmp_path: Path) -> Project:
    name = f"tiny-{uuid.uuid4().hex[:8]}"
    (tmp_path / "tiny.py").write_text(MODEL.format(name=name))
    return Project(tmp_path, name)


def snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``directory``: its bytes and modification time."""
    return {
        str(p.relative_to(directory)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def weights(directory: Path) -> dict[str, torch.Tensor]:
    return torch.load(directory / "model.pt", weights_only=True)


def assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert sorted(wa) == sorted(wb) == ["bias", "weight"]
    for key in wa:
        assert torch.equal(wa[key], wb[key]), key


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def cli_process(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RUNMODEL, *args],
        cwd=cwd,
        env=env or ENV,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=TIMEOUT,
    )


# The digits example: 3 epochs through the real command, in the background from the start.


@pytest.fixture(scope="module", autouse=True)
def digits_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    cwd = tmp_path_factory.mktemp("digits")
    out, err = open(cwd / "stdout", "w+"), open(cwd / "stderr", "w+")  # noqa: SIM115
    proc = subprocess.Popen(
        [*RUNMODEL, "run", str(DIGITS), "--runs-dir", str(cwd / "runs"), "--epochs", "3"],
        cwd=cwd,
        env=ENV,
        stdout=out,
        stderr=err,
    )
    try:
        yield {"proc": proc, "cwd": cwd, "stdout": out, "stderr": err}
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        out.close()
        err.close()


# -- what a run directory holds ------------------------------------------------------------


def test_execute_fills_the_run_directory(project: Project) -> None:
    config = project.load()
    engine = runmodel.Engine()
    losses: list[str] = []
    engine.on(
        "epoch_end", lambda e: losses.append(f"{e.state.metrics['loss']:.6g}"), reads="loss"
    )  # the epoch's mean loss, which the run log shows
    prepared = prepare(config, project.root, base=project.dir, engine=engine)
    directory = prepared.directory
    assert directory == project.root / config.run_name() == run_dir_for(config, project.root)
    assert re.fullmatch(rf"{project.name}_sgd-lr0\.1_{config.digest()}", directory.name)
    # prepare() only claims the directory: created, empty, nothing written yet
    assert directory.is_dir() and list(directory.iterdir()) == []
    started = time.time()
    result = prepared.run()
    assert (result.steps, result.epochs, result.ended) == (12, 3, "completed")
    # the files of every run folder (a script's too), its config beside them, and the
    # reserve a status write frees on a full disk
    assert sorted(os.listdir(directory)) == sorted([*RUN_FOLDER, "config.json"])

    assert read_json(directory / "config.json") == config.to_dict()
    assert RunConfig.from_dict(read_json(directory / "config.json")) == config

    status = read_json(directory / "status.json")
    assert sorted(status) == [
        "ended",
        "epochs",
        "extensions",
        "files",
        "host",
        "pid",
        "resumed_from",
        "run",
        "run_started",
        "started",
        "status",
        "steps",
    ]
    # the run's id and start, as every checkpoint records them; its best and last, named
    # inside the folder
    last = torch.load(directory / status["files"]["last_checkpoint"], weights_only=True)
    assert last["engine"]["run"]["id"] == status["run"] and status["epochs"] == 3
    assert status["status"] == "finished" and status["pid"] == os.getpid()
    record = read_json(directory / "run.json")
    assert status["host"] == socket.gethostname() and record["digest"] == config.digest()
    assert record["base"] == str(project.dir.resolve()) and status["resumed_from"] == ""
    assert record["kind"] == "config" and record["id"] == status["run"]
    assert started <= status["started"] <= status["ended"] <= time.time()
    assert read_status(directory) == status

    # model.pt: the trained weights; the eval metrics computed from them by hand
    trained = prepared.model.module.state_dict()
    saved = weights(directory)
    assert sorted(saved) == ["bias", "weight"]
    assert all(torch.equal(saved[k], trained[k]) for k in saved)
    module = nn.Linear(4, 3)
    module.load_state_dict(saved)
    [(x, y)] = make_data(1, 32, classes=3, seed=1)  # what tiny.py's data() returns
    with torch.no_grad():
        logits = module(x)
    accuracy = (logits.argmax(1) == y).double().mean().item()
    loss = nn.functional.cross_entropy(logits, y).item()
    metrics = read_json(directory / "metrics.json")
    assert sorted(metrics) == [
        "ended",
        "epochs",
        "files",
        "metrics",
        "reason",
        "seconds",
        "steps",
        "timings",
    ]
    assert (metrics["ended"], metrics["steps"], metrics["epochs"]) == ("completed", 12, 3)
    # loss: the last epoch's mean training loss (Progress and RunLog read it)
    assert sorted(metrics["metrics"]) == ["eval_accuracy", "eval_loss", "loss"]
    assert metrics["metrics"]["eval_accuracy"] == pytest.approx(accuracy, abs=1e-12)
    assert metrics["metrics"]["eval_loss"] == pytest.approx(loss, rel=1e-5)
    assert result.metrics == metrics["metrics"]
    torch.manual_seed(0)
    with torch.no_grad():
        untrained = nn.functional.cross_entropy(nn.Linear(4, 3)(x), y).item()
    assert loss < untrained - 0.1  # it learned something

    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d "
    log = (directory / "run.log").read_text().splitlines()
    assert len(log) == 5
    assert re.fullmatch(stamp + "start train: 0 epochs, 0 steps done", log[0])
    for epoch, line in enumerate(log[1:4]):
        assert re.fullmatch(
            stamp + re.escape(f"epoch {epoch + 1} step {4 * (epoch + 1)} loss {losses[epoch]}"),
            line,
        )
    assert re.fullmatch(stamp + "end: 3 epochs, 12 steps done", log[4])

    assert sorted(os.listdir(directory / "checkpoint")) == [
        "ckpt-00002-0000000008.pt",
        "ckpt-00003-0000000012.pt",
    ]
    [events] = os.listdir(directory / "tensorboard")
    assert events.startswith("events.out.tfevents.")


def test_a_config_without_packs_still_checkpoints_and_logs(project: Project) -> None:
    result, directory = execute(project.load(packs=()), project.root, base=project.dir)
    assert result.steps == 12
    assert sorted(os.listdir(directory)) == sorted([*RUN_FOLDER, "config.json"])
    # the defaults: every epoch, the newest 2
    assert sorted(os.listdir(directory / "checkpoint")) == [
        "ckpt-00002-0000000008.pt",
        "ckpt-00003-0000000012.pt",
    ]
    [events] = os.listdir(directory / "tensorboard")
    assert events.startswith("events.out.tfevents.")


# -- one directory per config ------------------------------------------------------------------


def test_the_same_config_is_the_same_directory_and_is_never_overwritten(project: Project) -> None:
    path = project.config()
    config = load_config(path)
    _, directory = execute(config, project.root, base=project.dir)
    # read again, or written as JSON in another key order: equal, the same directory
    as_json = project.dir / "config.json"
    as_json.write_text(json.dumps(dict(reversed(list(config.to_dict().items())))))
    for again in (load_config(path), load_config(as_json)):
        assert again == config and run_dir_for(again, project.root) == directory

    before = snapshot(directory)
    with pytest.raises(
        RunExists,
        match=r"holds a run of this config already \(status: "
        r"finished\).*runmodel resume .*--restart",
    ) as info:
        execute(load_config(as_json), project.root, base=project.dir)
    assert isinstance(info.value, FileExistsError)
    assert snapshot(directory) == before
    assert os.listdir(project.root) == [directory.name]


def test_different_configs_get_different_directories(project: Project) -> None:
    variants = [
        project.load(),
        project.load(lr=0.01),
        project.load(epochs=4),
        project.load(seed=1),
        project.load(packs=("checkpoint",)),
        project.load(fail_at=99),
    ]
    names = [c.run_name() for c in variants]
    assert len(set(names)) == len(names)
    assert len({c.digest() for c in variants}) == len(variants)
    assert names[1].startswith(f"{project.name}_sgd-lr0.01_")
    assert names[5].startswith(f"{project.name}-fail-at99_sgd-lr0.1_")
    _, first = execute(variants[0], project.root, base=project.dir)
    _, second = execute(variants[1], project.root, base=project.dir)
    assert first != second and sorted(os.listdir(project.root)) == sorted(names[:2])
    assert not (weights(first)["weight"] == weights(second)["weight"]).all()


def test_restart_moves_the_old_run_aside(project: Project) -> None:
    config = project.load()
    _, directory = execute(config, project.root, base=project.dir)
    before = snapshot(directory)
    old_status = read_json(directory / "status.json")
    result, again = execute(config, project.root, base=project.dir, restart=True)
    assert again == directory and result.steps == 12
    [old] = [p for p in project.root.iterdir() if p != directory]
    assert re.fullmatch(rf"{re.escape(directory.name)}\.old-\d{{8}}-\d{{6}}", old.name)
    assert snapshot(old) == before  # kept intact
    status = read_json(directory / "status.json")
    assert status["status"] == "finished" and status["started"] >= old_status["ended"]
    assert (directory / "run.log").read_text().count("start train") == 1  # a new log
    assert_same_weights(directory, old)  # the same config trains the same weights


def test_two_restarts_in_one_second_keep_both_old_runs(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    frozen = types.SimpleNamespace(strftime=lambda *args: "20250101-120000", time=time.time)
    monkeypatch.setattr(runmodel.session.folder, "time", frozen)  # both restarts in one second
    config = project.load(packs=())
    execute(config, project.root, base=project.dir)
    execute(config, project.root, base=project.dir, restart=True)
    execute(config, project.root, base=project.dir, restart=True)
    assert len(os.listdir(project.root)) == 3


# -- status after errors, interrupt, resume -----------------------------------------------------


def test_a_failing_run_is_marked_failed_and_the_error_propagates(project: Project) -> None:
    config = project.load(fail_at=5)
    directory = run_dir_for(config, project.root)
    with pytest.raises(RuntimeError, match="boom at call 5") as info:
        execute(config, project.root, base=project.dir)
    assert any("runmodel: raised in" in note for note in info.value.__notes__)
    status = read_status(directory)
    assert status["status"] == "failed"
    assert status["error"] == "RuntimeError: boom at call 5"
    assert status["started"] <= status["ended"]
    assert sorted(os.listdir(directory)) == [
        ".runmodel-reserve",
        "checkpoint",
        "config.json",
        "run.json",
        "run.log",
        "status.json",
        "tensorboard",
    ]
    assert os.listdir(directory / "checkpoint") == ["ckpt-00001-0000000004.pt"]
    last = (directory / "run.log").read_text().splitlines()[-1]
    assert last.endswith(" end: 1 epoch, 5 steps done: RuntimeError: boom at call 5")


def test_an_interrupted_run_resumes_from_its_newest_checkpoint(project: Project) -> None:
    config = project.load()
    engine = runmodel.Engine()

    def ctrl_c(engine: runmodel.Engine) -> None:
        raise KeyboardInterrupt

    engine.on("step_start", ctrl_c, once=6)  # step 6: the 3rd step of epoch 1
    prepared = prepare(config, project.root, base=project.dir, engine=engine)
    directory = prepared.directory
    with pytest.raises(KeyboardInterrupt):
        prepared.run()
    status = read_status(directory)
    assert status["status"] == "interrupted" and status["error"] == "KeyboardInterrupt: "
    assert not (directory / "metrics.json").exists() and not (directory / "model.pt").exists()
    assert (
        (directory / "run.log")
        .read_text()
        .splitlines()[-1]
        .endswith(" end: 1 epoch, 6 steps done: KeyboardInterrupt: ")
    )

    with pytest.raises(RunExists, match=r"status: interrupted"):
        execute(config, project.root, base=project.dir)
    result, again = execute(config, project.root, base=project.dir, resume=True)
    assert again == directory
    assert (result.steps, result.epochs, result.ended) == (12, 3, "completed")
    status = read_status(directory)
    assert status["status"] == "finished" and "error" not in status
    resumed_from = directory / status["resumed_from"]  # the file, named inside the folder
    assert resumed_from.parent == directory / "checkpoint"
    assert resumed_from.name.startswith("ckpt-")
    log = (directory / "run.log").read_text()
    assert "start train: 1 epoch, 4 steps done" in log and log.count("start train") == 2

    straight_result, straight = execute(config, project.dir / "straight", base=project.dir)
    assert_same_weights(directory, straight)
    assert result.metrics == straight_result.metrics
    assert read_json(directory / "metrics.json")["steps"] == 12


def test_resume_needs_a_run_and_a_checkpoint(project: Project) -> None:
    config = project.load(packs=())
    with pytest.raises(FileNotFoundError, match="no run to resume at"):
        execute(config, project.root, base=project.dir, resume=True)
    assert not project.root.exists()
    _, directory = execute(config, project.root, base=project.dir)
    for path in (directory / "checkpoint").iterdir():  # as if it died before the first one
        path.unlink()
    before = snapshot(directory)
    with pytest.raises(
        FileNotFoundError,
        match=r"has no checkpoint to resume from: the run "
        r"\(status finished\) ended before it wrote its first one; start it "
        r"again with --restart",
    ) as caught:
        execute(config, project.root, base=project.dir, resume=True)
    assert "checkpoint pack" not in str(caught.value)  # the config has one: no advice to add it
    assert snapshot(directory) == before
    with pytest.raises(FileNotFoundError, match="is not a run directory"):
        runmodel.runs.resume_dir(project.dir / "nothing")


def test_a_killed_run_is_interrupted_and_runmodel_resume_finishes_it(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = project.config(epochs=4)
    config = load_config(cfg)
    root = project.dir / "killed"
    directory = root / config.run_name()
    with open(project.dir / "killed.out", "w") as out:
        proc = subprocess.Popen(
            [*RUNMODEL, "run", str(cfg), "--runs-dir", str(root)],
            cwd=project.dir,
            env={**ENV, "TINY_SLEEP": "0.1"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + TIMEOUT
            while not list((directory / "checkpoint").glob("ckpt-*.pt")):
                assert proc.poll() is None, "the run ended before its first checkpoint"
                assert time.monotonic() < deadline
                time.sleep(0.02)
            proc.send_signal(signal.SIGKILL)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=TIMEOUT)
    assert proc.returncode == -signal.SIGKILL
    raw = read_json(directory / "status.json")
    assert raw["status"] == "running" and raw["pid"] == proc.pid  # nobody could update it
    assert read_status(directory)["status"] == "interrupted"  # the process is gone
    assert not (directory / "metrics.json").exists()
    for path in (directory / "checkpoint").glob("ckpt-*.pt"):
        assert torch.load(path, weights_only=True)["format"] == 2
    assert main(["runs", str(root)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["run", "status", "steps"]
    # an interrupted run shows the steps its run log got to
    assert table[2].split()[:2] == [directory.name, "interrupted"] and len(table) == 3
    logged = re.findall(r" step (\d+)", (directory / "run.log").read_text())[-1]
    assert table[2].split()[2] == logged

    resumed = cli_process("resume", str(directory), cwd=project.dir)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stderr.splitlines()[0] == (
        f"run directory: {directory} (resuming from {directory / 'checkpoint'})"
    )
    assert resumed.stdout.startswith("train: completed after 16 steps, 4 epochs in ")
    assert read_status(directory)["status"] == "finished"
    metrics = read_json(directory / "metrics.json")
    assert (metrics["steps"], metrics["epochs"]) == (16, 4)

    _, straight = execute(config, project.dir / "straight", base=project.dir)
    assert_same_weights(directory, straight)
    assert metrics["metrics"] == read_json(straight / "metrics.json")["metrics"]


# -- the command line on configs ------------------------------------------------------------------


def one_error_line(capsys: pytest.CaptureFixture[str], command: str = "run") -> str:
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    [line] = captured.err.splitlines()
    prefix = f"runmodel {command}: error: "
    assert line.startswith(prefix), line
    return line[len(prefix) :]


def test_cli_run_a_config_rerun_restart_set_and_runs(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = project.config()
    runs = project.dir / "cli-runs"
    directory = runs / load_config(cfg).run_name()
    first = cli_process("run", str(cfg), "--runs-dir", str(runs), cwd=project.dir)
    assert first.returncode == 0, first.stderr
    # a config run shows its progress: off a terminal, a line per epoch
    assert first.stderr.splitlines()[0] == f"run directory: {directory}"
    assert [
        re.sub(r"loss \S+  \(\S+s\)", "loss L (Ts)", line) for line in first.stderr.splitlines()[1:]
    ] == [f"train epoch {e}/3  step {4 * e}  loss L (Ts)" for e in range(1, 4)]  # from 1
    assert first.stdout.startswith("train: completed after 12 steps, 3 epochs in ")
    assert read_status(directory)["status"] == "finished"
    before = snapshot(directory)

    again = cli_process("run", str(cfg), "--runs-dir", str(runs), cwd=project.dir)
    assert again.returncode == 2 and again.stdout == ""
    assert "Traceback" not in again.stderr
    [line] = again.stderr.splitlines()
    assert line.startswith(
        f"runmodel run: error: {directory} holds a run of this config already (status: finished)"
    )
    assert f"runmodel resume {directory}" in line and "--restart" in line
    assert snapshot(directory) == before

    assert main(["run", str(cfg), "--runs-dir", str(runs), "--resume", "--restart"]) == 2
    assert "--resume and --restart exclude each other" in one_error_line(capsys)

    assert main(["run", str(cfg), "--runs-dir", str(runs), "--restart", "--no-progress"]) == 0
    assert capsys.readouterr().err.splitlines() == [f"run directory: {directory}"]
    [old] = [p for p in runs.iterdir() if ".old-" in p.name]
    assert old.name.startswith(f"{directory.name}.old-") and snapshot(old) == before

    assert (
        main(
            [
                "run",
                str(cfg),
                "--runs-dir",
                str(runs),
                "--set",
                "optimizer.args.lr=0.01",
                "--no-progress",
            ]
        )
        == 0
    )
    other = runs / load_config(cfg, ["optimizer.args.lr=0.01"]).run_name()
    assert capsys.readouterr().err.splitlines() == [f"run directory: {other}"]
    assert other != directory and other.name.startswith(f"{project.name}_sgd-lr0.01_")
    assert read_json(other / "config.json")["optimizer"] == {"type": "sgd", "args": {"lr": 0.01}}

    assert main(["runs", str(runs)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == [
        "run",
        "status",
        "optimizer.args.lr",
        "steps",
        "eval_accuracy",
        "eval_loss",
        "loss",
    ]
    assert set(table[1]) == {"-", " "}
    rows = [row.split() for row in table[2:]]
    expected = []
    for run, lr in ((old, "0.1"), (directory, "0.1"), (other, "0.01")):  # by start time
        m = read_json(run / "metrics.json")["metrics"]
        expected.append(
            [
                run.name,
                "finished",
                lr,
                "12",
                f"{m['eval_accuracy']:.4f}",
                f"{m['eval_loss']:.4f}",
                f"{m['loss']:.4f}",
            ]
        )
    assert rows == expected


@pytest.mark.parametrize("where", ["missing", "empty"])
def test_cli_runs_without_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    if where == "empty":
        (tmp_path / where).mkdir()
    assert main(["runs", str(tmp_path / where)]) == 0
    assert capsys.readouterr().out == "no runs\n"


BAD_CONFIGS = {
    "malformed-toml": (
        "bad.toml",
        'epochs = 3\nseed = = 0\n[model]\ntype = "x"\n',
        [],
        r"{path}: malformed TOML: .*\(at line 2, column \d+\)",
    ),
    "malformed-json": (
        "bad.json",
        '{\n  "model": "x",\n  "epochs": 3,\n}\n',
        [],
        r"{path}:4:1: malformed JSON: Expecting property name",
    ),
    "unknown-key": (
        "bad.toml",
        'epoch = 3\n[model]\ntype = "x"\n',
        [],
        r"{path}: unknown key 'epoch' \(did you mean 'epochs'\?\); valid keys: ",
    ),
    "unknown-set-key": (
        "ok.toml",
        '[model]\ntype = "x"\n',
        ["--set", "optimiser.args.lr=0.1"],
        r"--set 'optimiser.args.lr=0.1': unknown key 'optimiser' \(did you "
        r"mean 'optimizer'\?\)",
    ),
    "spec-subkey": (
        "ok.toml",
        '[model]\ntype = "x"\n',
        ["--set", "model.arg.hidden=2"],
        r"--set 'model.arg.hidden=2': a spec has 'type' and 'args', not 'arg' "
        r"\(did you mean 'args'\?\)$",
    ),
    "wrong-type": (
        "ok.toml",
        'epochs = 3\n[model]\ntype = "x"\n',
        ["--set", "epochs=three"],
        r"--set 'epochs=three': epochs is int \(3\); 'three' is str$",
    ),
    "missing-model": ("ok.toml", "epochs = 3\n", [], r"{path}: 'model' is required \("),
    "missing-file": ("absent.toml", None, [], r"cannot read config '{path}'"),
}


@pytest.mark.parametrize("case", BAD_CONFIGS)
def test_cli_bad_configs_are_one_line_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    file, text, extra, message = BAD_CONFIGS[case]
    path = tmp_path / file
    if text is not None:
        path.write_text(text)
    runs = tmp_path / "runs"
    assert main(["run", str(path), "--runs-dir", str(runs), *extra]) == 2
    assert re.match(message.format(path=re.escape(str(path))), one_error_line(capsys))
    assert not runs.exists()


def test_cli_an_unknown_model_name_is_a_usage_error(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = project.config()
    cfg.write_text(cfg.read_text().replace(f'type = "{project.name}"', f'type = "{project.name}x"'))
    assert main(["run", str(cfg), "--runs-dir", str(project.root)]) == 2
    error = one_error_line(capsys)
    assert f"no model registered as '{project.name}x'. Did you mean '{project.name}'?" in error
    assert not project.root.exists()


def test_cli_resume_of_a_folder_that_is_no_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["resume", str(tmp_path)]) == 2
    assert "is not a run directory (no readable config.json)" in one_error_line(capsys, "resume")


def test_the_digits_example_config_runs_end_to_end(digits_run: dict[str, Any]) -> None:
    proc = digits_run["proc"]
    assert proc.wait(timeout=TIMEOUT) == 0, digits_run["stderr"].read()
    digits_run["stderr"].seek(0)
    digits_run["stdout"].seek(0)
    err, out = digits_run["stderr"].read(), digits_run["stdout"].read()
    config = load_config(DIGITS, ["epochs=3"])
    runs = digits_run["cwd"] / "runs"
    directory = runs / config.run_name()
    assert directory.name.startswith("digits-hidden128_adam-lr0.005_")
    assert err.splitlines()[0] == f"run directory: {directory}"
    # the model file's configure(engine) applies to config runs: its Evaluate pack's
    # metrics show in the progress lines
    assert [line.split("  ")[0] for line in err.splitlines()[1:]] == [
        f"train epoch {e}/3" for e in range(1, 4)
    ]
    assert all("eval_accuracy" in line for line in err.splitlines()[1:])
    assert out.startswith("train: completed after 69 steps, 3 epochs in ")
    assert os.listdir(runs) == [directory.name]
    assert read_json(directory / "config.json") == config.to_dict()
    assert read_status(directory)["status"] == "finished"
    metrics = read_json(directory / "metrics.json")
    assert (metrics["steps"], metrics["epochs"], metrics["ended"]) == (69, 3, "completed")
    assert metrics["metrics"]["eval_accuracy"] > 0.85
    assert sorted(os.listdir(directory / "checkpoint")) == [
        "ckpt-00002-0000000046.pt",
        "ckpt-00003-0000000069.pt",
    ]
    assert any(p.startswith("events.out.tfevents.") for p in os.listdir(directory / "tensorboard"))
    saved = weights(directory)
    assert {k: tuple(v.shape) for k, v in saved.items()} == {
        "1.weight": (128, 64),
        "1.bias": (128,),
        "3.weight": (10, 128),
        "3.bias": (10,),
    }
    last = torch.load(directory / "checkpoint" / "ckpt-00003-0000000069.pt", weights_only=True)
    assert all(torch.equal(saved[k], last["model"]["module"][k]) for k in saved)


def test_prepare_claims_the_directory(project: Project) -> None:
    config = project.load(packs=())
    first = prepare(config, project.root, base=project.dir)
    with pytest.raises(RunExists, match="holds no run"):
        prepare(config, project.root, base=project.dir)
    first.run()
    assert read_status(first.directory)["status"] == "finished"


def test_a_bad_optimizer_is_found_before_anything_is_written(project: Project) -> None:
    path = project.config()
    path.write_text(path.read_text().replace('type = "sgd"', 'type = "sgdd"'))
    with pytest.raises(KeyError, match="Did you mean 'sgd'"):
        prepare(load_config(path), project.root, base=project.dir)
    path.write_text(
        path.read_text()
        .replace('type = "sgdd"', 'type = "sgd"')
        .replace("lr = 0.1", "lr = 0.1, nesterovv = true")
    )
    with pytest.raises(TypeError, match="nesterovv"):
        prepare(load_config(path), project.root, base=project.dir)
    assert not project.root.exists()

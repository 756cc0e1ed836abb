"""The ``runmodel`` command as users run it: real subprocesses, real model files.

Every command starts a fresh Python that imports torch (about 2 s of CPU), so the
commands of this module start together on a small thread pool when its first test runs;
each test then checks the result of its own command. The Ctrl-C test runs on its own.
Model files are written to a temporary directory; the digits example runs from the repo.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

import runmodel

import helpers
import warm as subprocess

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 600  # seconds for one command (2 to 30 s here: 10x and more, for a busy machine)
ENV = {
    **os.environ,
    "PYTHONIOENCODING": "utf-8",
    "COLUMNS": "100",
    "OMP_NUM_THREADS": "1",
}  # two spinning threads a command, on 2 shared cores: slow
RUNMODEL = (sys.executable, "-m", "runmodel")

#: Logits = scale * one_hot(y): right by construction, so eval's metrics are known exactly.
TINY = '''\
"""A 3-class classifier that is right by construction."""

import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import runmodel


class PlainSGD:
    """What train mode needs of an optimizer. (Constructing a torch.optim optimizer
    imports torch._dynamo: a second of CPU for every command of these tests.)"""

    def __init__(self, parameters, lr):
        self.parameters, self.lr = list(parameters), lr

    def step(self):
        with torch.no_grad():
            for p in self.parameters:
                p -= self.lr * p.grad

    def zero_grad(self, set_to_none=True):
        for p in self.parameters:
            p.grad = None

    def state_dict(self):  # what a checkpoint of its run folder saves
        return {"lr": self.lr}

    def load_state_dict(self, state):
        self.lr = state["lr"]


class Tiny(runmodel.TorchModel):
    init_defaults = {"scale": 5.0}
    setup_defaults = {"lr": 0.1, "batch_size": 16}

    def __init__(self, device=None, init_options=None):
        super().__init__(device, init_options)
        linear = nn.Linear(3, 3)
        with torch.no_grad():
            linear.weight.copy_(torch.eye(3) * self.init_options["scale"])
            linear.bias.zero_()
        self.module = linear

    def setup(self, setup_options=None):
        print(f"setup options: lr={setup_options['lr']!r} "
              f"batch_size={setup_options['batch_size']!r}", file=sys.stderr, flush=True)
        y = torch.arange(64) % 3
        x = nn.functional.one_hot(y, 3).float()
        self.eval_data = self.train_data = DataLoader(
            TensorDataset(x, y), batch_size=setup_options["batch_size"])
        self.loss_fn = nn.CrossEntropyLoss()
        self.optimizer = PlainSGD(self.module.parameters(), lr=setup_options["lr"])


def count_steps(engine):
    pass


def configure(engine):
    engine.on("runstep", count_steps)
'''

BOOM = """\
import runmodel


class Boom(runmodel.Model):
    def step(self, batch):
        return batch

    def run(self, runstep, steps=None, *args, **kwargs):
        raise RuntimeError("boom")

    def teardown(self):
        print("model.teardown ran", flush=True)
"""

NO_MODEL = """\
from runmodel import Model, TorchModel


class Helper:
    pass
"""

BROKEN = """\
import runmodel

class Broken(runmodel.Model):
    def run(self, runstep, steps=None
"""

ENDLESS = """\
import time

import runmodel


class Endless(runmodel.Model):
    def step(self, batch):
        time.sleep(0.001)

    def run(self, runstep, steps=None, *args, **kwargs):
        for epoch in runstep.epochs():
            i = 0
            while True:
                runstep(i)
                i += 1

    def teardown(self):
        print("model.teardown ran", flush=True)


def configure(engine):
    engine.on("runstep", lambda e: print("ready", flush=True), once=True)
    engine.on("exception", lambda e: print("exception:", type(e.state.error).__name__,
                                           flush=True))
"""

#: A model that declares no options: it reads what it is given itself.
FREE = """\
import sys

import runmodel


class Free(runmodel.Model):
    def __init__(self, device=None, init_options=None):
        super().__init__(device, init_options)
        print("init options:", sorted(self.init_options.items()), flush=True)

    def setup(self, setup_options=None):
        print("setup options:", sorted((setup_options or {}).items()), flush=True)

    def step(self, batch):
        return batch

    def run(self, runstep, steps=None, *args, **kwargs):
        runstep(0)
"""

FILES = {
    "tiny.py": TINY,
    "boom.py": BOOM,
    "nomodel.py": NO_MODEL,
    "broken.py": BROKEN,
    "free.py": FREE,
}


@dataclass(frozen=True)
class Call:
    args: tuple[str, ...]
    cwd: Path
    program: tuple[str, ...] = RUNMODEL


def invoke(call: Call) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*call.program, *call.args],
        cwd=call.cwd,
        env=ENV,
        timeout=TIMEOUT,
        capture_output=True,
        text=True,
        encoding="utf-8",
    )


def calls(models: Path) -> dict[str, Call]:
    """Every command this module checks, by name; ``models`` holds FILES."""

    def at_root(*args: str) -> Call:
        return Call(args, ROOT)

    def at_models(*args: str) -> Call:
        return Call(args, models)

    script = shutil.which("runmodel")
    found = {
        "digits": at_root(
            "run", "examples/digits.py", "--epochs", "20", "--runs-dir", str(models / "runs-digits")
        ),
        "help": at_root("--help"),
        **{f"help-{c}": at_root(c, "--help") for c in ("run", "benchmark", "profile", "describe")},
        "version": at_root("--version"),
        **({"script-version": Call(("--version",), ROOT, program=(script,))} if script else {}),
        "eval": at_models("run", "tiny.py", "--mode", "eval", "--device", "cpu"),
        "infer": at_models("run", "tiny.py", "--mode", "infer", "--device", "cpu"),
        "train-json": at_models(
            "run",
            "tiny.py",
            "--epochs",
            "2",
            "--json",
            "--set",
            "lr=0.01",
            "--set",
            "setup.batch_size=32",
            "--device",
            "cpu",
            "--no-progress",
        ),
        "eval-json": at_models(
            "run", "tiny.py", "--mode", "eval", "--json", "--set", "scale=2", "--device", "cpu"
        ),
        "infer-json": at_models("run", "tiny.py", "--mode", "infer", "--json", "--device", "cpu"),
        "benchmark": at_models(
            "benchmark", "tiny.py", "--steps", "20", "--warmup", "5", "--json", "--device", "cpu"
        ),
        "benchmark-infer": at_models(
            "benchmark",
            "tiny.py",
            "--steps",
            "12",
            "--warmup",
            "2",
            "--measure",
            "infer",
            "--device",
            "cpu",
        ),
        "benchmark-no-steps": at_models(
            "benchmark", "tiny.py", "--steps", "5", "--warmup", "5", "--device", "cpu"
        ),
        "profile": at_models(
            "profile",
            "tiny.py",
            "--steps",
            "8",
            "--warmup",
            "2",
            "--dir",
            str(models / "trace"),
            "--device",
            "cpu",
        ),
        "describe": at_root("describe", "examples/digits.py", "--device", "cpu"),
        "describe-hidden": at_root(
            "describe", "examples/digits.py", "--set", "hidden=16", "--device", "cpu"
        ),
        "set-unknown": at_models("run", "tiny.py", "--set", "bogus=1", "--device", "cpu"),
        "set-unknown-init": at_models("run", "tiny.py", "--set", "init.other=2", "--device", "cpu"),
        "set-typo": at_root("run", "examples/digits.py", "--set", "hiden=256"),
        "set-setup-typo": at_root("describe", "examples/digits.py", "--set", "setup.l=0.1"),
        "train": at_models("run", "tiny.py", "--device", "cpu"),
        "set-free": at_models(
            "run",
            "free.py",
            "--set",
            "width=3",
            "--set",
            "init.depth=2",
            "--set",
            "setup.seed=1",
            "--no-progress",
        ),
        "set-bad-type": at_root("run", "examples/digits.py", "--set", "hidden=big"),
        "set-bad-setup-type": at_models("run", "tiny.py", "--set", "lr=fast", "--device", "cpu"),
        "set-no-value": at_models("run", "tiny.py", "--set", "novalue"),
        "set-bad-scope": at_models("run", "tiny.py", "--set", "model.lr=1"),
        "missing-file": at_models("run", "missing.py"),
        "missing-module": at_models("describe", "runmodel_cli_absent_pkg.models:Net"),
        "no-model": at_models("run", "nomodel.py"),
        "syntax-error": at_models("run", "broken.py"),
        "bad-device": at_models("describe", "tiny.py", "--device", "bogus"),
        "boom": at_models("run", "boom.py"),
        "boom-debug": at_models("run", "boom.py", "--debug", "--runs-dir", "runs-debug"),
        "negative-epochs": at_models("run", "tiny.py", "--epochs", "-3"),
        "bad-mode": at_models("run", "tiny.py", "--mode", "fly"),
    }
    return found


class Results:
    def __init__(
        self, models: Path, futures: dict[str, Future[subprocess.CompletedProcess[str]]]
    ) -> None:
        self.models, self.futures = models, futures

    def __getitem__(self, name: str) -> subprocess.CompletedProcess[str]:
        return self.futures[name].result(timeout=2 * TIMEOUT)


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Results]:
    models = tmp_path_factory.mktemp("cli-models")
    for name, text in FILES.items():
        (models / name).write_text(text)
    pool = ThreadPoolExecutor(max_workers=min(4, (os.cpu_count() or 1) + 1))
    try:
        yield Results(
            models, {name: pool.submit(invoke, call) for name, call in calls(models).items()}
        )
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def lines(text: str) -> list[str]:
    return text.splitlines()


def assert_one_line_error(result: subprocess.CompletedProcess[str], command: str) -> str:
    """A usage error: exit 2, one ``runmodel COMMAND: error: ...`` line, no traceback."""
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    [line] = lines(result.stderr)
    prefix = f"runmodel {command}: error: "
    assert line.startswith(prefix), line
    return line[len(prefix) :]


# -- help and version ----------------------------------------------------------------------


def test_top_level_help(cli: Results) -> None:
    result = cli["help"]
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("usage: runmodel [-h] [--version] COMMAND ...\n")
    for command, text in (
        ("run", "run a model, or a config file (.toml/.json), and print its result"),
        ("benchmark", "time a model's steps (warm-up dropped)"),
        ("profile", "profile a model's steps with torch.profiler"),
        ("describe", "show a model and the resolved phase and hook table"),
        ("runs", "list runs: what differs, metrics, status"),
        ("resume", "continue a run from its checkpoint"),
        ("eval", "evaluate a trained run on its eval data"),
        ("infer", "infer with a trained run and save its outputs"),
    ):
        assert re.search(rf"^    {command}\s+{re.escape(text)}$", out, re.MULTILINE), command
    assert "SOURCE is path/file.py, path/file.py:ClassName or package.module:ClassName;" in out
    assert result.stderr == ""


HELP_OPTIONS = {
    "run": {
        "--mode {train,eval,infer,benchmark,profile}",
        "--epochs EPOCHS",
        "--steps STEPS",
        "--json",
        "--runs-dir RUNS_DIR",
        "--resume",
        "--restart",
        "--seed SEED",
        "--preempt-signal SIG",
        "--preempt-grace SECONDS",
    },
    "benchmark": {"--steps STEPS", "--warmup WARMUP", "--measure {train,infer}", "--json"},
    "profile": {
        "--steps STEPS",
        "--warmup WARMUP",
        "--measure {train,infer}",
        "--json",
        "--dir DIR",
    },
    "describe": set(),
}
ALL_OPTIONS = set().union(*HELP_OPTIONS.values())


@pytest.mark.parametrize("command", list(HELP_OPTIONS))
def test_subcommand_help(cli: Results, command: str) -> None:
    result = cli[f"help-{command}"]
    assert result.returncode == 0, result.stderr
    out = result.stdout
    usage = out.split("\n\n")[0]
    assert usage.startswith(
        f"usage: runmodel {command} [-h] [--device DEVICE] [--set KEY=VALUE] [--debug]"
    )
    assert usage.rstrip().endswith("SOURCE")
    for option in ("--device DEVICE", "--set KEY=VALUE", "--debug", *HELP_OPTIONS[command]):
        assert option in out, option
    for option in ALL_OPTIONS - HELP_OPTIONS[command]:
        assert option not in out, option
    assert "SOURCE " in out and "the model to load" in out


def test_version(cli: Results) -> None:
    result = cli["version"]
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"runmodel {runmodel.__version__}\n"
    assert runmodel.__version__ == "0.1.0"


def test_the_installed_console_script(cli: Results) -> None:
    assert shutil.which("runmodel") is not None, "no runmodel console script on PATH: pip install"
    result = cli["script-version"]
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"runmodel {runmodel.__version__}\n"


# -- run: the digits example --------------------------------------------------------------

PROGRESS = re.compile(
    r"train epoch (\d+)/20  step \d+  loss (\S+)  eval_loss \S+  "
    r"eval_accuracy (\S+)  \(\d+\.\d{2}s\)"
)


def test_run_digits_trains_to_95_percent(cli: Results) -> None:
    result = cli["digits"]
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    # a train run of a model source goes into the run folder derived from it
    err = lines(result.stderr)
    assert err[0].startswith(f"run directory: {cli.models / 'runs-digits' / 'digits_'}"), err[0]
    # the progress line per epoch (stderr) shows the Evaluate pack that digits.py's
    # configure(engine) attaches
    progress = [PROGRESS.fullmatch(line) for line in err[1:]]
    assert len(progress) == 20 and all(progress), result.stderr
    assert [int(m[1]) for m in progress] == list(range(1, 21))  # epochs from 1
    losses = [float(m[2]) for m in progress]
    accuracies = [float(m[3]) for m in progress]
    assert sum(losses[-3:]) < sum(losses[:3]) / 5  # one batch each: noisy
    assert accuracies[-1] >= 0.95, result.stderr
    out = lines(result.stdout)
    assert re.fullmatch(r"train: completed after 460 steps, 20 epochs in \d+\.\d{2}s", out[0])
    [accuracy] = [line for line in out if line.startswith("  eval_accuracy: ")]
    assert float(accuracy.removeprefix("  eval_accuracy: ")) >= 0.95, result.stdout


# -- run: eval, infer, --json -------------------------------------------------------------


def eval_loss(scale: float) -> float:
    """Cross-entropy of the logits ``scale * one_hot(y)``, what Tiny's eval must report."""
    return math.log(1 + 2 * math.exp(-scale))


def test_run_eval_prints_the_metrics(cli: Results) -> None:
    result = cli["eval"]
    assert result.returncode == 0, result.stderr
    out = lines(result.stdout)
    assert re.fullmatch(r"eval: completed after 4 steps, 1 epochs in \d+\.\d{2}s", out[0])
    assert out[1:] == [f"  loss: {eval_loss(5):.4f}", "  accuracy: 1.0000"]
    assert out[1] == "  loss: 0.0134"
    assert "setup options: lr=0.1 batch_size=16" in lines(result.stderr)


def test_run_infer_collects_outputs(cli: Results) -> None:
    result = cli["infer"]
    assert result.returncode == 0, result.stderr
    out = lines(result.stdout)
    assert re.fullmatch(r"infer: completed after 4 steps, 1 epochs in \d+\.\d{2}s", out[0])
    assert out[1:] == ["  outputs: 4 batches collected"]


JSON_KEYS = {
    "mode",
    "ended",
    "steps",
    "epochs",
    "skipped",
    "seconds",
    "metrics",
    "timings",
    "files",
    "outputs",
    "reason",
}


def test_run_json(cli: Results) -> None:
    result = cli["train-json"]  # with --set lr=0.01 --set setup.batch_size=32
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert set(data) == JSON_KEYS
    assert isinstance(data["seconds"], float) and data["seconds"] > 0
    del data["seconds"]
    # the last epoch's mean training loss (its packs read it): Tiny's logits are fixed
    assert data["metrics"].pop("loss") == pytest.approx(eval_loss(5), rel=0.05)
    # its run folder: named by the source and its first options, a checkpoint every epoch,
    # the eval_* metrics measured on the trained weights
    [folder] = (cli.models / "runs").glob("tiny-batch-size32-lr0.01_*")
    assert data == {
        "mode": "train",
        "ended": "completed",
        "steps": 4,
        "epochs": 2,
        "skipped": 0,
        "timings": {},
        "outputs": None,
        "reason": None,
        "metrics": {"eval_loss": pytest.approx(eval_loss(5), rel=0.05), "eval_accuracy": 1.0},
        "files": {
            "last_checkpoint": str(
                folder.relative_to(cli.models) / "checkpoint/ckpt-00002-0000000004.pt"
            )
        },
    }
    record = json.loads((folder / "run.json").read_text())
    assert (
        record["kind"],
        record["model"],
        record["init_options"],
        record["setup_options"],
        record["device"],
        record["seed"],
    ) == ("source", "Tiny", {}, {"lr": 0.01, "batch_size": 32}, "cpu", 0)
    assert record["source"] == str(cli.models / "tiny.py")


def test_run_eval_json(cli: Results) -> None:
    result = cli["eval-json"]  # with --set scale=2
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert set(data) == JSON_KEYS
    assert (data["mode"], data["ended"], data["steps"], data["epochs"]) == (
        "eval",
        "completed",
        4,
        1,
    )
    assert data["metrics"] == {"loss": pytest.approx(eval_loss(2), rel=1e-5), "accuracy": 1.0}
    assert data["outputs"] is None


def test_run_infer_json(cli: Results) -> None:
    data = json.loads(cli["infer-json"].stdout)
    assert set(data) == JSON_KEYS
    assert (data["mode"], data["ended"], data["steps"], data["outputs"]) == (
        "infer",
        "completed",
        4,
        4,
    )
    assert data["metrics"] == {}


# -- benchmark and profile ------------------------------------------------------------------


def test_benchmark_json(cli: Results) -> None:
    result = cli["benchmark"]
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert set(data) == JSON_KEYS
    # 4 batches of 16 an epoch: 20 steps end the 5th epoch on the budget
    assert (data["mode"], data["ended"], data["steps"], data["epochs"]) == (
        "benchmark",
        "budget",
        20,
        5,
    )
    t = data["timings"]
    assert (t["measured_steps"], t["warmup"], t["device"]) == (15, 5, "cpu")
    assert t["steps_per_s"] > 0
    assert 0 < t["step_ms_median"] <= t["step_ms_p90"]
    assert t["step_ms_mean"] > 0
    assert t["samples_per_s"] == pytest.approx(16 * t["steps_per_s"])  # every batch is 16
    assert t["seconds"] == pytest.approx(15 / t["steps_per_s"])


def test_benchmark_infer_summary(cli: Results) -> None:
    result = cli["benchmark-infer"]  # --measure infer, printed as text
    assert result.returncode == 0, result.stderr
    out = lines(result.stdout)
    assert len(out) == 3, result.stdout
    assert re.fullmatch(r"benchmark: budget after 12 steps, 3 epochs in \d+\.\d{2}s", out[0])
    assert re.fullmatch(
        r"  10 steps measured after 2 warm-up on cpu: \d+\.\d steps/s, "
        r"\d+ samples/s",
        out[1],
    )
    step = re.fullmatch(
        r"  step time: median (\d+\.\d{3}) ms, p90 (\d+\.\d{3}) ms, "
        r"mean (\d+\.\d{3}) ms",
        out[2],
    )
    assert step is not None and float(step[1]) <= float(step[2])


def test_benchmark_with_no_measured_steps_is_a_usage_error(cli: Results) -> None:
    message = assert_one_line_error(cli["benchmark-no-steps"], "benchmark")
    assert "(5)" in message


def test_profile_writes_a_trace_and_times_the_hooks(cli: Results) -> None:
    result = cli["profile"]
    assert result.returncode == 0, result.stderr
    directory = cli.models / "trace"
    traces = sorted(directory.glob("*.pt.trace.json"))
    assert len(traces) == 1, traces
    out = lines(result.stdout)
    assert re.fullmatch(r"profile: budget after 8 steps, 2 epochs in \d+\.\d{2}s", out[0])
    assert out[1] == "  time in hooks:"
    row = f"    {'runstep':<15} {'count_steps':<30} {8:>7} calls "
    assert out[2].startswith(row), out[2]
    assert re.fullmatch(r" *\d+\.\d{3} ms +\d+\.\d µs/call", out[2][len(row) :]), out[2]
    assert out[3:] == [f"  directory: {directory}", f"  trace: {traces[0]}"]
    events = json.loads(traces[0].read_text())["traceEvents"]
    assert isinstance(events, list)
    names = {e.get("name", "") for e in events}
    ours = {n for n in names if n.startswith("runmodel/")}
    assert {
        "runmodel/runstep",
        "runmodel/forward",
        "runmodel/backward",
        "runmodel/optimizer_step",
        "runmodel/runstep/count_steps",
    } <= ours


# -- describe and --set ---------------------------------------------------------------------


def test_describe_shows_model_options_and_the_hook_table(cli: Results) -> None:
    result = cli["describe"]
    assert result.returncode == 0, result.stderr
    out = lines(result.stdout)
    assert out[:6] == [
        "model: Digits from examples/digits.py",
        "device: cpu",
        "module: Sequential, 9,610 parameters",
        "init options: hidden=128, seed=0",
        "setup options: lr=0.005, batch_size=64",
        "",
    ]
    table = out[6:]
    assert re.fullmatch(r"phase +# +hook +priority +filter +pack +source", table[0])
    assert set(table[1]) == {"-", " "}
    # digits.py's configure(engine) attaches an Evaluate pack: its hooks, with where
    assert any(
        re.fullmatch(
            r"setup +1 +evaluate\.setup +0 +modes=train +evaluate +"
            r"runmodel/packs/evaluate\.py:\d+",
            line,
        )
        for line in table
    ), table
    assert any(
        re.fullmatch(
            r"epoch_end +1 +evaluate +0 +every=1ep modes=train +evaluate +"
            r"runmodel/packs/evaluate\.py:\d+",
            line,
        )
        for line in table
    ), table
    assert any(re.fullmatch(r"runstep +- +action +built-in", line) for line in table)
    assert any(re.fullmatch(r"epoch_start +- +\(no hooks\)", line) for line in table)
    assert [line.split()[0] for line in table[2:]] == [
        "setup",
        "epoch_start",
        "step_start",
        "runstep",
        "forward",
        "backward",
        "optimizer_step",
        "epoch_end",
        "eval_start",
        "eval_end",
        "exception",
        "teardown",
    ]


def test_set_reaches_init_options(cli: Results) -> None:
    result = cli["describe-hidden"]
    assert result.returncode == 0, result.stderr
    assert "module: Sequential, 1,210 parameters" in lines(result.stdout)  # 64*16+16+16*10+10
    assert "9,610" not in result.stdout


def test_describe_shows_the_init_options_in_effect(cli: Results) -> None:
    assert "init options: hidden=16, seed=0" in lines(cli["describe-hidden"].stdout)


def test_set_reaches_init_options_of_a_run(cli: Results) -> None:
    result = cli["eval-json"]  # --set scale=2: logits 2 * one_hot(y)
    assert result.returncode == 0, result.stderr
    loss = json.loads(result.stdout)["metrics"]["loss"]
    assert loss == pytest.approx(eval_loss(2), rel=1e-5)
    assert round(loss, 4) == 0.2395  # not eval_loss(5), the default's 0.0134


def test_set_reaches_setup_options(cli: Results) -> None:
    result = cli["train-json"]  # --set lr=0.01 --set setup.batch_size=32 --epochs 2
    assert result.returncode == 0, result.stderr
    said, *err = lines(result.stderr)
    assert said.startswith("run directory: runs/tiny-batch-size32-lr0.01_"), said
    assert err == ["setup options: lr=0.01 batch_size=32"]
    assert json.loads(result.stdout)["steps"] == 4  # 64 samples in batches of 32, twice


def test_set_keys_the_model_does_not_declare_are_one_line_errors(cli: Results) -> None:
    """Issue 28: ``--set hiden=256`` stops (exit 2) naming the close name and what the
    model declares, instead of a warning and a run with the default."""
    message = assert_one_line_error(cli["set-typo"], "run")
    assert message == (
        "--set 'hiden=256': Digits declares no option 'hiden' (did you mean "
        "'hidden'?); init options: hidden, seed; setup options: lr, batch_size"
    )
    message = assert_one_line_error(cli["set-setup-typo"], "describe")
    assert message == (
        "--set 'setup.l=0.1': Digits declares no setup option 'l' (did you "
        "mean 'lr'?); init options: hidden, seed; setup options: lr, batch_size"
    )
    message = assert_one_line_error(cli["set-unknown"], "run")
    assert message == (
        "--set 'bogus=1': Tiny declares no option 'bogus'; init options: "
        "scale; setup options: lr, batch_size"
    )
    message = assert_one_line_error(cli["set-unknown-init"], "run")
    assert message.startswith("--set 'init.other=2': Tiny declares no init option 'other'; ")


def test_a_model_that_declares_no_options_gets_them_with_one_warning(cli: Results) -> None:
    result = cli["set-free"]  # --set width=3 --set init.depth=2 --set setup.seed=1
    assert result.returncode == 0, result.stderr
    assert lines(result.stdout)[:2] == [
        "init options: [('depth', 2)]",
        "setup options: [('seed', 1), ('width', 3)]",
    ]
    *err, said = lines(result.stderr)
    assert err == [
        "runmodel: warning: Free declares no init options (init_defaults), so these go to it "
        "unchecked: --set 'init.depth=2'",
        "runmodel: warning: Free declares no setup options (setup_defaults), so these go to "
        "it unchecked: --set 'width=3', --set 'setup.seed=1'",
    ]
    assert said.startswith("run directory: runs/free-depth2-seed1_"), said
    assert "UserWarning" not in result.stderr


def test_training_shows_its_progress_by_default(cli: Results) -> None:
    result = cli["train"]
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(
        r"train: completed after 4 steps, 1 epochs in \d+\.\d{2}s", lines(result.stdout)[0]
    )
    err = result.stderr
    assert "setup options: lr=0.1 batch_size=16" in lines(err)
    assert "Traceback" not in err
    # off a terminal, a line per epoch
    assert re.fullmatch(r"train epoch 1  step 4  loss \S+  \(\d+\.\d+s\)", lines(err)[-1])


def test_no_progress_leaves_stderr_to_the_model(cli: Results) -> None:
    assert not any(line.startswith("train epoch") for line in lines(cli["train-json"].stderr))


def test_set_with_a_bad_type_is_a_one_line_error(cli: Results) -> None:
    message = assert_one_line_error(cli["set-bad-type"], "run")  # --set hidden=big
    assert "init option 'hidden' must be int" in message
    assert "'big'" in message


def test_set_with_a_bad_setup_type_is_a_one_line_error(cli: Results) -> None:
    message = assert_one_line_error(cli["set-bad-setup-type"], "run")  # --set lr=fast
    assert "setup option 'lr' must be float" in message
    assert "'fast'" in message


def test_set_without_a_value_is_a_usage_error(cli: Results) -> None:
    message = assert_one_line_error(cli["set-no-value"], "run")
    assert message == "--set 'novalue': write KEY=VALUE, as in --set lr=0.01"


def test_set_with_a_bad_scope_is_a_usage_error(cli: Results) -> None:
    message = assert_one_line_error(cli["set-bad-scope"], "run")
    assert message == "--set 'model.lr=1': the key is NAME, init.NAME or setup.NAME"


# -- errors ----------------------------------------------------------------------------------


def test_a_missing_source_file_is_a_usage_error(cli: Results) -> None:
    message = assert_one_line_error(cli["missing-file"], "run")
    assert message.startswith("'missing.py': no file 'missing.py'")


def test_a_missing_module_is_a_usage_error(cli: Results) -> None:
    message = assert_one_line_error(cli["missing-module"], "describe")
    assert "cannot import module 'runmodel_cli_absent_pkg.models'" in message


def test_a_source_without_a_model_is_a_usage_error(cli: Results) -> None:
    message = assert_one_line_error(cli["no-model"], "run")
    assert message.startswith("'nomodel.py' defines no runmodel.Model subclasses (none); ")


def test_a_source_with_a_syntax_error_is_a_usage_error(cli: Results) -> None:
    message = assert_one_line_error(cli["syntax-error"], "run")
    assert "broken.py" in message


def test_a_bad_device_is_a_usage_error(cli: Results) -> None:
    message = assert_one_line_error(cli["bad-device"], "describe")
    assert message.startswith("device 'bogus' is not a device torch knows")


def test_an_error_in_the_model_exits_1_with_the_error_and_where(cli: Results) -> None:
    result = cli["boom"]
    assert result.returncode == 1
    said, *err = lines(result.stderr)
    assert err == [
        "runmodel run: error: RuntimeError: boom",
        "  runmodel: raised in model.run (train mode, epoch 0, step 0)",
        "  (run with --debug for the traceback)",
    ]
    assert result.stdout == "model.teardown ran\n"
    # and its run folder says so
    [folder] = (cli.models / "runs").glob("boom_*")
    assert said == f"run directory: runs/{folder.name}"
    status = json.loads((folder / "status.json").read_text())
    assert (status["status"], status["error"]) == ("failed", "RuntimeError: boom")


def test_debug_shows_the_traceback(cli: Results) -> None:
    result = cli["boom-debug"]
    assert result.returncode == 1
    said, err = result.stderr.split("\n", 1)
    assert said.startswith("run directory: runs-debug/boom_"), said
    assert err.startswith("Traceback (most recent call last):\n")
    assert 'raise RuntimeError("boom")' in err
    assert str(cli.models / "boom.py") in err or '"boom.py"' in err
    assert "\nRuntimeError: boom\n" in err
    assert "runmodel: raised in model.run (train mode, epoch 0, step 0)" in err
    assert "--debug for the traceback" not in err
    assert result.stdout == "model.teardown ran\n"


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("negative-epochs", "argument --epochs: -3 is negative"),
        ("bad-mode", "argument --mode: invalid choice: 'fly'"),
    ],
)
def test_bad_arguments_are_argparse_errors(cli: Results, name: str, error: str) -> None:
    result = cli[name]
    assert result.returncode == 2
    assert result.stdout == ""
    err = lines(result.stderr)
    assert err[0].startswith("usage: runmodel run ")
    assert err[-1].startswith(f"runmodel run: error: {error}")
    assert "Traceback" not in result.stderr


# -- Ctrl-C -----------------------------------------------------------------------------------


def test_ctrl_c_exits_130_after_teardown(tmp_path: Path) -> None:
    (tmp_path / "endless.py").write_text(ENDLESS)
    proc = subprocess.Popen(
        [*RUNMODEL, "run", "endless.py"],
        cwd=tmp_path,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        encoding="utf-8",
        preexec_fn=helpers.default_ctrl_c,
    )
    watchdog = threading.Timer(TIMEOUT, proc.kill)  # readline() below has no timeout
    watchdog.start()
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    # the first Ctrl-C finishes the step: runmodel.Interrupted, a KeyboardInterrupt
    assert lines(out) == ["exception: Interrupted", "model.teardown ran"]
    said = [line for line in lines(err) if line.startswith("runmodel")]  # not progress's
    assert said[0].startswith("runmodel: Ctrl-C: stopping after this step"), err
    assert said[1].startswith("runmodel: Ctrl-C stopped the run after step "), err
    assert said[2:] == ["runmodel: interrupted"], err
    # its run folder: the step reached saved there, and how to go on
    [folder] = (tmp_path / "runs").glob("endless_*")
    status = json.loads((folder / "status.json").read_text())
    assert status["status"] == "interrupted"
    assert (
        f"; saved {folder.relative_to(tmp_path)}/checkpoint/ckpt-00000-"
        f"{status['step']:010d}.pt; continue it with `runmodel resume "
        f"{folder.relative_to(tmp_path)}`"
    ) in said[1], err


def test_a_listing_piped_into_head_ends_quietly(tmp_path: Path) -> None:
    """``runmodel runs | head``: the reader closes the pipe early; the command ends as one
    that SIGPIPE ended (141), without a BrokenPipeError on stderr."""
    for i in range(2500):  # more than a pipe's buffer of table rows
        folder = tmp_path / f"run{i:04d}"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model": {"args": {"h": i}}}))
    process = subprocess.Popen(
        [sys.executable, "-m", "runmodel", "runs", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stdout.readline().startswith("run ")
    process.stdout.close()  # as head does after its lines
    err = process.communicate(timeout=60)[1]
    assert process.returncode == 141 and err == "", err

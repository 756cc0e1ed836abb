"""The examples run as users run them: as scripts or runmodel commands, in a fresh process
whose current directory is a temporary one, with tiny settings; each test checks what the
example printed or wrote."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import runmodel

import warm as subprocess

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
# one thread: the examples' models are tiny, and torch's thread pool only contends with
# the other processes of a busy 2-core test machine
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
STARTED: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def no_leftovers() -> Iterator[None]:
    """A test that fails while an example still runs leaves no process behind."""
    yield
    for process in STARTED:
        if process.poll() is None:
            process.kill()
            process.communicate()
    STARTED.clear()


def start(*args: str | Path, cwd: Path) -> subprocess.Popen[str]:
    """An example's command, started: a python script, or a runmodel command."""
    command = [str(a) for a in args]
    if command[0].endswith(".py"):
        command.insert(0, sys.executable)
    elif command[0] == "runmodel":
        command[0:1] = [sys.executable, "-m", "runmodel"]
    process = subprocess.Popen(
        command, cwd=cwd, env=ENV, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    STARTED.append(process)
    return process


def finish(process: subprocess.Popen[str], timeout: float = 120) -> tuple[str, str]:
    """The process's stdout and stderr, once it exited 0."""
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, f"exit {process.returncode}\n{out}\n{err}"
    return out, err


def run(*args: str | Path, cwd: Path) -> str:
    """An example's stdout, once it ran and exited 0."""
    return finish(start(*args, cwd=cwd))[0]


def test_quickstart_converges_and_prints_the_table(tmp_path: Path) -> None:
    out = run(EXAMPLES / "quickstart.py", cwd=tmp_path)
    assert "converged after" in out
    assert "stopped:" in out
    assert "epoch_end       1  report" in out


def code_lines(path: Path) -> int:
    """Lines that are not blank, not comments and not the module docstring."""
    import ast

    text = path.read_text()
    doc = ast.parse(text).body[0]
    return sum(
        1
        for i, line in enumerate(text.splitlines(), 1)
        if line.strip()
        and not line.strip().startswith("#")
        and not doc.lineno <= i <= doc.end_lineno
    )


def test_the_everyday_packs_script_trains_digits_in_25_lines(tmp_path: Path) -> None:
    script = EXAMPLES / "digits_packs.py"
    assert code_lines(script) <= 25
    out, err = finish(start(script, "--epochs", "4", cwd=tmp_path))
    progress = [line for line in err.splitlines() if line.startswith("train epoch")]
    assert len(progress) == 4 and all("eval_accuracy" in line for line in progress)
    assert out.startswith("completed after 4 epochs (all epochs ran); test accuracy ")
    accuracy = float(out.rstrip().rpartition(" ")[2].rstrip("%"))
    assert accuracy > 85
    folder = tmp_path / "runs" / "digits-packs"
    assert sorted(p.name for p in (folder / "checkpoints").glob("ckpt-*.pt")) == [
        "ckpt-00003-0000000069.pt",
        "ckpt-00004-0000000092.pt",
    ]
    assert len(list((folder / "checkpoints").glob("best-eval_accuracy=*.pt"))) == 1
    assert list((folder / "tensorboard").glob("events.out.tfevents.*"))


def percent(pattern: str, text: str) -> float:
    found = re.search(pattern + r" ([\d.]+)%", text)
    assert found, f"no {pattern!r} in:\n{text}"
    return float(found.group(1))


def test_finetune_unfreezes_layer_by_layer_and_frozen_layers_stay_put(tmp_path: Path) -> None:
    out = run(
        EXAMPLES / "finetune_unfreeze.py", "--pretrain-epochs", "3", "--epochs", "3", cwd=tmp_path
    )
    assert percent("accuracy on 0-4", out) > 60  # pretraining learned 0-4 (chance: 20%)
    assert percent("before fine-tuning: accuracy on 5-9", out) < 5  # never saw them
    assert percent("after fine-tuning: accuracy on 5-9", out) > 50
    assert "epoch 0: trained head (moved: yes); frozen lower, upper (unchanged: yes)" in out
    assert "epoch 1: trained head, upper (moved: yes); frozen lower (unchanged: yes)" in out
    assert "epoch 2: trained head, lower, upper (moved: yes); nothing frozen\n" in out
    # and from outside the script: the weights it saved at each epoch's start and end
    snapshots = torch.load(tmp_path / "finetune_weights.pt", weights_only=True)
    trained_from = {"head": 0, "upper": 1, "lower": 2}
    assert len(snapshots) == 3
    for epoch, snapshot in enumerate(snapshots):
        for name, start in snapshot["start"].items():
            same = torch.equal(start, snapshot["end"][name])
            assert same == (epoch < trained_from[name.split(".")[0]]), (epoch, name)


def test_gan_with_two_optimizers_moves_the_generator_to_the_ring(tmp_path: Path) -> None:
    out = run(EXAMPLES / "gan.py", "--epochs", "4", "--steps-per-epoch", "50", cwd=tmp_path)
    assert len(re.findall(r"^epoch +\d+  d_loss [\d.]+  g_loss [\d.]+$", out, re.M)) == 4
    found = re.search(r"^200 steps: distance to the nearest centre ([\d.]+) -> ([\d.]+)", out, re.M)
    assert found, out
    before, after = map(float, found.groups())
    assert before > 1.5 and after < 0.6 * before  # from near the origin toward the ring


def test_reinforce_loop_raises_the_return(tmp_path: Path) -> None:
    out = run(EXAMPLES / "rl_loop.py", "--epochs", "3", "--updates", "5", cwd=tmp_path)
    returns = [float(r) for r in re.findall(r"mean return ([-+][\d.]+)", out)]
    assert len(returns) == 4, out  # untrained, then one per epoch
    assert returns[0] < 0 and returns[-1] > 0.6, out  # the best possible is 0.82
    assert "15 updates" in out


def test_one_pack_reused_by_two_scripts(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    shared = EXAMPLES / "packs_shared"
    line = start(shared / "line_fit.py", "--epochs", "200", cwd=tmp_path)
    blobs = start(shared / "blobs_tensorboard.py", "--epochs", "3", "--every", "4", cwd=tmp_path)
    out = finish(line)[0]
    # GradNorm stopped the regression once converged, before the 200 epochs
    found = re.search(
        r"^stopped after (\d+) epochs: grad_norm: the epoch's mean gradient "
        r"norm ([\d.e+-]+) fell below 0.01$",
        out,
        re.M,
    )
    assert found, out
    assert int(found.group(1)) < 200 and float(found.group(2)) < 0.01
    assert re.search(r"y = 2\.99\dx -0\.99\d|y = 3\.00\dx -1\.00\d", out), out
    out, err = finish(blobs)
    progress = [line for line in err.splitlines() if line.startswith("train epoch")]
    assert len(progress) == 3 and all(" grad_norm " in line for line in progress)
    assert percent("test accuracy", out) > 90
    events = EventAccumulator(str(tmp_path / "runs" / "blobs" / "tensorboard"))
    events.Reload()
    norms = events.Scalars("train/grad_norm")
    assert [e.step for e in norms] == [24, 48, 72]
    assert all(e.value > 0 for e in norms)
    printed = re.search(r"train grad_norm ([\d.]+)", out)
    assert printed and abs(norms[-1].value - float(printed.group(1))) < 1e-4


def test_benchmark_and_profile_from_the_command_line(tmp_path: Path) -> None:
    model = EXAMPLES / "bench_model.py"
    bench = start(
        "runmodel", "benchmark", model, "--steps", "30", "--warmup", "5", "--json", cwd=tmp_path
    )
    profile = start(
        "runmodel",
        "profile",
        model,
        "--steps",
        "8",
        "--warmup",
        "2",
        "--dir",
        "runs/profile-mlp",
        "--json",
        cwd=tmp_path,
    )
    result = json.loads(finish(bench)[0])
    assert result["mode"] == "benchmark" and result["steps"] == 30
    timings = result["timings"]
    assert timings["measured_steps"] == 25 and timings["device"] == "cpu"
    assert 0 < timings["step_ms_median"] <= timings["step_ms_p90"]
    assert timings["samples_per_s"] == pytest.approx(timings["steps_per_s"] * 128, rel=1e-6)
    result = json.loads(finish(profile)[0])
    trace = tmp_path / result["files"]["trace"]
    assert trace.parent == tmp_path / "runs" / "profile-mlp" and trace.name.endswith(
        ".pt.trace.json"
    )
    names = {event.get("name") for event in json.loads(trace.read_text())["traceEvents"]}
    assert {
        "runmodel/forward",
        "runmodel/backward",
        "runmodel/optimizer_step",
        "runmodel/optimizer_step/grad_clip.clip",
    } <= names
    assert "grad_clip.clip" in {hook["hook"] for hook in result["timings"]["hooks"]}


def test_resume_after_sigkill_ends_with_the_weights_of_a_straight_run(tmp_path: Path) -> None:
    script = EXAMPLES / "resume.py"
    straight = start(script, "--dir", "straight", cwd=tmp_path)
    killed = start(script, "--dir", "killed", "--pace", "0.01", cwd=tmp_path)
    assert killed.stdout is not None
    for line in killed.stdout:  # kill it in epoch 3, after epoch 2's checkpoints
        if line.startswith("epoch 2 done"):
            killed.send_signal(signal.SIGKILL)
            break
    assert killed.wait(timeout=60) == -signal.SIGKILL
    killed.communicate()
    assert not (tmp_path / "killed" / "final.pt").exists()
    assert "starting fresh" in finish(straight)[1]
    out, err = finish(start(script, "--dir", "killed", cwd=tmp_path))  # the same command
    found = re.search(r"runmodel: resuming from (\S+ckpt-(\d+)-(\d+)\.pt)", err)
    assert found, err
    assert int(found.group(3)) >= 48  # from epoch 2's end or later: it did not start over
    assert out.endswith("completed: 128 steps, 8 epochs; weights in killed/final.pt\n")
    expected = torch.load(tmp_path / "straight" / "final.pt", weights_only=True)
    resumed = torch.load(tmp_path / "killed" / "final.pt", weights_only=True)
    assert expected.keys() == resumed.keys()
    assert all(torch.equal(expected[k], resumed[k]) for k in expected)


def test_config_run_with_set_lands_in_the_run_directory_its_config_names(tmp_path: Path) -> None:
    config = EXAMPLES / "configs" / "digits_packs.toml"
    overrides = ["optimizer.args.lr=0.002", "epochs=2"]
    out, err = finish(
        start(
            "runmodel",
            "run",
            config,
            *(f"--set={o}" for o in overrides),
            "--runs-dir",
            "experiments",
            "--no-progress",
            cwd=tmp_path,
        )
    )
    name = runmodel.load_config(config, overrides).run_name()
    assert name.startswith("digits-hidden64_adam-lr0.002_")  # the overridden value in it
    assert err.startswith(f"run directory: {Path('experiments') / name}\n")
    run_dir = tmp_path / "experiments" / name
    assert [p.name for p in (tmp_path / "experiments").iterdir()] == [name]
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["optimizer"] == {"type": "adam", "args": {"lr": 0.002}}
    assert saved["epochs"] == 2 and saved["model"]["args"] == {"hidden": 64}
    assert json.loads((run_dir / "status.json").read_text())["status"] == "finished"
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["epochs"] == 2 and metrics["metrics"]["eval_accuracy"] > 0.5
    assert re.search(r"completed after \d+ steps, 2 epochs", out), out
    assert len(list((run_dir / "checkpoint").glob("best-eval_accuracy=*.pt"))) == 1


def test_ignite_handlers_stop_and_checkpoint_a_runmodel_run(tmp_path: Path) -> None:
    out = run(EXAMPLES / "ignite_handlers.py", "--patience", "2", cwd=tmp_path)
    rows = re.findall(
        r"^epoch +(\d+)  running_loss ([\d.]+)  train_acc ([\d.]+)  "
        r"val_loss ([\d.]+)  val_acc ([\d.]+)$",
        out,
        re.M,
    )
    epochs = [int(r[0]) for r in rows]
    val_loss = [float(r[3]) for r in rows]
    assert epochs == list(range(1, len(rows) + 1)) and len(rows) < 30
    # EarlyStopping: the run stopped 2 epochs (patience) after the best val_loss
    best = min(range(len(val_loss)), key=val_loss.__getitem__)
    assert len(rows) == best + 1 + 2
    assert f"runmodel: stopped after {len(rows)} epochs (ignite: terminate())" in out
    assert out.split("running_loss in result.metrics: ")[1].startswith(rows[-1][1])
    # ModelCheckpoint: the two best epochs by -val_loss, named by the trainer's epoch
    top = sorted(range(len(val_loss)), key=val_loss.__getitem__)[:2]
    expected = sorted(f"best_model_{i + 1}_neg_val_loss={-val_loss[i]:.4f}.pt" for i in top)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == expected
    assert f"ModelCheckpoint kept: {', '.join(expected)}" in out
    weights = torch.load(tmp_path / "checkpoints" / expected[0], weights_only=True)
    assert set(weights) == {"0.weight", "0.bias", "2.weight", "2.bias"}


def test_the_examples_readme_lists_every_example() -> None:
    readme = (EXAMPLES / "README.md").read_text()
    linked = set(re.findall(r"\]\(([^)]+)\)", readme))
    files = {
        str(p.relative_to(EXAMPLES))
        for p in EXAMPLES.rglob("*")
        if p.suffix in (".py", ".toml") and "__pycache__" not in p.parts
    }
    assert files - linked == set()
    # torchrun_digits.py is another change's; listed here ahead of it
    assert {link for link in linked if not (EXAMPLES / link).exists()} <= {"torchrun_digits.py"}

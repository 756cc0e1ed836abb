"""Iterations as a counter: ``state.iteration`` (the optimizer step a runstep belongs
to: ``step // k`` under ``GradAccumulation(k)``), the duration unit ``"it"``
(``every="250it"``, ``once="1000it"``), a script's two modulo forms as filters
(``every=N`` for ``(it + 1) % N == 0``, ``every=N, from_zero=True`` for ``it % N == 0``),
saved with the run and fired where a straight run fires after a resume."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import runmodel
from runmodel.packs import Checkpoint
from runmodel.packs.grad_accumulation import GradAccumulation

import warm as subprocess
from helpers import Counting, Tiny

ROOT = Path(__file__).resolve().parents[2]


def engine_with(k: int | None) -> runmodel.Engine:
    return runmodel.Engine(GradAccumulation(k)) if k else runmodel.Engine()


def seen_on(
    phase: str, k: int | None = None, batches: int = 7, epochs: int = 2, **options: Any
) -> list[tuple[int, int]]:
    """``(step, iteration)`` where a hook on ``phase`` with ``options`` fired, in a run
    of ``Tiny(batches=batches)`` for ``epochs`` epochs, accumulating over ``k``."""
    engine = engine_with(k)
    seen: list[tuple[int, int]] = []
    engine.on(phase, lambda e: seen.append((e.state.step, e.state.iteration)), **options)
    engine.run(Tiny(batches=batches), epochs=epochs)
    return seen


# -- state.iteration ------------------------------------------------------------------------


def test_iteration_is_the_step_without_accumulation_and_step_over_k_with_it() -> None:
    assert [it for _, it in seen_on("runstep", batches=5, epochs=1)] == [0, 1, 2, 3, 4]
    assert [it for _, it in seen_on("runstep", k=2, batches=8, epochs=1)] == [
        0, 0, 1, 1, 2, 2, 3, 3,
    ]  # fmt: skip
    # an epoch of 7 steps in windows of 3 ends with a shorter window: one iteration too,
    # and the next epoch's first window starts a new one
    by_step = seen_on("runstep", k=3, batches=7, epochs=2)
    assert [it for _, it in by_step] == [0, 0, 0, 1, 1, 1, 2, 3, 3, 3, 4, 4, 4, 5]
    # at the epoch's end and after the run: the iterations done (a plain model's too)
    assert seen_on("epoch_end", k=3, batches=7, epochs=2) == [(7, 3), (14, 6)]
    engine = runmodel.Engine()
    engine.run(Counting(batches=3), epochs=2)
    assert engine.state.iteration == engine.state.step == 6


def test_iteration_counts_the_optimizer_steps_taken() -> None:
    model = Tiny(batches=7, optimizer=torch.optim.Adam)
    engine = engine_with(3)
    engine.run(model, epochs=2)
    adam = model.optimizer.state[next(model.module.parameters())]
    assert engine.state.iteration == int(adam["step"]) == 6


def test_an_eval_run_counts_no_windows() -> None:
    engine = engine_with(3)
    seen: list[int] = []
    engine.on("runstep", lambda e: seen.append(e.state.iteration), modes="eval")
    engine.run(Tiny(batches=4), "eval")
    assert seen == [0, 1, 2, 3]


def test_iteration_is_saved_with_the_run_and_an_old_checkpoint_derives_it(
    tmp_path: Path,
) -> None:
    def run(folder: Path, **options: Any) -> list[int]:
        engine = runmodel.Engine(GradAccumulation(3), Checkpoint(folder, every="1ep", keep=None))
        seen: list[int] = []
        engine.on("runstep", lambda e: seen.append(e.state.iteration))
        engine.run(Tiny(batches=7), **options)
        return seen

    straight = run(tmp_path / "straight", epochs=3)
    first = run(tmp_path / "cut", epochs=1)  # 7 steps: 3 iterations, the last a short one
    assert first + run(tmp_path / "cut", epochs=3, resume=tmp_path / "cut") == straight

    # a checkpoint written before iterations were counted: step // k
    engine = engine_with(3)
    engine.state.window_padding = 2
    assert engine.state_dict()["counters"]["window_padding"] == 2
    engine.load_state_dict({"counters": {"step": 14, "epoch": 2, "epoch_step": 0}})
    engine.state.accumulation = 3
    assert engine.state.iteration == 4


# -- "it": every=, once= ------------------------------------------------------------------


def test_every_n_iterations_fires_at_the_runstep_that_completes_each_nth() -> None:
    # windows of 2 steps: iterations 1, 3, 5 end at steps 3, 7, 11
    assert seen_on("runstep", k=2, batches=12, epochs=1, every="2it") == [(3, 1), (7, 3), (11, 5)]
    # the same on the steps inside it, and with a spelled-out unit
    assert seen_on("optimizer_step", k=2, batches=12, epochs=1, every="2 iterations") == [
        (3, 1), (7, 3), (11, 5),
    ]  # fmt: skip
    # without accumulation an iteration is a step
    assert seen_on("runstep", batches=6, epochs=1, every="2it") == seen_on(
        "runstep", batches=6, epochs=1, every="2st"
    )
    # on epoch_end: the epochs in which a multiple of 3 iterations was reached (2 each)
    assert seen_on("epoch_end", k=3, batches=4, epochs=3, every="3it") == [(8, 4), (12, 6)]
    assert "every=2it" in _described(every="2it")


def test_once_at_an_iteration_fires_at_its_first_runstep() -> None:
    assert seen_on("step_start", k=3, batches=7, epochs=2, once="3it") == [(7, 3)]
    assert seen_on("runstep", k=2, batches=8, epochs=1, once="2it") == [(4, 2)]
    assert seen_on("epoch_start", k=3, batches=7, epochs=3, once="3it") == [(7, 3)]


def test_bad_iteration_durations_are_refused_with_the_units_named() -> None:
    engine = runmodel.Engine()
    with pytest.raises(ValueError, match=r"one of ep, st, s, min, h, it for iterations"):
        engine.on("runstep", lambda e: None, every="3 sweeps")
    with pytest.raises(ValueError, match=r"every='1\.5it'.*iterations"):
        engine.on("runstep", lambda e: None, every="1.5it")
    with pytest.raises(TypeError, match=r"'250it'"):
        engine.on("runstep", lambda e: None, every=2.5)  # type: ignore[arg-type]


# -- the two modulo forms -----------------------------------------------------------------


def script(iterations: int, n: int, k: int) -> dict[str, list[int]]:
    """A script's loop: both modulo forms where a script writes them, around the k
    micro-steps of each iteration."""
    fired: dict[str, list[int]] = {"it % n == 0": [], "(it + 1) % n == 0": []}
    for it in range(iterations):
        if it % n == 0:  # at the top of the loop, before the iteration's micro-steps
            fired["it % n == 0"].append(it)
        for _micro_step in range(k):
            pass
        if (it + 1) % n == 0:  # after its optimizer step
            fired["(it + 1) % n == 0"].append(it)
    return fired


@pytest.mark.parametrize("k", [None, 3])
def test_from_zero_is_a_scripts_it_mod_n_and_every_its_it_plus_one_mod_n(k: int | None) -> None:
    steps_per = k or 1
    fired = script(iterations=8, n=3, k=steps_per)
    top = seen_on("step_start", k=k, batches=8 * steps_per, epochs=1, every="3it", from_zero=True)
    end = seen_on("runstep", k=k, batches=8 * steps_per, epochs=1, every="3it")
    assert [it for _, it in top] == fired["it % n == 0"] == [0, 3, 6]
    assert [step for step, _ in top] == [0, 3 * steps_per, 6 * steps_per]  # first runsteps
    assert [it for _, it in end] == fired["(it + 1) % n == 0"] == [2, 5]
    assert [step for step, _ in end] == [3 * steps_per - 1, 6 * steps_per - 1]  # last ones


def test_from_zero_counts_positions_from_zero_in_every_unit() -> None:
    assert [s for s, _ in seen_on("runstep", batches=7, epochs=1, every=3, from_zero=True)] == [
        0, 3, 6,
    ]  # fmt: skip
    per_epoch = seen_on("step_start", batches=5, epochs=2, every="2est", from_zero=True)
    assert [s for s, _ in per_epoch] == [0, 2, 4, 5, 7, 9]  # batch 0, 2, 4 of each epoch
    epochs: list[int] = []
    engine = runmodel.Engine()
    engine.on("epoch_start", lambda e: epochs.append(e.state.epoch), every=2, from_zero=True)
    engine.run(Counting(batches=1), epochs=5)
    assert epochs == [0, 2, 4]
    # the epochs whose steps hold a multiple of 4 (steps 0, 4, 8: epochs 0, 1, 2 of 3 steps)
    assert seen_on("epoch_end", batches=3, epochs=4, every="4st", from_zero=True) == [
        (3, 3), (6, 6), (9, 9),
    ]  # fmt: skip
    assert "every=3 from_zero" in _described(every=3, from_zero=True)


def test_from_zero_goes_with_every_and_is_a_bool() -> None:
    engine = runmodel.Engine()
    with pytest.raises(ValueError, match=r"from_zero=True says where every= counts from"):
        engine.on("runstep", lambda e: None, once="3it", from_zero=True)
    with pytest.raises(TypeError, match=r"from_zero= must be True or False"):
        engine.on("runstep", lambda e: None, every=3, from_zero=1)  # type: ignore[arg-type]


def _described(**options: Any) -> str:
    engine = runmodel.Engine()
    engine.on("runstep", lambda e: None, **options)
    return engine.describe()


# -- a resume between two firings -----------------------------------------------------------

TRAIN = """
import os, signal
import runmodel
from runmodel.packs import Checkpoint
from runmodel.packs.grad_accumulation import GradAccumulation
from helpers import Tiny

def train(folder, log, kill_at=None):
    os.makedirs(folder, exist_ok=True)
    engine = runmodel.Engine(GradAccumulation(2), Checkpoint(folder, every="1st", keep=1))

    def record(engine):
        with open(log, "a") as f:
            f.write(f"{engine.state.iteration}\\n")

    engine.on("runstep", record, every="3it")
    if kill_at is not None:
        engine.on("step_start", lambda e: os.kill(os.getpid(), signal.SIGKILL), once=kill_at)
    engine.run(Tiny(batches=12), epochs=2, resume=folder if os.listdir(folder) else None)
"""


def test_a_run_killed_between_two_firings_fires_where_the_straight_run_does(
    tmp_path: Path,
) -> None:
    namespace: dict[str, Any] = {}
    exec(TRAIN, namespace)  # the straight run and the resume, here
    straight, cut = tmp_path / "straight.log", tmp_path / "cut.log"
    namespace["train"](tmp_path / "straight", straight)
    assert straight.read_text().split() == ["2", "5", "8", "11"]
    # a process killed at step 8 (iteration 4), between the firings at iterations 2 and 5
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}", "COLUMNS": "80"}
    killed = subprocess.run(
        [sys.executable, "-c", f"{TRAIN}\ntrain({str(tmp_path / 'cut')!r}, {str(cut)!r}, 8)"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -9, killed.stderr
    assert cut.read_text().split() == ["2"]
    namespace["train"](tmp_path / "cut", cut)
    assert cut.read_text() == straight.read_text()


# -- a budget in iterations ------------------------------------------------------------------


def test_a_budget_in_iterations_is_k_steps_each() -> None:
    result = engine_with(3).run(Tiny(batches=100), iterations=4)
    assert (result.ended, result.steps, result.iterations) == ("budget", 12, 4)
    result = runmodel.Engine().run(Tiny(batches=100), iterations=4)
    assert (result.steps, result.iterations) == (4, 4)
    # with epochs=, as steps= is: whichever ends first
    result = engine_with(2).run(Tiny(batches=4), iterations=5, epochs=2)
    assert (result.ended, result.steps, result.iterations) == ("completed", 8, 4)
    # a run that counts no iterations says none
    assert runmodel.Engine().run(Tiny(batches=2)).iterations is None


def test_progress_lines_say_iterations_where_the_run_counts_them() -> None:
    import io

    from runmodel.packs import Progress

    shown = io.StringIO()
    engine = engine_with(2)
    engine.attach(Progress(file=shown))
    engine.run(Tiny(batches=4), epochs=2)
    lines = shown.getvalue().splitlines()
    assert [line.split("  ")[1] for line in lines] == ["step 4 it 2", "step 8 it 4"], lines
    plain = io.StringIO()
    runmodel.Engine(Progress(file=plain)).run(Tiny(batches=4))
    assert " it " not in plain.getvalue() and "step 4" in plain.getvalue()


def test_tensorboards_axis_is_the_iterations_done_where_the_run_counts_them(
    tmp_path: Path,
) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from runmodel.packs import TensorBoard

    engine = engine_with(2)
    engine.attach(TensorBoard(tmp_path, every_steps=2))
    engine.run(Tiny(batches=4), epochs=2)
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [s.step for s in events.Scalars("train/loss")] == [2, 4]
    assert [s.step for s in events.Scalars("train/loss_step")] == [1, 2, 3, 4]


def test_steps_and_iterations_exclude_each_other() -> None:
    with pytest.raises(ValueError, match=r"steps=4 and iterations=2 exclude each other"):
        runmodel.Engine().run(Tiny(), steps=4, iterations=2)
    with pytest.raises(ValueError, match=r"iterations= must be a whole number"):
        runmodel.Engine().run(Tiny(), iterations=-1)


def test_a_resumed_run_given_the_same_iterations_ends_where_a_straight_one_does(
    tmp_path: Path,
) -> None:
    first = runmodel.Engine(GradAccumulation(2), Checkpoint(tmp_path, every="1st", keep=1))
    assert first.run(Tiny(batches=100), iterations=3).steps == 6
    again = runmodel.Engine(GradAccumulation(2), Checkpoint(tmp_path, every="1st", keep=1))
    result = again.run(Tiny(batches=100), iterations=5, resume=tmp_path)
    assert (result.steps, result.iterations) == (10, 5)


MODEL = """\
import torch
from torch import nn

import runmodel


class Windows(runmodel.TorchModel):
    def __init__(self, device=None, init_options=None):
        super().__init__(device, init_options)
        torch.manual_seed(0)
        self.module = nn.Linear(4, 1)

    def setup(self, setup_options=None):
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=0.1)
        self.loss_fn = nn.MSELoss()
        x = torch.randn(40, 4, generator=torch.Generator().manual_seed(0))
        self.train_data = [(x[i : i + 4], x[i : i + 4, :1]) for i in range(0, 40, 4)]


runmodel.register_model("windows-{tag}", Windows)
"""

CONFIG = """\
imports = ["model.py"]
device = "cpu"
{length}
[model]
type = "windows-{tag}"

[[packs]]
type = "grad_accumulation"
args = {{ k = 2 }}
"""


def a_config(folder: Path, length: str) -> Path:
    tag = folder.name[-12:].replace("_", "-")
    (folder / "model.py").write_text(MODEL.format(tag=tag))
    path = folder / "windows.toml"
    path.write_text(CONFIG.format(length=length, tag=tag))
    return path


def test_iterations_in_a_config_and_on_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from runmodel import load_config
    from runmodel.cli import main
    from runmodel.config.runconfig import ConfigError

    monkeypatch.chdir(tmp_path)
    path = a_config(tmp_path, "iterations = 3")
    assert main(["run", str(path), "--json", "--no-progress"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["steps"], result["iterations"]) == (6, 3)
    [folder] = [p.parent for p in (tmp_path / "runs").rglob("run.log")]
    log = (folder / "run.log").read_text()
    assert "epoch 1 step 6 iteration 3" in log and "6 steps, 3 iterations done" in log, log
    assert json.loads((folder / "metrics.json").read_text())["iterations"] == 3
    assert main(["runs", "runs"]) == 0
    assert "6 (3 it)" in capsys.readouterr().out

    # the command line's length replaces the config's; steps and iterations exclude
    assert main(["run", str(path), "--iterations", "4", "--no-progress", "--restart"]) == 0
    assert "train: budget after 8 steps (4 iterations)" in capsys.readouterr().out
    with pytest.raises(ConfigError, match=r"steps = 2 and iterations = 3 exclude each other"):
        load_config(a_config(tmp_path, "steps = 2\niterations = 3"))

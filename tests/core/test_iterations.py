"""Iterations as a counter: ``state.iteration`` (the optimizer step a runstep belongs
to: ``step // k`` under ``GradAccumulation(k)``), the duration unit ``"it"``
(``every="250it"``, ``once="1000it"``), a script's two modulo forms as filters
(``every=N`` for ``(it + 1) % N == 0``, ``every=N, from_zero=True`` for ``it % N == 0``),
saved with the run and fired where a straight run fires after a resume."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import runmodel
from runmodel.packs import Checkpoint
from runmodel.packs.grad_accumulation import GradAccumulation

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

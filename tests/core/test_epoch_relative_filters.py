"""Filters relative to the epoch: ``every="Nest"`` fires at the N-th, 2N-th... step of
each epoch (``state.epoch_step`` N-1, 2N-1, ...), counting anew in every epoch, as a
script's ``if (batch + 1) % N == 0`` inside its epoch loop does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import runmodel
from runmodel.packs import Checkpoint

from helpers import Counting, Tiny


def fired(every: str | int, batches: int = 7, epochs: int = 2) -> list[tuple[int, int]]:
    engine = runmodel.Engine()
    seen: list[tuple[int, int]] = []
    engine.on("runstep", lambda e: seen.append(e.state.batch), every=every)
    engine.run(Counting(batches=batches), epochs=epochs)
    return seen


def test_every_n_steps_of_the_epoch_counts_anew_in_each_epoch() -> None:
    assert fired("3est") == [(0, 2), (0, 5), (1, 2), (1, 5)]
    assert fired("3 epoch_steps") == fired("3est")
    assert fired("3st") == [(0, 2), (0, 5), (1, 1), (1, 4)]  # the run's steps: not anew


def test_it_reads_the_counters_so_a_resumed_run_fires_where_the_straight_run_did(
    tmp_path: Path,
) -> None:
    def run(directory: Path, **options: object) -> list[tuple[int, int]]:
        engine = runmodel.Engine(Checkpoint(directory, every="4st", keep=None))
        seen: list[tuple[int, int]] = []
        engine.on(
            "step_start", lambda e: seen.append((e.state.epoch, e.state.epoch_step)), every="3est"
        )
        engine.run(Tiny(batches=7), **options)  # type: ignore[arg-type]
        return seen

    straight = run(tmp_path / "straight", epochs=2)
    assert straight == [(0, 2), (0, 5), (1, 2), (1, 5)]
    first = run(tmp_path / "cut", steps=4)  # a checkpoint at step 4: epoch 0, batch 4
    resumed = run(tmp_path / "cut", epochs=2, resume=tmp_path / "cut")
    assert first + resumed == straight


def test_only_step_phases_count_steps_of_the_epoch_and_it_is_no_position() -> None:
    engine = runmodel.Engine()
    with pytest.raises(
        ValueError,
        match=r"every='3est' on phase 'epoch_end': 'est' counts "
        r"the steps of each epoch, which only a step phase",
    ):
        engine.on("epoch_end", lambda e: None, every="3est")
    with pytest.raises(
        ValueError,
        match=r"once='3est': 'est' counts the steps of each epoch "
        r"anew, so it names a moment of every epoch",
    ):
        engine.on("runstep", lambda e: None, once="3est")
    with pytest.raises(ValueError, match=r"every='2est' on phase 'eval_start'"):

        class Pack(runmodel.Pack):  # refused when the class is made
            @runmodel.hook(every="2est")
            def eval_start(self, engine: runmodel.Engine) -> None: ...

    engine.on("optimizer_step", lambda e: None, every="2est")
    assert "every=2est" in engine.describe()


# -- once= positions at a resume ---------------------------------------------------------------


@pytest.mark.parametrize("cut", [{"epochs": 2}, {"steps": 6}])  # at an epoch's end, mid-epoch
@pytest.mark.parametrize(
    ("phase", "once"),
    [
        ("epoch_start", 0),
        ("epoch_start", 1),
        ("epoch_start", 2),
        ("epoch_start", "1ep"),
        ("epoch_end", 0),
        ("epoch_end", 1),
        ("epoch_end", 2),
        ("epoch_start", "4st"),
        ("epoch_end", "5st"),
        ("epoch_end", "9st"),
        ("epoch_start", "0st"),
        ("epoch_start", "8st"),
        ("epoch_start", "6st"),
        ("setup", True),
        ("runstep", 5),
        ("runstep", 6),  # the resume's first step (steps=6)
        ("runstep", 8),  # ... and the first of epoch 2 (epochs=2)
        ("runstep", 9),
        ("epoch_end", "8st"),
        ("step_start", "2ep"),
        ("step_start", "1ep"),
    ],
)
def test_a_once_hook_is_past_at_a_resume_exactly_when_the_resumed_run_skips_it(
    tmp_path: Path, cut: dict[str, int], phase: str, once: object
) -> None:
    """``moment_past`` (what a resumed train run names on stderr) agrees with the filter:
    of the hooks a straight run of 3 epochs of 4 steps fires, those past at a resume
    (after epoch 2, or at step 6) are the ones the resumed run does not fire."""
    from runmodel.core.filters import moment_past
    from runmodel.core.options import parse_duration

    def run(engine: runmodel.Engine, **options: Any) -> list[int]:
        fired: list[int] = []
        engine.on(phase, lambda e: fired.append(e.state.step), once=once)  # type: ignore[arg-type]
        engine.run(Tiny(batches=4), **options)
        return fired

    assert run(runmodel.Engine(), epochs=3)  # the straight run fires it
    run(runmodel.Engine(Checkpoint(tmp_path)), **cut)
    resumed = runmodel.Engine(Checkpoint(tmp_path))
    past: list[bool] = []  # asked where a resumed run asks: its first epoch_start
    resumed.on(
        "epoch_start",
        lambda e: past.append(moment_past(phase, parse_duration(once, "once"), e.state)),
        priority=1e9,
    )  # type: ignore[arg-type]
    fired = run(resumed, epochs=3, resume=tmp_path)
    assert resumed.state.step == 12 and past[:1] == [fired == []]


def test_once_at_the_run_start_fires_there() -> None:
    """``once="0st"`` on ``epoch_start`` is the first epoch's start: a run that starts at
    the position reaches it (it was skipped as reached before the run)."""
    engine = runmodel.Engine()
    seen: list[int] = []
    engine.on("epoch_start", lambda e: seen.append(e.state.step), once="0st")
    engine.run(Counting(batches=4), epochs=2)
    assert seen == [0]


@pytest.mark.parametrize(
    ("cut", "phase", "once"),
    [
        ({"steps": 6}, "runstep", 6),
        ({"steps": 6}, "step_start", "6st"),
        ({"epochs": 2}, "runstep", 8),
        ({"epochs": 2}, "runstep", "2ep"),
        ({"epochs": 2}, "epoch_start", 2),
        ({"epochs": 2}, "epoch_start", "8st"),
        ({"epochs": 2}, "epoch_end", "8st"),
    ],
)
def test_a_resume_exactly_at_a_once_position_fires_it_there(
    tmp_path: Path, cut: dict[str, int], phase: str, once: object
) -> None:
    """The resumed run starts at the hook's position (step 6, or epoch 2 = step 8): the
    moment is not past, and the hook fires where the straight run fired it."""

    def run(engine: runmodel.Engine, **options: Any) -> list[int]:
        fired: list[int] = []
        engine.on(phase, lambda e: fired.append(e.state.step), once=once)  # type: ignore[arg-type]
        engine.run(Tiny(batches=4), **options)
        return fired

    straight = run(runmodel.Engine(), epochs=3)
    assert straight and straight[0] >= 6  # fired at or after the cut
    assert run(runmodel.Engine(Checkpoint(tmp_path)), **cut) == []
    assert run(runmodel.Engine(Checkpoint(tmp_path)), epochs=3, resume=tmp_path) == straight

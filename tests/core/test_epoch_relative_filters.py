"""Filters relative to the epoch: ``every="Nest"`` fires at the N-th, 2N-th... step of
each epoch (``state.epoch_step`` N-1, 2N-1, ...), counting anew in every epoch, as a
script's ``if (batch + 1) % N == 0`` inside its epoch loop does."""

from __future__ import annotations

from pathlib import Path

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
        tmp_path: Path) -> None:
    def run(directory: Path, **options: object) -> list[tuple[int, int]]:
        engine = runmodel.Engine(Checkpoint(directory, every="4st", keep=None))
        seen: list[tuple[int, int]] = []
        engine.on("step_start", lambda e: seen.append((e.state.epoch, e.state.epoch_step)),
                  every="3est")
        engine.run(Tiny(batches=7), **options)  # type: ignore[arg-type]
        return seen

    straight = run(tmp_path / "straight", epochs=2)
    assert straight == [(0, 2), (0, 5), (1, 2), (1, 5)]
    first = run(tmp_path / "cut", steps=4)  # a checkpoint at step 4: epoch 0, batch 4
    resumed = run(tmp_path / "cut", epochs=2, resume=tmp_path / "cut")
    assert first + resumed == straight


def test_only_step_phases_count_steps_of_the_epoch_and_it_is_no_position() -> None:
    engine = runmodel.Engine()
    with pytest.raises(ValueError, match=r"every='3est' on phase 'epoch_end': 'est' counts "
                                         r"the steps of each epoch, which only a step phase"):
        engine.on("epoch_end", lambda e: None, every="3est")
    with pytest.raises(ValueError, match=r"once='3est': 'est' counts the steps of each epoch "
                                         r"anew, so it names a moment of every epoch"):
        engine.on("runstep", lambda e: None, once="3est")
    with pytest.raises(ValueError, match=r"every='2est' on phase 'eval_start'"):
        class Pack(runmodel.Pack):  # refused when the class is made
            @runmodel.hook(every="2est")
            def eval_start(self, engine: runmodel.Engine) -> None: ...
    engine.on("optimizer_step", lambda e: None, every="2est")
    assert "every=2est" in engine.describe()

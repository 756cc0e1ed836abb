"""Issue 38's traps in the engine itself: a second pack of a class that changes the
training (two ``LRSchedule``s, two ``GradClip``s) is refused at attach, naming both places;
a metric name that cuts a declared one short (``eval_acc``) is refused at setup even
where a hook of the user's declares no ``writes=``."""

from __future__ import annotations

import inspect
import io
from pathlib import Path

import pytest

import runmodel
from runmodel.packs import Checkpoint, Evaluate, GradClip, LRSchedule, Progress

from helpers import Tiny


def test_a_second_grad_clip_is_refused_naming_both_attach_lines() -> None:
    engine, first = runmodel.Engine(GradClip(1.0)), _line()
    with pytest.raises(ValueError, match="two GradClip packs") as caught:
        engine.attach(GradClip(2.0))  # the line after the with: first + 2
    message, here = str(caught.value), Path(__file__).name
    assert f"{here}:{first}" in message and f"{here}:{first + 2}" in message, message
    assert list(engine.table.packs) == ["grad_clip"]  # the refused one is not attached


def test_two_lr_schedules_in_one_attach_are_refused() -> None:
    with pytest.raises(ValueError, match="two LRSchedule packs"):
        runmodel.Engine().attach(LRSchedule(lr_at=lambda it: 0.1), LRSchedule(lr_at=lambda it: 0.1))


def test_repeatable_packs_attach_twice_and_a_detached_one_leaves_room() -> None:
    engine = runmodel.Engine(Evaluate(), Evaluate(), Progress(io.StringIO()))
    handle = engine.attach(GradClip(1.0))
    handle.detach()
    engine.attach(GradClip(1.0))  # the first one is gone: no repeat
    assert Evaluate.repeatable and not GradClip.repeatable


def test_a_cut_short_metric_name_is_refused_at_setup_beside_an_undeclared_hook(
    tmp_path: Path,
) -> None:
    steps: list[int] = []
    engine = runmodel.Engine(Evaluate(), Checkpoint(tmp_path, best=("eval_acc", "max")))
    engine.on("step_start", lambda e: steps.append(e.state.step))  # declares no writes=
    with pytest.raises(ValueError, match="Did you mean 'eval_accuracy'"):
        engine.run(Tiny(classes=3), epochs=1)
    assert steps == []  # refused before the first step, not at the first epoch's end


def _line() -> int:
    """The caller's line."""
    frame = inspect.currentframe()
    assert frame is not None and frame.f_back is not None
    return frame.f_back.f_lineno

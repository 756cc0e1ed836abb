"""Issue 38: the progress line of an epoch that Ctrl-C cut short shows what that epoch
measured, not the previous epoch's evaluation (which ``Evaluate`` does not repeat for a
partial epoch)."""

from __future__ import annotations

import io

import pytest

import runmodel
from runmodel.packs import Evaluate, Progress

from helpers import Tiny


def test_the_cut_short_epochs_line_has_no_stale_evaluation() -> None:
    out = io.StringIO()
    engine = runmodel.Engine(Evaluate(), Progress(out))
    engine.on("runstep", lambda e: e.interrupt(), once="5st")  # in the second epoch
    with pytest.raises(runmodel.Interrupted):
        engine.run(Tiny(classes=3), epochs=3)
    first, cut = out.getvalue().splitlines()
    assert first.startswith("train epoch 1/3") and "eval_accuracy" in first, first
    assert cut.startswith("train epoch 2/3") and "eval_" not in cut, cut
    assert " loss " in cut  # the partial epoch's own loss still shows

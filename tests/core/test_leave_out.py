"""engine.leave_out and engine.batch_index: batches left out by their position in the
epoch's data are drawn and dropped without a step, also beside skip_step's batches."""

from __future__ import annotations

from typing import Any

import pytest

import runmodel


class Batches(runmodel.Model):
    """Two epochs of six batches, ``(epoch, position)``; the steps run are noted."""

    def __init__(self) -> None:
        super().__init__()
        self.ran: list[tuple[int, int]] = []

    def step(self, batch: Any) -> Any:
        self.ran.append(batch)
        return batch

    def run(
        self, runstep: runmodel.RunStep, steps: int | None = None, *args: Any, **kwargs: Any
    ) -> None:
        for epoch in runstep.epochs():
            for b in range(6):
                runstep((epoch, b))


def test_left_out_batches_are_dropped_where_they_come() -> None:
    engine = runmodel.Engine(progress=False)
    positions: list[int] = []
    engine.on("setup", lambda e: e.leave_out(0, [1, 2]))
    engine.on("setup", lambda e: e.leave_out(1, [5]))
    engine.on("step_start", lambda e: positions.append(e.batch_index()))

    @engine.on("step_start", when=lambda e: e.state.batch == (1, 0))
    def skip(engine: Any) -> None:  # a skip_step before a left-out batch: both counted
        engine.skip_step()

    model = Batches()
    result = engine.run(model, epochs=2)
    assert model.ran == [(0, 0), (0, 3), (0, 4), (0, 5), (1, 1), (1, 2), (1, 3), (1, 4)]
    assert positions == [0, 3, 4, 5, 0, 1, 2, 3, 4]  # each batch's own position
    assert result.steps == 8 and engine.state.skipped == 4


def test_leave_out_and_rewind_belong_to_a_run() -> None:
    engine = runmodel.Engine(progress=False)
    with pytest.raises(RuntimeError, match="call it from a hook"):
        engine.leave_out(0, [1])
    with pytest.raises(RuntimeError, match="call it from a hook"):
        engine.rewind("nowhere")
    assert engine.batch_index() == 0

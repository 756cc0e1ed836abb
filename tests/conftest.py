"""Small real models shared by the tests."""

from __future__ import annotations

from typing import Any

import pytest

import runmodel
from runmodel.core.phases import PHASES


class Counting(runmodel.Model):
    """A model whose step records its batch; its loop runs ``epochs`` x ``batches``."""

    def __init__(self, batches: int = 4, use_epochs: bool = True) -> None:
        super().__init__()
        self.batches, self.use_epochs = batches, use_epochs
        self.seen: list[Any] = []
        self.calls: list[str] = []

    def setup(self, setup_options: dict[str, Any] | None = None) -> None:
        self.calls.append("model.setup")

    def step(self, batch: Any) -> Any:
        self.seen.append(batch)
        return batch

    def run(self, runstep: runmodel.RunStep, steps: int | None = None, *args: Any,
            **kwargs: Any) -> None:
        self.calls.append("model.run")
        if self.use_epochs:
            for epoch in runstep.epochs():
                for b in range(self.batches):
                    runstep((epoch, b))
        else:
            for b in range(self.batches):
                runstep(b)

    def teardown(self) -> None:
        self.calls.append("model.teardown")


def record_all(engine: runmodel.Engine, log: list[str]) -> None:
    """Hook every phase with a recorder that logs ``phase@epoch.step``."""
    for phase in PHASES:
        def recorder(engine: runmodel.Engine, phase: str = phase) -> None:
            s = engine.state
            log.append(f"{phase}@{s.epoch}.{s.step}")
        engine.on(phase, recorder, name=f"rec_{phase}")


@pytest.fixture
def engine() -> runmodel.Engine:
    return runmodel.Engine()

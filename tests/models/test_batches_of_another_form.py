"""A loader that yields what ``TorchModel``'s default step cannot read (bare tensors,
dicts, one-item tuples) gets one error naming what it expects, ``(input, target)``
batches, and what to override, ``compute_output`` and ``target``: before the step runs,
not ``KeyError: 0`` or a shape error two layers down."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import runmodel

from helpers import Tiny, make_data


def with_data(train: Any) -> tuple[runmodel.Engine, Tiny, list[int]]:
    class Model(Tiny):
        def setup(self, setup_options: dict[str, Any] | None = None) -> None:
            super().setup(setup_options)
            self.train_data = self.eval_data = train

    engine = runmodel.Engine()
    steps: list[int] = []
    engine.on("step_start", lambda e: steps.append(e.state.step))
    return engine, Model(), steps


X = torch.randn(16, 4)


@pytest.mark.parametrize(
    ("data", "seen"),
    [
        (DataLoader(X, batch_size=8), r"bare tensors \(this one of shape \(8, 4\)\)"),
        ([{"x": X[:8], "y": X[:8, :1]}], r"dicts \(this one with keys 'x', 'y'\)"),
        (DataLoader(TensorDataset(X), batch_size=8), r"lists of 1 item"),
    ],
)
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_one_error_names_the_expected_batches_and_what_to_override(
    data: Any, seen: str, mode: str
) -> None:
    engine, model, steps = with_data(data)
    with pytest.raises(
        TypeError,
        match=rf"Model's {mode} data yields {seen}, and TorchModel "
        r"expects \(input, target\) batches: .* override "
        r"Model\.compute_output\(batch\) .* and "
        r"Model\.target\(batch\)",
    ) as info:
        engine.run(model, mode, steps=2)
    assert steps == [] and info.value.__cause__ is None and info.value.__context__ is None


def test_infer_mode_reads_the_input_alone() -> None:
    engine, model, _ = with_data(DataLoader(TensorDataset(X), batch_size=8))
    assert len(engine.run(model, "infer").outputs) == 2  # (x,) batches: [0] is there


def test_a_step_of_its_own_reads_the_batches_its_own_way() -> None:
    engine, model, _ = with_data([X[:8], X[8:]])  # bare tensors, for the override
    engine.override(
        "runstep", lambda e, default: e.model.module(e.state.batch).sum(), modes="train"
    )
    assert engine.run(model, epochs=1).steps == 2
    with pytest.raises(TypeError, match=r"Model's eval data yields bare tensors"):
        engine.run(model, "eval")  # the override is the train step's only


def test_a_model_that_reads_its_batches_itself_is_left_alone() -> None:
    class Dicts(Tiny):
        def setup(self, setup_options: dict[str, Any] | None = None) -> None:
            super().setup(setup_options)
            self.train_data = [{"x": x, "y": y} for x, y in make_data()]

        def compute_output(self, batch: Any) -> torch.Tensor:
            return self.module(batch["x"])

        def target(self, batch: Any) -> torch.Tensor:
            return batch["y"]

    assert runmodel.Engine().run(Dicts(), epochs=1).steps == 4

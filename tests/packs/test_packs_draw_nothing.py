"""No built-in pack draws from a random number generator when it is constructed or
attached: a script that seeds, builds its model and attaches packs gets the initial
weights, shuffle and dropout masks it gets without them (issue 36, item 4).

``Evaluate(data=<shuffled DataLoader>)`` once made an iterator at construction, which
draws a seed from torch's generator."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import runmodel
import runmodel.packs
from runmodel.core import Pack
from runmodel.packs import (
    CSV,
    EMA,
    PACK_TYPES,
    SWA,
    Checkpoint,
    EarlyStopping,
    Evaluate,
    GradAccumulation,
    GradClip,
    LRSchedule,
    MLflow,
    NaNGuard,
    Progress,
    RunLog,
    SpikeGuard,
    TensorBoard,
    Throughput,
    Timer,
    Unfreeze,
)
from runmodel.packs.final_evaluation import FinalEvaluation


def shuffled() -> DataLoader[Any]:
    data = TensorDataset(torch.arange(32.0).reshape(16, 2), torch.arange(16))
    return DataLoader(data, batch_size=4, shuffle=True)


#: Every built-in pack, with minimal valid arguments (``tmp``: a folder of the test's own).
BUILT: dict[type, Callable[[Path], Pack]] = {
    Checkpoint: lambda tmp: Checkpoint(tmp / "ckpt", best=("eval_loss", "min")),
    CSV: lambda tmp: CSV(tmp / "metrics.csv"),
    EarlyStopping: lambda tmp: EarlyStopping("eval_loss", patience=2),
    EMA: lambda tmp: EMA(),
    Evaluate: lambda tmp: Evaluate(data=shuffled()),
    GradAccumulation: lambda tmp: GradAccumulation(2),
    GradClip: lambda tmp: GradClip(1.0),
    LRSchedule: lambda tmp: LRSchedule(lambda opt: torch.optim.lr_scheduler.StepLR(opt, 1)),
    MLflow: lambda tmp: MLflow(str(tmp / "mlruns")),
    NaNGuard: lambda tmp: NaNGuard(),
    Progress: lambda tmp: Progress(),
    RunLog: lambda tmp: RunLog(tmp / "log.jsonl"),
    SpikeGuard: lambda tmp: SpikeGuard(),
    SWA: lambda tmp: SWA(),
    TensorBoard: lambda tmp: TensorBoard(tmp / "tb"),
    Throughput: lambda tmp: Throughput(every="2st", items_per_batch=8, peak_flops=1e12),
    Timer: lambda tmp: Timer(),
    Unfreeze: lambda tmp: Unfreeze({1: "0"}),
    FinalEvaluation: lambda tmp: FinalEvaluation(),
}

#: Evaluate's other sources, which it must neither iterate nor call when built.
MORE: dict[str, Callable[[Path], Pack]] = {
    "evaluate-named": lambda tmp: Evaluate(
        data={"train": shuffled(), "val": lambda: torch.randn(4, 2)}, batches=2, at_start=True
    ),
    "evaluate-function": lambda tmp: Evaluate(data=lambda: random.random(), batches=3),
    "evaluate-metric-function": lambda tmp: Evaluate(metrics={"f1": lambda p, t: 0.0}),
    "lr-schedule-linear": lambda tmp: LRSchedule("linear", warmup=0.1),
}


def generators() -> tuple[Any, ...]:
    return torch.get_rng_state(), random.getstate(), numpy.random.get_state()


def assert_same_generators(before: tuple[Any, ...], after: tuple[Any, ...]) -> None:
    assert torch.equal(before[0], after[0]), "torch's generator drew"
    assert before[1] == after[1], "Python's random drew"
    numpy_before, numpy_after = before[2], after[2]
    assert numpy_before[0] == numpy_after[0] and (numpy_before[1] == numpy_after[1]).all()
    assert numpy_before[2:] == numpy_after[2:], "NumPy's generator drew"


def test_every_built_in_pack_is_tried() -> None:
    in_packs = {
        value
        for value in vars(runmodel.packs).values()
        if isinstance(value, type) and issubclass(value, Pack) and value is not Pack
    }
    assert {*PACK_TYPES.values(), *in_packs} <= set(BUILT), "give BUILT the new pack"


@pytest.mark.parametrize(
    "make", [*BUILT.values(), *MORE.values()], ids=[*(t.__name__ for t in BUILT), *MORE]
)
def test_constructing_and_attaching_a_pack_draws_nothing(
    make: Callable[[Path], Pack], tmp_path: Path
) -> None:
    torch.manual_seed(3), random.seed(3), numpy.random.seed(3)
    before = generators()
    pack = make(tmp_path)
    runmodel.Engine().attach(pack)
    assert_same_generators(before, generators())


def test_the_control_iterating_a_shuffled_loader_draws() -> None:
    before = generators()
    iter(shuffled())
    with pytest.raises(AssertionError, match="torch's generator drew"):
        assert_same_generators(before, generators())

"""A config's ``LRSchedule`` names a closed-form learning rate by a registered function
(``register_schedule``): ``lr_at = "name"`` or ``{type = "name", args = {...}}``, written
into every group before each iteration as ``LRSchedule(lr_at=fn)`` writes it."""

from __future__ import annotations

import math
from typing import Any

import pytest

import runmodel
from runmodel.packs.lr_schedule import LRSchedule

from helpers import Tiny


def warmup_cosine(it: int, warmup: int = 2, max_lr: float = 0.1, decay: int = 8) -> float:
    """nanoGPT's get_lr, shortened."""
    if it < warmup:
        return max_lr * (it + 1) / (warmup + 1)
    ratio = min(1.0, (it - warmup) / (decay - warmup))
    return 0.1 * max_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * 0.9 * max_lr


runmodel.register_schedule("test_warmup_cosine", warmup_cosine)


def lrs(pack: runmodel.Pack) -> list[float]:
    engine = runmodel.Engine(pack)
    used: list[float] = []
    engine.on("step_start", lambda e: used.append(e.model.optimizer.param_groups[0]["lr"]))
    engine.run(Tiny(), epochs=2)
    return used


@pytest.mark.parametrize(
    ("lr_at", "args"),
    [
        ("test_warmup_cosine", {}),
        ({"type": "test_warmup_cosine", "args": {"max_lr": 0.05}}, {"max_lr": 0.05}),
    ],
)
def test_a_config_names_the_function(lr_at: Any, args: dict[str, Any]) -> None:
    pack = runmodel.make_pack({"type": "lr_schedule", "args": {"lr_at": lr_at}})
    assert isinstance(pack, LRSchedule)
    assert lrs(pack) == [warmup_cosine(it, **args) for it in range(8)]


def test_bad_arguments_and_names_are_refused_when_the_pack_is_made() -> None:
    with pytest.raises(
        TypeError, match=r"could not be called as fn\(iteration, \*\*\{'max': 1\}\)"
    ):
        runmodel.make_pack(
            {
                "type": "lr_schedule",
                "args": {"lr_at": {"type": "test_warmup_cosine", "args": {"max": 1}}},
            }
        )
    with pytest.raises(KeyError, match=r"no schedule registered as 'test_warmup_cosin'"):
        runmodel.make_pack({"type": "lr_schedule", "args": {"lr_at": "test_warmup_cosin"}})

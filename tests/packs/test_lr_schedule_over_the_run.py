"""``LRSchedule("linear"|"cosine"|"constant", warmup=)``: the Hugging Face schedules over
the run's own length, equal at every optimizer step to what ``transformers``' own
``get_*_schedule_with_warmup`` give (the lr values compared with ``==``); the length from
the budget (epochs, steps, accumulation counted); an extension refused where the
schedule is laid out over the length or ended at lr 0.

The model (``helpers.Tiny``) is a linear regression, 5 batches an epoch, with two param
groups of different lrs (a decay and a no-decay group)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.optim import lr_scheduler

import runmodel
from runmodel.packs import Checkpoint
from runmodel.packs.grad_accumulation import GradAccumulation
from runmodel.packs.lr_schedule import LRSchedule

from helpers import Tiny

transformers = pytest.importorskip("transformers")

HF = {
    "linear": transformers.get_linear_schedule_with_warmup,
    "cosine": transformers.get_cosine_schedule_with_warmup,
    "constant": lambda opt, warmup, total: transformers.get_constant_schedule_with_warmup(
        opt, warmup
    ),
}
LRS = (0.07, 0.003)  # the two groups' initial lrs


class Grouped(Tiny):
    def setup(self, setup_options: dict[str, Any] | None = None) -> None:
        super().setup(setup_options)
        weight, bias = self.module.parameters()
        self.optimizer = torch.optim.AdamW(
            [{"params": [weight], "lr": LRS[0]}, {"params": [bias], "lr": LRS[1]}]
        )


def lrs_stepped(*packs: runmodel.Pack, **run: Any) -> list[list[float]]:
    """Each group's lr at every optimizer step the run takes, as the step reads it."""
    engine = runmodel.Engine(*packs)
    used: list[list[float]] = []

    def record(e: runmodel.Engine, default: Any) -> None:  # innermost: the real steps
        used.append([g["lr"] for g in e.model.optimizer.param_groups])
        default(e)

    engine.override("optimizer_step", record, priority=-1000)
    engine.run(Grouped(batches=5), **run)
    return used


def hf_lrs(name: str, warmup: int, total: int) -> list[list[float]]:
    """transformers' schedule, stepped as its Trainer steps it."""
    weight, bias = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW(
        [{"params": [weight], "lr": LRS[0]}, {"params": [bias], "lr": LRS[1]}]
    )
    scheduler = HF[name](optimizer, warmup, total)
    used = []
    for _ in range(total):
        used.append([g["lr"] for g in optimizer.param_groups])
        optimizer.step()
        scheduler.step()
    return used


@pytest.mark.parametrize("name", ["linear", "cosine", "constant"])
@pytest.mark.parametrize(
    ("warmup", "k", "run", "total", "warm"),
    [
        (0.1, 1, {"epochs": 4}, 20, 2),  # a ratio: ceil(20 * 0.1)
        (0.06, 2, {"epochs": 3}, 9, 1),  # ceil(5 / 2) = 3 steps an epoch; ceil(0.54)
        (3, 1, {"steps": 13}, 13, 3),  # a count of iterations; a budget in steps
        (0.5, 2, {"steps": 13}, 8, 4),  # 2 epochs of 3 steps, then 3 batches: 2 steps
        (0, 1, {"epochs": 2}, 10, 0),
    ],
)
def test_the_lr_of_every_step_is_the_transformers_schedules(
    name: str, warmup: float, k: int, run: dict[str, int], total: int, warm: int
) -> None:
    packs: list[runmodel.Pack] = [LRSchedule(name, warmup=warmup)]
    if k > 1:
        packs.append(GradAccumulation(k))
    used = lrs_stepped(*packs, **run)
    assert len(used) == total
    assert used == hf_lrs(name, warm, total)  # to the bit
    if name != "constant" and warm:
        assert used[0] == [0.0, 0.0] and used[warm] == list(LRS)


def test_the_schedule_is_recomputed_for_another_length() -> None:
    short, long = (
        lrs_stepped(LRSchedule("linear"), epochs=2),
        lrs_stepped(LRSchedule("linear"), epochs=4),
    )
    assert short == hf_lrs("linear", 0, 10) and long == hf_lrs("linear", 0, 20)


def test_a_config_names_the_schedule_and_its_length_is_the_runs() -> None:
    spec = {"type": "lr_schedule", "args": {"scheduler": "cosine", "warmup": 0.06}}
    for epochs in (2, 4):  # as --set epochs= changes it
        used = lrs_stepped(runmodel.make_pack(spec), epochs=epochs)
        assert used == hf_lrs("cosine", math.ceil(0.06 * 5 * epochs), 5 * epochs)


def test_a_resumed_run_continues_the_schedule(tmp_path: Path) -> None:
    straight = lrs_stepped(LRSchedule("cosine", warmup=0.2), epochs=4)
    engine = runmodel.Engine(LRSchedule("cosine", warmup=0.2), Checkpoint(tmp_path))
    engine.on("step_start", lambda e: e.stop() if e.state.step == 7 else None)
    engine.run(Grouped(batches=5), epochs=4)
    rest = lrs_stepped(
        LRSchedule("cosine", warmup=0.2), Checkpoint(tmp_path), epochs=4, resume="auto"
    )
    assert rest == straight[-len(rest) :] and len(rest) == 12


def test_extending_a_finished_run_is_refused(tmp_path: Path) -> None:
    runmodel.Engine(LRSchedule("linear", warmup=0.1), Checkpoint(tmp_path / "a")).run(
        Grouped(batches=5), epochs=2
    )
    with pytest.raises(
        ValueError, match=r"epochs 2 -> 3\), and its learning rate schedule linear is laid out"
    ):
        runmodel.Engine(LRSchedule("linear", warmup=0.1), Checkpoint(tmp_path / "a")).run(
            Grouped(batches=5), epochs=3, resume="auto"
        )

    def to_zero(optimizer: torch.optim.Optimizer) -> Any:
        return lr_scheduler.LinearLR(optimizer, 1.0, 0.0, total_iters=10)

    runmodel.Engine(LRSchedule(to_zero), Checkpoint(tmp_path / "b")).run(
        Grouped(batches=5), epochs=2
    )
    steps: list[int] = []
    engine = runmodel.Engine(LRSchedule(to_zero), Checkpoint(tmp_path / "b"))
    engine.on("step_start", lambda e: steps.append(e.state.step))
    with pytest.raises(ValueError, match=r"ended that run at lr 0, where it stays"):
        engine.run(Grouped(batches=5), epochs=3, resume="auto")
    assert steps == []


def test_mistakes_are_named() -> None:
    with pytest.raises(ValueError, match=r"warmup=0.06\) is the warm-up of a named schedule"):
        LRSchedule(lambda opt: lr_scheduler.StepLR(opt, 1), warmup=0.06)
    with pytest.raises(ValueError, match=r"a float is the ratio"):
        LRSchedule("linear", warmup=1.5)
    with pytest.raises(ValueError, match=r"without lr_at=, warmup_steps="):
        LRSchedule("cosine", warmup_steps=3)
    assert math.isclose(hf_lrs("linear", 1, 4)[1][0], LRS[0])  # the reference is a schedule

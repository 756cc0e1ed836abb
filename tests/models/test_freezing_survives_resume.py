"""Freezing survives a resume: each parameter's ``requires_grad`` is in the checkpoint
and restored after the setup hooks, so the trainable set is part of the run's state; at
the resume, one stderr line names the ``once=`` hooks of the setup and epoch phases
whose moment is past."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import runmodel
from runmodel.packs import Checkpoint

from helpers import Tiny, params

EPOCHS = 4


def staged(engine: runmodel.Engine) -> None:
    """Train the last layer alone first, everything from epoch 2 on (the README's way)."""

    @engine.on("setup")
    def freeze(engine: runmodel.Engine) -> None:
        engine.model.module[0].requires_grad_(False)

    @engine.on("epoch_start", once=2)
    def unfreeze(engine: runmodel.Engine) -> None:
        engine.model.module[0].requires_grad_(True)


def model() -> Tiny:
    return Tiny(hidden=6)


def test_a_run_resumed_after_the_unfreezing_trains_what_the_straight_run_trains(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    straight = runmodel.Engine()
    staged(straight)
    whole = model()
    straight.run(whole, epochs=EPOCHS)

    first = runmodel.Engine(Checkpoint(tmp_path))
    staged(first)
    first.run(model(), epochs=3)  # unfrozen at epoch 2; saved after epoch 3
    capfd.readouterr()
    second = runmodel.Engine(Checkpoint(tmp_path))
    staged(second)
    second.on("setup", lambda e: None, once="1ep", name="warm")  # past too: epoch 1 is done
    second.on("epoch_end", lambda e: None, once=3, name="later")  # to come: epoch 3 ends
    trainable: list[bool] = []
    second.on("epoch_start", lambda e: trainable.append(e.model.module[0].weight.requires_grad))
    resumed = model()
    second.run(resumed, epochs=EPOCHS, resume=tmp_path)
    assert trainable == [True]  # the setup hook froze it; the checkpoint unfroze it again
    assert torch.equal(params(resumed), params(whole))
    lines = [line for line in capfd.readouterr().err.splitlines() if "once=" in line]
    assert lines == [
        "runmodel: resumed at epoch 3, step 12; the moment of these once= hooks "
        "is past, so this run does not fire them: 'warm' (setup, once='1ep'), "
        "'unfreeze' (epoch_start, once=2)"
    ]


def test_the_checkpoint_holds_each_parameters_requires_grad() -> None:
    trained = model()
    trained.module[2].bias.requires_grad_(False)
    state = trained.state_dict()
    assert state["requires_grad"] == {
        "0.weight": True,
        "0.bias": True,
        "2.weight": True,
        "2.bias": False,
    }
    other = model()
    other.load_state_dict(state)
    assert [p.requires_grad for p in other.module.parameters()] == [True, True, True, False]


def test_a_fresh_run_says_nothing_of_once_hooks(capfd: pytest.CaptureFixture[str]) -> None:
    engine = runmodel.Engine()
    staged(engine)
    engine.run(model(), epochs=1)
    assert "once=" not in capfd.readouterr().err

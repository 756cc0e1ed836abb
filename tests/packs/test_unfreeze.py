"""The Unfreeze pack: a small network trained by runmodel with parts of it frozen by epoch.

The network (``Staged``) has modules ``layer1``, ``layer2``, ``layer10`` and ``head``; it
trains with Adam and weight decay on 4 fixed regression batches an epoch (``helpers.Tiny``),
so a frozen parameter that the optimizer touched at all (a zero gradient, weight decay)
would move.
"""

from __future__ import annotations

import functools
import tomllib
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import runmodel
from runmodel.packs import Checkpoint
from runmodel.packs.unfreeze import Unfreeze

from helpers import Counting, Tiny, assert_equal_params, assert_same, make_data

NAMES = ("layer1", "layer2", "layer10", "head")


class Staged(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer1, self.layer2, self.layer10 = nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 8)
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in (self.layer1, self.layer2, self.layer10):
            x = torch.relu(layer(x))
        return self.head(x)


def staged(lr: float = 0.01) -> Tiny:
    """``Staged`` (the same weights each time) with Adam(lr, weight_decay=0.1)."""
    model = Tiny(optimizer=functools.partial(torch.optim.Adam, weight_decay=0.1), lr=lr)
    torch.manual_seed(0)
    model.module = Staged()
    return model


def snapshot(model: Tiny) -> dict[str, torch.Tensor]:
    """Each module's parameters, flattened into one copy."""
    module = model.module
    return {
        n: torch.cat([p.detach().flatten() for p in getattr(module, n).parameters()]).clone()
        for n in NAMES
    }


def changed(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> set[str]:
    return {n for n in NAMES if not torch.equal(before[n], after[n])}


def with_state(model: Tiny) -> set[str]:
    """The modules whose parameters have optimizer state."""
    state = model.optimizer.state
    return {n for n in NAMES if any(p in state for p in getattr(model.module, n).parameters())}


def run_and_watch(
    pack: Unfreeze, epochs: int, model: Tiny | None = None
) -> tuple[Tiny, list[dict[str, Any]]]:
    """Train with ``pack``; per epoch: which modules changed in it, which have optimizer
    state at its end, which were trainable in it."""
    model = model or staged()
    engine = runmodel.Engine()
    engine.attach(pack)
    seen: list[dict[str, Any]] = []
    start: dict[str, Any] = {}

    @engine.on("epoch_start", priority=-10)  # after Unfreeze's (priority 100)
    def before(engine: runmodel.Engine) -> None:
        start["params"] = snapshot(model)
        start["trainable"] = {
            n for n in NAMES if all(p.requires_grad for p in getattr(model.module, n).parameters())
        }

    @engine.on("epoch_end")
    def after(engine: runmodel.Engine) -> None:
        seen.append(
            {
                "changed": changed(start["params"], snapshot(model)),
                "state": with_state(model),
                "trainable": start["trainable"],
            }
        )

    engine.run(model, epochs=epochs)
    return model, seen


# -- the frozen set follows the schedule ------------------------------------------------------


def test_frozen_modules_stay_bit_identical_and_stateless_until_their_epoch() -> None:
    pack = Unfreeze({0: ["head"], 1: ["layer10"], 2: "all"})
    model, seen = run_and_watch(pack, epochs=3)
    assert [s["trainable"] for s in seen] == [{"head"}, {"head", "layer10"}, set(NAMES)]
    # Adam with weight decay: a frozen parameter it stepped at all would have moved
    assert [s["changed"] for s in seen] == [s["trainable"] for s in seen]
    assert [s["state"] for s in seen] == [s["trainable"] for s in seen]
    # teardown gives back the flags the module had
    assert all(p.requires_grad for p in model.module.parameters())


def test_modules_never_listed_train_only_with_all() -> None:
    _, seen = run_and_watch(Unfreeze({0: ["head", "layer2"]}), epochs=2)
    assert [s["changed"] for s in seen] == [{"head", "layer2"}] * 2
    assert seen[-1]["state"] == {"head", "layer2"}


@pytest.mark.parametrize(
    ("names", "trainable"),
    [
        (["layer1"], {"layer1"}),  # exact: layer1, not layer10
        (["layer"], {"layer1", "layer2", "layer10"}),  # no module 'layer': a prefix
        (["layer1", "head"], {"layer1", "head"}),
        ("layer10", {"layer10"}),  # one name alone
    ],
)
def test_exact_names_and_prefixes(names: Any, trainable: set[str]) -> None:
    _, seen = run_and_watch(Unfreeze({0: names}), epochs=1)
    assert seen[0]["trainable"] == trainable
    assert seen[0]["changed"] == trainable


def test_a_parameter_name_freezes_the_rest_of_its_module() -> None:
    model = staged()
    bias_before = model.module.head.bias.detach().clone()
    weight_before = model.module.head.weight.detach().clone()
    run_and_watch(Unfreeze({0: ["head.weight"]}), epochs=1, model=model)
    assert torch.equal(model.module.head.bias, bias_before)
    assert not torch.equal(model.module.head.weight, weight_before)


def test_a_config_s_string_keys_mean_the_same() -> None:
    args = tomllib.loads('schedule = { 0 = ["head"], 1 = "all" }\nlr_scale = { 1 = 1.0 }')
    assert args["schedule"] == {"0": ["head"], "1": "all"}  # TOML keys are strings
    _, by_int = run_and_watch(Unfreeze({0: ["head"], 1: "all"}), epochs=2)
    _, by_str = run_and_watch(Unfreeze(**args), epochs=2)
    assert (
        [s["changed"] for s in by_int] == [s["changed"] for s in by_str] == [{"head"}, set(NAMES)]
    )


def test_a_stale_gradient_of_a_frozen_parameter_is_dropped() -> None:
    model = staged()
    for p in model.module.parameters():
        p.grad = torch.ones_like(p)  # e.g. left over from a backward outside the run
    _, seen = run_and_watch(Unfreeze({0: ["head"]}), epochs=1, model=model)
    assert seen[0]["changed"] == {"head"}


def test_eval_runs_are_left_alone() -> None:
    engine, model = runmodel.Engine(), staged()
    engine.attach(Unfreeze({0: ["head"]}))
    flags: list[bool] = []
    engine.on("runstep", lambda e: flags.extend(p.requires_grad for p in model.module.parameters()))
    result = engine.run(model, mode="eval")
    assert result.steps == 4 and all(flags)


# -- resume -------------------------------------------------------------------------------------

SCHEDULE = {0: ["head"], 2: ["layer10"], 3: "all"}


def test_a_resumed_run_freezes_by_its_epoch_and_ends_bit_identical(tmp_path: Path) -> None:
    straight = staged()
    engine = runmodel.Engine()
    engine.attach(Unfreeze(SCHEDULE))
    engine.run(straight, epochs=4)

    first = runmodel.Engine()
    first.attach(Unfreeze(SCHEDULE), Checkpoint(tmp_path))
    first.run(staged(), epochs=2)
    saved = torch.load(tmp_path / "ckpt-00002-0000000008.pt", weights_only=True)
    assert len(saved["model"]["optimizer"]["state"]) == 2  # head's weight and bias only

    resumed = staged()
    second = runmodel.Engine()
    second.attach(Unfreeze(SCHEDULE), Checkpoint(tmp_path / "again"))
    states: list[set[str]] = []
    second.on("epoch_end", lambda e: states.append(with_state(resumed)))
    result = second.run(resumed, epochs=4, resume=tmp_path)
    assert (result.steps, result.epochs) == (16, 4)
    # epoch 2: layer1 and layer2 still frozen after the resume, and still without state
    assert states == [{"head", "layer10"}, set(NAMES)]
    assert_equal_params(resumed, straight)
    assert_same(resumed.optimizer.state_dict(), straight.optimizer.state_dict(), "optimizer")


# -- lr_scale --------------------------------------------------------------------------------


class HandGrouped(Tiny):
    """``staged()``, but its setup builds by hand the groups lr_scale={2: 0.1} makes."""

    def setup(self, setup_options: dict[str, Any] | None = None) -> None:
        super().setup(setup_options)
        head = list(self.module.head.parameters())
        rest = [p for p in self.module.parameters() if all(p is not h for h in head)]
        self.optimizer = torch.optim.Adam(
            [{"params": head}, {"params": rest, "lr": 0.001}], lr=0.01, weight_decay=0.1
        )


def test_lr_scale_regroups_the_optimizer_like_groups_made_by_hand() -> None:
    scaled = staged()
    engine = runmodel.Engine()
    engine.attach(Unfreeze({0: ["head"], 2: "all"}, lr_scale={2: 0.1}))
    groups: list[list[tuple[float, float, int, Any]]] = []
    engine.on(
        "setup",
        lambda e: groups.append(
            [
                (g["lr"], g["weight_decay"], len(g["params"]), g["unfreeze_epoch"])
                for g in e.model.optimizer.param_groups
            ]
        ),
        priority=-100,
    )
    engine.run(scaled, epochs=3)
    assert groups == [[(0.01, 0.1, 2, 0), (0.01 * 0.1, 0.1, 6, 2)]]

    by_hand = HandGrouped(lr=0.01)
    torch.manual_seed(0)
    by_hand.module = Staged()
    other = runmodel.Engine()
    other.attach(Unfreeze({0: ["head"], 2: "all"}))
    other.run(by_hand, epochs=3)
    assert_equal_params(scaled, by_hand)


def test_lr_scale_keeps_each_groups_options_and_unlisted_stages_keep_their_lr() -> None:
    model = staged()
    model.module.extra = nn.Linear(1, 1)  # a module the schedule never lists: frozen
    engine = runmodel.Engine()
    engine.attach(Unfreeze({0: ["head"], 1: ["layer"]}, lr_scale={0: 2.0}))
    engine.run(model, epochs=2)
    groups = model.optimizer.param_groups
    assert [(g["lr"], g["unfreeze_epoch"], len(g["params"])) for g in groups] == [
        (0.02, 0, 2),
        (0.01, 1, 6),
        (0.01, None, 2),
    ]
    assert all(g["betas"] == (0.9, 0.999) and g["weight_decay"] == 0.1 for g in groups)
    assert not any(p in model.optimizer.state for p in model.module.extra.parameters())


def test_a_second_run_of_the_same_optimizer_does_not_scale_twice() -> None:
    torch.manual_seed(0)
    module = Staged()
    optimizer = torch.optim.Adam(module.parameters(), lr=0.01)
    # from parts: setup() keeps this optimizer, so the second run finds it regrouped
    model = runmodel.TorchModel.from_parts(
        module, optimizer=optimizer, loss_fn=nn.MSELoss(), train_data=make_data(), device="cpu"
    )
    engine = runmodel.Engine()
    engine.attach(Unfreeze({0: ["head"], 1: "all"}, lr_scale={1: 0.5}))
    for _ in range(2):
        engine.run(model, epochs=2)
        assert model.optimizer is optimizer
        assert [g["lr"] for g in optimizer.param_groups] == [0.01, 0.005]


def test_lr_scale_resumes_into_the_regrouped_optimizer(tmp_path: Path) -> None:
    def pack() -> Unfreeze:
        return Unfreeze({0: ["head"], 1: ["layer10"], 2: "all"}, lr_scale={1: 0.5, 2: 0.1})

    straight, engine = staged(), runmodel.Engine()
    engine.attach(pack())
    engine.run(straight, epochs=3)

    first = runmodel.Engine()
    first.attach(pack(), Checkpoint(tmp_path))
    first.run(staged(), epochs=1)
    resumed, second = staged(), runmodel.Engine()
    second.attach(pack(), Checkpoint(tmp_path / "again"))
    second.run(resumed, epochs=3, resume=tmp_path)
    assert [g["lr"] for g in resumed.optimizer.param_groups] == [0.01, 0.005, 0.001]
    assert_equal_params(resumed, straight)
    assert_same(resumed.optimizer.state_dict(), straight.optimizer.state_dict(), "optimizer")


# -- mistakes ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schedule", "lr_scale", "error", "match"),
    [
        ({}, None, TypeError, r"takes a dict of epochs to module names or 'all'"),
        (["head"], None, TypeError, r"takes a dict of epochs"),
        ({0: []}, None, ValueError, r"names no module"),
        ({0: [], 3: ()}, None, ValueError, r"names no module"),
        ({-1: ["head"]}, None, ValueError, r"keys are epochs, whole numbers >= 0 .* got -1"),
        ({1.5: ["head"]}, None, ValueError, r"keys are epochs.* got 1.5"),
        ({True: ["head"]}, None, ValueError, r"keys are epochs.* got True"),
        ({"two": ["head"]}, None, ValueError, r"keys are epochs.* got 'two'"),
        ({2: ["head"], "2": "all"}, None, ValueError, r"epoch 2 appears twice"),
        ({0: 3}, None, TypeError, r"schedule\[0\] must be a module name, a list"),
        ({0: ["head", ""]}, None, TypeError, r"schedule\[0\] must be a module name"),
        ({0: ["head"]}, {5: 0.1}, ValueError, r"lr_scale names epoch 5, which is not a stage"),
        ({0: ["head"]}, {0: 0}, ValueError, r"lr_scale\[0\] must be a number > 0"),
        ({0: ["head"]}, {0: "x"}, ValueError, r"lr_scale\[0\] must be a number > 0"),
        ({0: ["head"]}, {0: float("nan")}, ValueError, r"lr_scale\[0\] must be a number > 0"),
        ({0: ["head"]}, 0.1, TypeError, r"lr_scale=\) takes a dict of schedule epochs"),
    ],
)
def test_bad_schedules_fail_at_construction(
    schedule: Any, lr_scale: Any, error: type, match: str
) -> None:
    with pytest.raises(error, match=match) as caught:
        Unfreeze(schedule, lr_scale=lr_scale)
    assert "\n" not in str(caught.value)


def run_failing(pack: Unfreeze, model: Tiny | None = None) -> tuple[BaseException, Tiny, int]:
    model = model or staged()
    engine = runmodel.Engine()
    engine.attach(pack)
    steps: list[int] = []
    engine.on("runstep", lambda e: steps.append(e.state.step))
    with pytest.raises((ValueError, TypeError)) as caught:
        engine.run(model, epochs=1)
    return caught.value, model, len(steps)


def test_an_unknown_name_fails_when_the_run_starts_with_a_did_you_mean() -> None:
    error, model, steps = run_failing(Unfreeze({0: ["head"], 2: ["layr10"]}))
    assert str(error) == (
        "Unfreeze: schedule[2] names 'layr10', but Staged has no module or parameter of that "
        "name or starting with it. Did you mean 'layer10'? Its modules: layer1, layer2, "
        "layer10, head"
    )
    assert steps == 0
    assert all(p.requires_grad for p in model.module.parameters())  # nothing left frozen


def test_a_schedule_with_nothing_trainable_at_the_start_fails_before_the_first_step() -> None:
    error, _, steps = run_failing(Unfreeze({2: ["head"]}))
    assert "no parameter of the module is trainable at epoch 0" in str(error)
    assert "list what trains from the start under epoch 0" in str(error)
    assert steps == 0


def test_a_model_without_a_module_is_a_clear_error() -> None:
    engine = runmodel.Engine()
    engine.attach(Unfreeze({0: ["head"]}))
    with pytest.raises(TypeError, match=r"Unfreeze needs a model with a torch module"):
        engine.run(Counting(), epochs=1)

"""The model contract: options, devices, the module on its device, batches moved."""

from __future__ import annotations

import functools
import warnings
from collections import namedtuple
from typing import Any

import pytest
import torch
from torch import nn

import runmodel
from runmodel.models import resolve_options, torch_device

from helpers import make_data


class Options(runmodel.TorchModel):
    init_defaults = {
        "hidden": 8,
        "dropout": 0.1,
        "act": "relu",
        "sizes": (1, 2),
        "bias": True,
        "anything": None,
    }
    setup_defaults = {"lr": 0.01}

    def __init__(
        self, device: str | None = None, init_options: dict[str, Any] | None = None
    ) -> None:
        super().__init__(device, init_options)
        self.module = nn.Linear(4, self.init_options["hidden"])

    def setup(self, setup_options: dict[str, Any] | None = None) -> None:
        self.received = setup_options
        self.infer_data = [(torch.ones(2, 4), torch.zeros(2))]


def test_options_fill_defaults_and_take_known_values() -> None:
    model = Options(init_options={"hidden": 3, "dropout": 1, "sizes": [4], "anything": "x"})
    assert model.init_options == {
        "hidden": 3,
        "dropout": 1.0,
        "act": "relu",
        "sizes": [4],
        "bias": True,
        "anything": "x",
    }
    assert isinstance(model.init_options["dropout"], float)
    assert model.module.out_features == 3
    assert Options(init_options=None).init_options["hidden"] == 8


def test_unknown_options_warn_once_each_and_are_ignored() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = Options(init_options={"hidden": 2, "colour": "red", "size": 3})
    texts = [str(w.message) for w in caught]
    assert len(texts) == 2
    assert "unknown init option 'colour' ignored" in texts[0] and "hidden" in texts[0]
    assert "'size'" in texts[1]
    assert "colour" not in model.init_options


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"hidden": "8"}, r"init option 'hidden' must be int .*got '8'"),
        ({"hidden": 2.5}, r"'hidden' must be int"),
        ({"hidden": True}, r"'hidden' must be int"),
        ({"bias": 1}, r"'bias' must be bool"),
        ({"dropout": "high"}, r"'dropout' must be float or int"),
        ({"sizes": 3}, r"'sizes' must be list or tuple"),
        ({"act": None}, r"'act' must be str"),
    ],
)
def test_bad_values_for_known_options_are_errors(options: dict[str, Any], match: str) -> None:
    with pytest.raises(TypeError, match=match):
        Options(init_options=options)


def test_options_must_be_a_dict() -> None:
    with pytest.raises(TypeError, match="init_options must be a dict or None"):
        Options(init_options=["hidden", 3])  # type: ignore[arg-type]


def test_setup_options_are_resolved_by_the_engine() -> None:
    model = Options()
    engine = runmodel.Engine()
    with pytest.warns(UserWarning, match="unknown setup option 'momentum'"):
        engine.run(model, mode="infer", steps=0, setup_options={"lr": 1, "momentum": 0.9})
    assert model.received == {"lr": 1.0}
    engine.run(model, mode="infer", steps=0)
    assert model.received == {"lr": 0.01}
    with pytest.raises(TypeError, match="setup option 'lr' must be float"):
        engine.run(model, mode="infer", steps=0, setup_options={"lr": "fast"})


def test_undeclared_options_pass_through() -> None:
    class Plain(runmodel.Model):
        def setup(self, setup_options: dict[str, Any] | None = None) -> None:
            self.received = setup_options

        def run(
            self, runstep: runmodel.RunStep, steps: int | None = None, *a: Any, **k: Any
        ) -> None:
            pass

    model = Plain(init_options={"free": 1})
    assert model.init_options == {"free": 1}
    runmodel.Engine().run(model, setup_options={"anything": 2})
    assert model.received == {"anything": 2}


def test_resolve_options_names_the_owner() -> None:
    with pytest.raises(TypeError, match=r"^Options: setup option 'lr'"):
        resolve_options(Options(), "setup", {"lr": [1]}, {"lr": 0.1})


@pytest.mark.parametrize(
    ("device", "match"),
    [
        ("gpu", "not a device torch knows"),
        ("cuda:x", "not a device torch knows"),
        ("cuda", "no CUDA device is available"),
        ("cuda:1", "no CUDA device is available"),
    ],
)
def test_bad_or_absent_devices_are_clear_errors(device: str, match: str) -> None:
    if torch.cuda.is_available() and match.startswith("no CUDA"):
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match=match):
        Options(device=device)


def test_default_device_is_cuda_when_available_else_cpu() -> None:
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert torch_device(None).type == expected
    assert Options().device.type == expected


def test_module_lives_on_the_models_device() -> None:
    model = Options(device="meta")  # a real non-CPU device that needs no hardware
    assert model.module.weight.device.type == "meta"
    model.module = nn.Linear(2, 2)
    assert model.module.weight.device.type == "meta"
    assert model.model() is model.module


def test_model_is_cheap_and_needs_no_setup() -> None:
    model = Options()
    assert isinstance(model.model(), nn.Linear)
    assert model.optimizer is None and model.train_data is None


def test_to_device_moves_nested_batches() -> None:
    Pair = namedtuple("Pair", "x y")
    model = Options(device="meta")
    batch = {
        "a": torch.ones(2),
        "b": [torch.zeros(1), (torch.ones(3), "label")],
        "c": Pair(torch.ones(1), 7),
    }
    moved = model.to_device(batch)
    assert moved["a"].device.type == "meta"
    assert moved["b"][0].device.type == "meta" and moved["b"][1][0].device.type == "meta"
    assert moved["b"][1][1] == "label" and isinstance(moved["b"][1], tuple)
    assert isinstance(moved["c"], Pair) and moved["c"].x.device.type == "meta"
    assert moved["c"].y == 7


def test_default_loop_moves_batches_to_the_device() -> None:
    seen: list[str] = []

    class Meta(runmodel.TorchModel):
        def __init__(self) -> None:
            super().__init__(device="meta")
            self.module = nn.Linear(2, 2)

        def setup(self, setup_options: dict[str, Any] | None = None) -> None:
            self.infer_data = [(torch.ones(3, 2), torch.zeros(3))] * 2

    engine = runmodel.Engine()
    engine.on("step_start", lambda e: seen.append(e.state.batch[0].device.type))
    result = engine.run(Meta(), mode="infer")
    assert seen == ["meta", "meta"] and result.outputs[0].device.type == "meta"


def test_a_run_puts_module_batches_and_outputs_on_the_models_device(device: str) -> None:
    data = make_data(2)
    model = runmodel.TorchModel.from_parts(
        nn.Linear(4, 1),
        optimizer=functools.partial(torch.optim.SGD, lr=0.1),
        loss_fn=nn.MSELoss(),
        train_data=data,
        infer_data=data,
        device=device,
    )
    seen: list[tuple[str, ...]] = []
    engine = runmodel.Engine()
    engine.on("step_start", lambda e: seen.append(tuple(t.device.type for t in e.state.batch)))
    engine.run(model, epochs=1)
    result = runmodel.Engine().run(model, mode="infer")
    assert model.device == torch.device(device)
    assert all(p.device.type == device for p in model.module.parameters())
    assert seen == [(device, device)] * 2
    assert result.outputs is not None and [o.device.type for o in result.outputs] == [device] * 2
    assert all(x.device.type == "cpu" for x, _ in data)  # each batch moved, the data left


def test_missing_data_for_a_mode_is_a_clear_error() -> None:
    model = Options()
    with pytest.raises(ValueError, match="has no eval_data for a eval step"):
        runmodel.Engine().run(model, mode="eval")


def test_a_model_must_define_run() -> None:
    class NoLoop(runmodel.Model):
        pass

    with pytest.raises(TypeError, match="abstract method"):
        NoLoop()  # type: ignore[abstract]


def test_a_plain_model_without_step_says_what_to_define() -> None:
    class NoStep(runmodel.Model):
        def run(
            self, runstep: runmodel.RunStep, steps: int | None = None, *a: Any, **k: Any
        ) -> None:
            runstep(1)

    with pytest.raises(NotImplementedError, match=r"must define step\(batch\)"):
        runmodel.Engine().run(NoStep())

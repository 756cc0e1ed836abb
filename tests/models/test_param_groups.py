"""Param groups a fine-tuner builds (``runmodel.param_groups``), from Python and from a
config's optimizer spec (``no_decay``, ``lr_scale``); and ``Unfreeze`` refusing, at setup,
an optimizer that does not hold the layers it unfreezes."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import runmodel
from runmodel.config.registry import Spec, optimizer_factory
from runmodel.packs.unfreeze import Unfreeze

from helpers import Tiny


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.dense = nn.Linear(4, 4)
        self.LayerNorm = nn.LayerNorm(4)


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embeddings = nn.Embedding(10, 4)
        self.layer = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embeddings(x).mean(1)
        for block in self.layer:
            h = block.LayerNorm(torch.relu(block.dense(h)))
        return self.head(h)


def names(module: nn.Module, group: dict[str, Any]) -> list[str]:
    ids = {id(p) for p in group["params"]}
    return [n for n, p in module.named_parameters() if id(p) in ids]


def test_no_decay_names_get_no_weight_decay() -> None:
    module = Encoder()
    decay, no_decay = runmodel.param_groups(module, weight_decay=0.01)
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert names(module, no_decay) == [
        "layer.0.dense.bias",
        "layer.0.LayerNorm.weight",
        "layer.0.LayerNorm.bias",
        "layer.1.dense.bias",
        "layer.1.LayerNorm.weight",
        "layer.1.LayerNorm.bias",
        "head.bias",
    ]
    assert names(module, decay) == [
        "embeddings.weight",
        "layer.0.dense.weight",
        "layer.1.dense.weight",
        "head.weight",
    ]
    assert "lr" not in decay  # the optimizer's lr, unless lr= is given


def test_a_factor_per_part_is_layer_wise_lr_decay() -> None:
    module = Encoder()
    scales = {"embeddings": 0.25, "layer.0": 0.5, "layer.1": 0.75, "layer.1.dense.bias": 0.1}
    groups = runmodel.param_groups(module, weight_decay=0.01, lr=0.2, lr_scale=scales)
    by_name = {n: (g["lr"], g["weight_decay"]) for g in groups for n in names(module, g)}
    assert by_name["embeddings.weight"] == (0.2 * 0.25, 0.01)
    assert by_name["layer.0.dense.weight"] == (0.2 * 0.5, 0.01)
    assert by_name["layer.1.LayerNorm.weight"] == (0.2 * 0.75, 0.0)
    assert by_name["layer.1.dense.bias"] == (0.2 * 0.1, 0.0)  # the longest name wins
    assert by_name["head.weight"] == (0.2, 0.01)
    assert sum(len(g["params"]) for g in groups) == len(list(module.parameters()))
    optimizer = torch.optim.AdamW(groups, lr=0.2)  # what a torch optimizer takes
    assert [g["lr_scale"] for g in optimizer.param_groups][:2] == [0.25, 0.5]


def test_mistakes_are_named() -> None:
    with pytest.raises(ValueError, match=r"names 'layers.0', .* Did you mean 'layer.0'"):
        runmodel.param_groups(Encoder(), lr=0.1, lr_scale={"layers.0": 0.5})
    with pytest.raises(ValueError, match=r"give lr="):
        runmodel.param_groups(Encoder(), lr_scale={"layer.0": 0.5})


def test_a_configs_optimizer_groups_by_name() -> None:
    spec = Spec(
        "adamw",
        {"lr": 0.1, "weight_decay": 0.05, "no_decay": ["bias"], "lr_scale": {"layer.0": 0.5}},
    )
    module = Encoder()
    optimizer = optimizer_factory(spec).for_module(module)
    assert isinstance(optimizer, torch.optim.AdamW)
    seen = {(g["lr"], g["weight_decay"]) for g in optimizer.param_groups}
    assert seen == {(0.1, 0.05), (0.1, 0.0), (0.05, 0.05), (0.05, 0.0)}
    with pytest.raises(ValueError, match=r"names 'layers'"):
        optimizer_factory(Spec("adamw", {**spec.args, "lr_scale": {"layers": 2.0}})).for_module(
            module
        )

    class Model(Tiny):
        def __init__(self) -> None:
            super().__init__()
            self.module = Encoder()

    backend = runmodel.make_backend("plain")
    backend.optimizer = optimizer_factory(spec)  # as a config run sets it
    model = Model()
    model.setup()
    backend.initialize(model, None)  # type: ignore[arg-type]  # the plain one reads none
    assert len(model.optimizer.param_groups) == 4


class Frozen(Tiny):
    """Freezes all but its last layer in setup, then builds the optimizer."""

    def __init__(self, *, all_parameters: bool) -> None:
        super().__init__(hidden=8)
        self.all_parameters = all_parameters

    def setup(self, setup_options: dict[str, Any] | None = None) -> None:
        super().setup(setup_options)
        for p in self.module[0].parameters():
            p.requires_grad_(False)
        trained = (
            self.module.parameters()
            if self.all_parameters
            else (p for p in self.module.parameters() if p.requires_grad)
        )
        self.optimizer = torch.optim.AdamW(trained, lr=0.01)


def test_unfreeze_refuses_an_optimizer_without_the_layers_it_unfreezes() -> None:
    steps: list[int] = []
    engine = runmodel.Engine(Unfreeze({0: ["2"], 1: "all"}))
    engine.on("step_start", lambda e: steps.append(e.state.step))
    with pytest.raises(
        ValueError,
        match=r"the optimizer does not hold '0.weight' \(trained from epoch 1\) and 1 more, "
        r"so it would never be updated: .* Build it over all of them",
    ):
        engine.run(Frozen(all_parameters=False), epochs=2)
    assert steps == []
    model = Frozen(all_parameters=True)
    before = model.module[0].weight.detach().clone()
    runmodel.Engine(Unfreeze({0: ["2"], 1: "all"})).run(model, epochs=2)
    assert not torch.equal(before, model.module[0].weight)  # it trained from epoch 1

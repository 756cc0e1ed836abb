"""Evaluation sums in double precision: a loss averaged over batches equals what a script
computes with ``total += len(batch) * loss.item()``, bit for bit (ignite's float32 sum
differs in the 8th digit, enough to flip a near-tie for "best")."""

from __future__ import annotations

import torch
from ignite.metrics import Loss
from torch import nn

import runmodel
from runmodel.packs import Evaluate

from helpers import Tiny


def uneven_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """60 batches of 5 to 16 rows of a regression that the model fits badly."""
    g = torch.Generator().manual_seed(3)
    sizes = torch.randint(5, 17, (60,), generator=g).tolist()
    return [
        (torch.randn(n, 4, generator=g) * 3, torch.randn(n, 1, generator=g) * 10) for n in sizes
    ]


def script_mean(module: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in batches:
            total += len(y) * nn.functional.mse_loss(module(x), y).item()
            count += len(y)
    return total / count


def test_the_loss_over_an_evaluation_equals_a_scripts_double_sum() -> None:
    model, data = Tiny(), uneven_batches()
    model.setup()  # its loss_fn
    expected = script_mean(model.module, data)
    assert runmodel.evaluate(model, data)["loss"] == expected
    # what ignite's own Loss (a float32 sum) gives on the same batches: not the same
    float32 = runmodel.evaluate(model, data, {"loss": Loss(nn.MSELoss())})["loss"]
    assert float32 != expected and abs(float32 - expected) < 1e-4 * expected


def test_the_evaluate_pack_and_eval_mode_report_the_same_double_sum() -> None:
    model, data = Tiny(), uneven_batches()
    engine = runmodel.Engine(Evaluate(data=data))
    engine.override("optimizer_step", lambda e, default: None)  # weights stay as they are
    assert engine.run(model, epochs=1).metrics["eval_loss"] == script_mean(model.module, data)

    class OnThatData(Tiny):
        def setup(self, setup_options: object = None) -> None:
            super().setup()
            self.eval_data = data

    assert runmodel.Engine().run(OnThatData(), "eval").metrics["loss"] == script_mean(
        model.module, data
    )

"""Default metrics do not depend on how the loss is written (issue 36, item 6).

``F.cross_entropy``/``F.nll_loss`` (the functions, as pytorch/examples write them) get the
metrics ``nn.CrossEntropyLoss()``/``nn.NLLLoss()`` get: the loss and the accuracy. The
evaluation loss equals each way scripts compute it, bit for bit (``==``):

- ``total += loss.item() * len(y)`` then ``total / N``: the default;
- ``total += loss_fn(out, y, reduction="sum").item()`` then ``total / N``:
  ``loss_reduction="sum"``;
- a Lightning module's ``self.log("val_loss", loss)`` epoch value (a float32 sum of
  ``loss * batch_size`` over a float32 count): ``loss_reduction="float32"``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from ignite.metrics import Accuracy
from torch import nn

import runmodel
from runmodel.packs import Evaluate

Batches = list[tuple[torch.Tensor, torch.Tensor]]


def uneven_batches(seed: int = 3) -> Batches:
    """40 batches of 5 to 16 rows of a 5-class problem that the module fits badly."""
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(5, 17, (40,), generator=g).tolist()
    return [
        (torch.randn(n, 6, generator=g) * 4, torch.randint(0, 5, (n,), generator=g)) for n in sizes
    ]


def classifier(loss_fn: Callable[..., torch.Tensor], log_softmax: bool = False) -> Any:
    torch.manual_seed(0)
    module: nn.Module = nn.Linear(6, 5)
    if log_softmax:
        module = nn.Sequential(module, nn.LogSoftmax(dim=1))
    return runmodel.TorchModel.from_parts(module, loss_fn=loss_fn, eval_data=uneven_batches())


def mean_times_n(module: nn.Module, data: Batches, loss_fn: Callable[..., Any]) -> float:
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in data:
            total += loss_fn(module(x), y).item() * len(y)
            count += len(y)
    return total / count


def summed(module: nn.Module, data: Batches, loss_fn: Callable[..., Any]) -> float:
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in data:
            total += loss_fn(module(x), y, reduction="sum").item()
            count += len(y)
    return total / count


def lightning(module: nn.Module, data: Batches, loss_fn: Callable[..., Any]) -> float:
    """What ``self.log("val_loss", loss)`` in ``validation_step`` gives for the epoch
    (Lightning's ``_ResultMetric``: float32 ``value`` and ``cumulated_batch_size``)."""
    value, cumulated_batch_size = torch.tensor(0.0), torch.tensor(0.0)
    with torch.no_grad():
        for x, y in data:
            loss = loss_fn(module(x), y)
            value += loss.float().mean() * len(y)
            cumulated_batch_size += len(y)
    return (value / cumulated_batch_size).item()


FUNCTIONS = [
    pytest.param(F.cross_entropy, nn.CrossEntropyLoss(), False, id="cross_entropy"),
    pytest.param(F.nll_loss, nn.NLLLoss(), True, id="nll_loss"),
]


@pytest.mark.parametrize(("function", "module_loss", "log_softmax"), FUNCTIONS)
def test_a_functional_loss_gets_the_metrics_of_its_module(
    function: Callable[..., torch.Tensor], module_loss: nn.Module, log_softmax: bool
) -> None:
    by_function = classifier(function, log_softmax)
    by_module = classifier(module_loss, log_softmax)
    assert sorted(by_function.metrics()) == sorted(by_module.metrics()) == ["accuracy", "loss"]
    evaluated = runmodel.evaluate(by_function)
    assert evaluated == runmodel.evaluate(by_module)
    expected = runmodel.evaluate(by_function, metrics={"accuracy": Accuracy()})["accuracy"]
    assert evaluated["accuracy"] == expected


def test_a_partial_of_a_functional_loss_is_that_loss() -> None:
    smoothed = classifier(functools.partial(F.cross_entropy, label_smoothing=0.1))
    assert sorted(smoothed.metrics()) == ["accuracy", "loss"]
    assert sorted(classifier(F.mse_loss).metrics()) == ["loss"]  # no accuracy for others


@pytest.mark.parametrize(("function", "module_loss", "log_softmax"), FUNCTIONS)
def test_the_loss_equals_each_scripts_way_of_summing_it(
    function: Callable[..., torch.Tensor], module_loss: nn.Module, log_softmax: bool
) -> None:
    for loss_fn in (function, module_loss):
        model = classifier(loss_fn, log_softmax)
        module, data = model.module, model.eval_data
        ways = {
            "mean": mean_times_n(module, data, function),
            "sum": summed(module, data, function),
            "float32": lightning(module, data, function),
        }
        assert len(set(ways.values())) == 3  # the three differ in the last bits here
        for reduction, expected in ways.items():
            got = runmodel.evaluate(model, loss_reduction=reduction)["loss"]
            assert got == expected, (loss_fn, reduction)
        assert runmodel.evaluate(model)["loss"] == ways["mean"]  # the default


def test_the_evaluate_pack_sums_its_loss_as_asked() -> None:
    data = uneven_batches(seed=4)
    for reduction, way in (("mean", mean_times_n), ("sum", summed), ("float32", lightning)):
        model = classifier(F.cross_entropy)
        model.train_data = uneven_batches(seed=5)[:3]
        model.optimizer = torch.optim.SGD(model.module.parameters(), lr=0.1)
        engine = runmodel.Engine()
        engine.attach(Evaluate(data=data, loss_reduction=reduction))
        result = engine.run(model, epochs=1)
        assert result.metrics["eval_loss"] == way(model.module, data, F.cross_entropy)


def test_a_loss_reduction_needs_the_models_loss_metric() -> None:
    model = classifier(F.cross_entropy)
    with pytest.raises(ValueError, match=r"loss_reduction='sum' sets how the loss metric"):
        runmodel.evaluate(model, metrics={"accuracy": Accuracy()}, loss_reduction="sum")

"""An ignite program (pytorch-ignite's MNIST example, shrunk to scikit-learn's digits):
``create_supervised_trainer``/``create_supervised_evaluator`` with ignite's ``Accuracy``
and ``Loss``, a loss line every few iterations, training and validation results after
every epoch; ported to runmodel with ``Evaluate`` over the two loaders (its metrics
ignite's own) and ``Progress``, the loss line an ignite handler on ``engine.ignite``
kept unchanged. Every printed number and the final weights are bit for bit the same."""

from __future__ import annotations

import io
import re
from typing import Any

import torch
from ignite.engine import Events, create_supervised_evaluator, create_supervised_trainer
from ignite.metrics import Accuracy, Loss
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import runmodel
from runmodel.packs import Evaluate, Progress

EPOCHS, LOG_INTERVAL = 3, 5


def loaders() -> tuple[DataLoader[Any], DataLoader[Any]]:
    """The example's loaders: training shuffled by torch's global generator (no
    ``generator=``), validation in order; each iterator draws a seed from it."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x[:480], dtype=torch.float32) / 16
    y = torch.tensor(y[:480])
    return (
        DataLoader(TensorDataset(x[:320], y[:320]), batch_size=32, shuffle=True),
        DataLoader(TensorDataset(x[320:], y[320:]), batch_size=64),
    )


def net() -> nn.Module:
    """The example's ``Net`` for 64 pixels, with dropout (draws in every training step)."""
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.25), nn.Linear(32, 10))


def loss_line(engine: Any) -> str:
    """The example's ``log_training_loss`` line, read off ignite's engine in both programs."""
    st = engine.state
    return f"Epoch[{st.epoch}] Iteration[{st.iteration}] Loss: {st.output:.4g}"


def results(name: str, epoch: int, metrics: dict[str, float]) -> str:
    return (
        f"{name} Results - Epoch: {epoch}  Avg accuracy: {metrics['accuracy']:.4g} "
        f"Avg loss: {metrics['loss']:.4g}"
    )


def ignite_program() -> tuple[nn.Module, list[str], list[dict[str, float]]]:
    torch.manual_seed(1)
    train_loader, val_loader = loaders()
    model = net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    criterion = nn.CrossEntropyLoss()
    trainer = create_supervised_trainer(model, optimizer, criterion)
    val_metrics = {"accuracy": Accuracy(), "loss": Loss(criterion)}
    evaluator = create_supervised_evaluator(model, metrics=val_metrics)
    printed: list[str] = []
    measured: list[dict[str, float]] = []

    @trainer.on(Events.ITERATION_COMPLETED(every=LOG_INTERVAL))
    def log_training_loss(engine: Any) -> None:
        printed.append(loss_line(engine))

    @trainer.on(Events.EPOCH_COMPLETED)
    def log_results(engine: Any) -> None:
        for loader in (train_loader, val_loader):
            evaluator.run(loader)
            measured.append(dict(evaluator.state.metrics))
        train, val = measured[-2:]
        printed.append(results("Training", engine.state.epoch, train))
        printed.append(results("Validation", engine.state.epoch, val))

    trainer.run(train_loader, max_epochs=EPOCHS)
    return model, printed, measured


def test_an_ignite_program_ported_with_evaluate_and_progress() -> None:
    module, expected, expected_metrics = ignite_program()

    torch.manual_seed(1)
    train_loader, val_loader = loaders()
    port = net()
    criterion = nn.CrossEntropyLoss()
    model = runmodel.TorchModel.from_parts(
        port,
        optimizer=torch.optim.SGD(port.parameters(), lr=0.1, momentum=0.5),
        loss_fn=criterion,
        train_data=train_loader,
        device="cpu",
    )
    shown = io.StringIO()
    engine = runmodel.Engine(
        # the evaluator over both loaders, with the program's own ignite metrics
        Evaluate(
            data={"train": train_loader, "val": val_loader},
            metrics={"accuracy": Accuracy(), "loss": Loss(criterion)},
        ),
        Progress(file=shown),  # one line an epoch off a terminal
    )
    printed: list[str] = []
    trainer = engine.ignite
    trainer.output_transform = lambda e: e.state.loss.item()  # ignite's trainer's output

    @trainer.on(Events.ITERATION_COMPLETED(every=LOG_INTERVAL))
    def log_training_loss(engine: Any) -> None:  # the program's handler, unchanged
        printed.append(loss_line(engine))

    metrics: list[dict[str, float]] = []

    @engine.on("epoch_end", after="evaluate")
    def log_results(engine: runmodel.Engine) -> None:
        m = engine.state.metrics
        for name in ("train", "val"):
            metrics.append({k: m[f"{name}_{k}"] for k in ("accuracy", "loss")})
        epoch = engine.state.epoch + 1
        printed.append(results("Training", epoch, metrics[-2]))
        printed.append(results("Validation", epoch, metrics[-1]))

    engine.run(model, epochs=EPOCHS)
    assert printed == expected and metrics == expected_metrics
    # what Progress printed: the same values, at its 4 significant digits
    lines = shown.getvalue().splitlines()
    assert len(lines) == EPOCHS
    for line, (train, val) in zip(
        lines, zip(metrics[::2], metrics[1::2], strict=True), strict=True
    ):
        values = dict(re.findall(r"(\w+) (-?[\d.]+(?:e-?\d+)?)", line))
        for name, measured in (("train", train), ("val", val)):
            for k, v in measured.items():
                assert values[f"{name}_{k}"] == f"{v:.4g}"
    for mine, theirs in zip(port.parameters(), module.parameters(), strict=True):
        assert torch.equal(mine, theirs)

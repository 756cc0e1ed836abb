"""The same small training run twice: (a) by pytorch-ignite's own ``Engine.run``, (b) by a
runmodel engine seen through ``engine.ignite``. A test attaches the same handlers to each
ignite engine with one function and compares what they saw and did.

Imported by the tests in this folder (pytest puts the folder on ``sys.path``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from ignite.engine import Engine, Events
from torch import nn

import runmodel

from helpers import make_data

FEATURES, CLASSES, BATCH, BATCHES = 6, 3, 8, 4  # 4 iterations an epoch

#: the events a trace records, in the order a recorder is attached
CORE = (
    Events.STARTED,
    Events.EPOCH_STARTED,
    Events.GET_BATCH_STARTED,
    Events.GET_BATCH_COMPLETED,
    Events.ITERATION_STARTED,
    Events.ITERATION_COMPLETED,
    Events.TERMINATE_SINGLE_EPOCH,
    Events.EPOCH_COMPLETED,
    Events.TERMINATE,
    Events.COMPLETED,
)

Attach = Callable[[Engine, nn.Module, torch.optim.Optimizer], Any]


def data(batches: int = BATCHES, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``batches`` batches of a 3-class task (how many of the first two features are
    positive), the same for the same arguments."""
    return make_data(batches, BATCH, FEATURES, classes=CLASSES, seed=seed)


def parts(
    lr: float = 0.1, dropout: float | None = None
) -> tuple[nn.Module, torch.optim.Optimizer, nn.Module]:
    """A linear classifier (or with ``dropout``, Linear-Dropout-Linear), the same weights
    every time and torch's generator seeded, SGD and cross-entropy."""
    torch.manual_seed(0)
    module = (
        nn.Linear(FEATURES, CLASSES)
        if dropout is None
        else nn.Sequential(nn.Linear(FEATURES, 16), nn.Dropout(dropout), nn.Linear(16, CLASSES))
    )
    return module, torch.optim.SGD(module.parameters(), lr=lr), nn.CrossEntropyLoss()


def recorder(engine: Engine, trace: list[tuple[Any, ...]], events: Iterable[Any] = CORE) -> None:
    """Record ``(event, epoch, iteration, epoch_length, max_epochs[, loss][, kwargs])`` at
    each of ``events``: ignite's state as the event fires. GET_BATCH_* are recorded only
    where ``events`` names them (handling them changes nothing but the trace)."""
    for event in events:

        def record(e: Engine, *args: Any, event: Any = event, **kwargs: Any) -> None:
            st = e.state
            row: list[Any] = [event.name, st.epoch, st.iteration, st.epoch_length, st.max_epochs]
            if event == Events.ITERATION_COMPLETED and isinstance(st.output, dict):
                row.append(round(float(st.output["loss"]), 6))
            if kwargs:
                row.append(kwargs)
            trace.append(tuple(row))

        engine.add_event_handler(event, record)


STEP_EVENTS = tuple(
    e for e in CORE if e not in (Events.GET_BATCH_STARTED, Events.GET_BATCH_COMPLETED)
)


@dataclass
class Twin:
    """One side of a comparison: the ignite engine, what its recorder saw, the parts
    trained, the error the run raised, what ``attach`` returned, and for runmodel the
    engine and the run's result."""

    engine: Engine
    trace: list[tuple[Any, ...]]
    module: nn.Module
    optimizer: torch.optim.Optimizer
    error: BaseException | None = None
    extra: Any = None
    runmodel: runmodel.Engine | None = None
    result: runmodel.RunResult | None = None
    log: list[Any] = field(default_factory=list)


def supervised_step(
    module: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: nn.Module
) -> Callable[[Engine, Any], Any]:
    """ignite's process function doing runmodel's train step; its output is the dict
    ``engine.ignite``'s ``default_output`` makes."""

    def step(engine: Engine, batch: Any) -> dict[str, Any]:
        module.train()
        x, y = batch
        out = module(x)
        loss = loss_fn(out, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return {"y_pred": out.detach(), "y": y, "loss": loss.detach(), "criterion_kwargs": {}}

    return step


def run_ignite(
    attach: Attach | None,
    epochs: int | None,
    *,
    batches: Any = None,
    lr: float = 0.1,
    dropout: float | None = None,
    events: Iterable[Any] = STEP_EVENTS,
    **run_kwargs: Any,
) -> Twin:
    """(a): ignite's ``Engine.run`` of the training, ``run_kwargs`` passed on."""
    module, optimizer, loss_fn = parts(lr, dropout)
    trainer = Engine(supervised_step(module, optimizer, loss_fn))
    trace: list[tuple[Any, ...]] = []
    recorder(trainer, trace, events)
    extra = attach(trainer, module, optimizer) if attach else None
    error = None
    try:
        trainer.run(data() if batches is None else batches, max_epochs=epochs, **run_kwargs)
    except Exception as e:
        error = e
    return Twin(trainer, trace, module, optimizer, error, extra)


def run_runmodel(
    attach: Attach | None,
    epochs: int | None,
    *,
    batches: Any = None,
    lr: float = 0.1,
    dropout: float | None = None,
    events: Iterable[Any] = STEP_EVENTS,
    steps: int | None = None,
    hooks: Callable[[runmodel.Engine], Any] | None = None,
    engine: runmodel.Engine | None = None,
) -> Twin:
    """(b): a runmodel train run of the same training, ``attach`` given ``engine.ignite``;
    ``hooks(engine)`` may add runmodel hooks after it."""
    module, optimizer, loss_fn = parts(lr, dropout)
    model = runmodel.TorchModel.from_parts(
        module,
        optimizer=optimizer,
        loss_fn=loss_fn,
        train_data=data() if batches is None else batches,
    )
    engine = engine or runmodel.Engine()
    mirror = engine.ignite
    trace: list[tuple[Any, ...]] = []
    recorder(mirror, trace, events)
    extra = attach(mirror, module, optimizer) if attach else None
    if hooks is not None:
        hooks(engine)
    error = result = None
    try:
        result = engine.run(model, "train", epochs=epochs, steps=steps)
    except Exception as e:
        error = e
    return Twin(mirror, trace, module, optimizer, error, extra, engine, result)

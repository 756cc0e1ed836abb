"""ignite's own handlers attached unchanged to ``engine.ignite`` behave as they do on an
ignite ``Engine`` running the same training (same model, data, seed): ProgressBar,
EarlyStopping, Checkpoint with DiskSaver, TensorboardLogger, the param schedulers and
metrics. Each test runs the training both ways (ignite_twin.py) and compares."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import torch
from ignite.engine import Engine, Events, create_supervised_evaluator
from ignite.handlers import (
    Checkpoint,
    CosineAnnealingScheduler,
    DiskSaver,
    EarlyStopping,
    LRScheduler,
    PiecewiseLinear,
    ProgressBar,
    global_step_from_engine,
)
from ignite.metrics import Accuracy, Loss, RunningAverage
from torch import nn

from ignite_twin import Twin, data, run_ignite, run_runmodel


def both(attach: Any, epochs: int, **kwargs: Any) -> tuple[Twin, Twin]:
    a, b = run_ignite(attach, epochs, **kwargs), run_runmodel(attach, epochs, **kwargs)
    assert a.error is None and b.error is None, (a.error, b.error)
    return a, b


def test_progress_bar_writes_the_same_text() -> None:
    bar = {
        "bar_format": "{desc}[{n_fmt}/{total_fmt}] {percentage:3.0f}%|{bar}{postfix}",
        "mininterval": 0,
        "ncols": 80,
    }  # no timings: the text is deterministic

    def attach(engine: Engine, *_: Any) -> tuple[io.StringIO, io.StringIO]:
        steps, epochs = io.StringIO(), io.StringIO()
        Accuracy().attach(engine, "acc")
        ProgressBar(persist=True, file=steps, **bar).attach(
            engine, metric_names=["acc"], output_transform=lambda o: {"loss": o["loss"]}
        )
        ProgressBar(persist=True, file=epochs, desc="epochs", **bar).attach(
            engine,
            metric_names="all",
            event_name=Events.EPOCH_COMPLETED,
            closing_event_name=Events.COMPLETED,
        )
        return steps, epochs

    with pytest.warns(UserWarning, match="'acc' is missing"):  # before the first epoch ends
        a, b = both(attach, 3)
    (steps_a, epochs_a), (steps_b, epochs_b) = a.extra, b.extra
    assert steps_b.getvalue() == steps_a.getvalue()
    assert epochs_b.getvalue() == epochs_a.getvalue()
    last = steps_b.getvalue().replace("\r", "\n").split("\n")[-2]
    assert last.startswith("Epoch [3/3]: [4/4] 100%|") and "loss=" in last and "acc=" in last


def test_early_stopping_stops_at_the_same_epoch() -> None:
    """An evaluator on held-out data after each epoch; EarlyStopping on it terminates the
    trainer (engine.ignite) after 2 epochs without a better accuracy."""

    def attach(engine: Engine, module: nn.Module, _: Any) -> list[float]:
        evaluator = create_supervised_evaluator(module, metrics={"acc": Accuracy()})
        scores: list[float] = []
        held_out = data(4, seed=1)
        engine.add_event_handler(Events.EPOCH_COMPLETED, lambda e: evaluator.run(held_out))
        evaluator.add_event_handler(
            Events.COMPLETED, lambda e: scores.append(e.state.metrics["acc"])
        )
        evaluator.add_event_handler(
            Events.COMPLETED,
            EarlyStopping(
                patience=2, score_function=lambda e: e.state.metrics["acc"], trainer=engine
            ),
        )
        return scores

    a, b = both(attach, 30, lr=0.3)
    assert b.extra == a.extra and len(b.extra) == 7  # stopped at epoch 7 of 30
    assert b.trace == a.trace
    assert b.engine.state.epoch == a.engine.state.epoch == 7
    assert b.result is not None and (b.result.ended, b.result.epochs) == ("stopped", 7)


def test_an_evaluator_run_by_a_handler_does_not_leave_training_in_eval_mode() -> None:
    """create_supervised_evaluator puts the module in eval mode and leaves it so; ignite's
    trainer step puts it back in train mode, and so does the mirror before the next step:
    with dropout, the same weights."""

    def attach(engine: Engine, module: nn.Module, _: Any) -> list[bool]:
        evaluator = create_supervised_evaluator(module, metrics={"acc": Accuracy()})
        engine.add_event_handler(
            Events.ITERATION_COMPLETED(every=3), lambda e: evaluator.run(data(2, seed=1))
        )
        modes: list[bool] = []
        engine.add_event_handler(
            Events.ITERATION_COMPLETED, lambda e: modes.append(module.training)
        )
        return modes

    a, b = both(attach, 3, dropout=0.5)
    assert b.extra == a.extra == [True, True, False] * 4  # False: right after evaluating
    assert all(
        torch.equal(p, q) for p, q in zip(a.module.parameters(), b.module.parameters(), strict=True)
    )


def test_early_stopping_on_the_trainers_own_epoch_completed() -> None:
    def attach(engine: Engine, *_: Any) -> None:
        Accuracy().attach(engine, "acc")
        engine.add_event_handler(
            Events.EPOCH_COMPLETED,
            EarlyStopping(
                patience=2, score_function=lambda e: -e.state.metrics["acc"], trainer=engine
            ),
        )

    a, b = both(attach, 30, lr=0.3)
    assert b.trace == a.trace and b.engine.state.epoch == a.engine.state.epoch < 30
    assert b.result is not None and b.result.ended == "stopped"


def test_checkpoint_with_disk_saver_writes_the_same_files(tmp_path: Path) -> None:
    def attach_to(root: Path) -> Any:
        def attach(engine: Engine, module: nn.Module, optimizer: Any) -> Path:
            where = root / ("ignite" if type(engine) is Engine else "runmodel")
            Accuracy().attach(engine, "acc")
            engine.add_event_handler(
                Events.EPOCH_COMPLETED,
                Checkpoint(
                    {"model": module, "optimizer": optimizer, "trainer": engine},
                    DiskSaver(where, require_empty=False),
                    n_saved=2,
                    global_step_transform=global_step_from_engine(engine),
                ),
            )
            engine.add_event_handler(
                Events.EPOCH_COMPLETED,
                Checkpoint(
                    {"model": module},
                    DiskSaver(where, require_empty=False),
                    n_saved=2,
                    filename_prefix="best",
                    score_function=lambda e: e.state.metrics["acc"],
                    score_name="acc",
                ),
            )
            engine.add_event_handler(
                Events.ITERATION_COMPLETED(every=3),
                Checkpoint(
                    {"model": module},
                    DiskSaver(where, require_empty=False),
                    n_saved=3,
                    filename_prefix="it",
                ),
            )
            return where

        return attach

    a, b = both(attach_to(tmp_path), 5)
    names = sorted(p.name for p in a.extra.iterdir())
    assert sorted(p.name for p in b.extra.iterdir()) == names
    assert [n for n in names if n.startswith(("checkpoint", "it"))] == [
        "checkpoint_4.pt",
        "checkpoint_5.pt",
        "it_model_12.pt",
        "it_model_15.pt",
        "it_model_18.pt",
    ]
    assert len([n for n in names if n.startswith("best_model_acc=")]) == 2
    for name in names:
        saved_a = torch.load(a.extra / name, weights_only=False)
        saved_b = torch.load(b.extra / name, weights_only=False)
        if "trainer" in saved_a:
            assert dict(saved_b["trainer"]) == dict(saved_a["trainer"])
        weights_a = saved_a.get("model", saved_a)
        weights_b = saved_b.get("model", saved_b)
        assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a), name
    trainer = torch.load(b.extra / "checkpoint_5.pt", weights_only=False)["trainer"]
    assert dict(trainer) == {"epoch_length": 4, "iteration": 20, "max_epochs": 5}


def test_tensorboard_logger_writes_the_same_scalars(tmp_path: Path) -> None:
    from ignite.handlers.tensorboard_logger import TensorboardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def attach(engine: Engine, module: nn.Module, optimizer: Any) -> Path:
        where = tmp_path / ("ignite" if type(engine) is Engine else "runmodel")
        Accuracy().attach(engine, "acc")
        logger = TensorboardLogger(log_dir=where)
        logger.attach_output_handler(
            engine,
            event_name=Events.ITERATION_COMPLETED(every=2),
            tag="training",
            output_transform=lambda o: {"batchloss": o["loss"]},
        )
        logger.attach_output_handler(
            engine,
            event_name=Events.EPOCH_COMPLETED,
            tag="training",
            metric_names=["acc"],
            global_step_transform=global_step_from_engine(engine),
        )
        logger.attach_opt_params_handler(
            engine, event_name=Events.ITERATION_STARTED, optimizer=optimizer
        )
        engine.add_event_handler(Events.COMPLETED, lambda e: logger.close())
        return where

    def scalars(where: Path) -> dict[str, list[tuple[int, float]]]:
        events = EventAccumulator(str(where))
        events.Reload()
        return {
            tag: [(e.step, e.value) for e in events.Scalars(tag)]
            for tag in sorted(events.Tags()["scalars"])
        }

    a, b = both(attach, 3)
    scalars_a, scalars_b = scalars(a.extra), scalars(b.extra)
    assert list(scalars_a) == ["lr/group_0", "training/acc", "training/batchloss"]
    assert scalars_b == scalars_a
    assert [step for step, _ in scalars_b["training/batchloss"]] == [2, 4, 6, 8, 10, 12]
    assert [step for step, _ in scalars_b["training/acc"]] == [1, 2, 3]
    assert [step for step, _ in scalars_b["lr/group_0"]] == list(range(1, 13))


def scheduler(kind: str) -> Any:
    def attach(engine: Engine, module: nn.Module, optimizer: Any) -> list[float]:
        if kind == "LRScheduler(StepLR)":
            engine.add_event_handler(
                Events.ITERATION_COMPLETED,
                LRScheduler(
                    torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5),
                    save_history=True,
                ),
            )
        elif kind == "PiecewiseLinear":
            engine.add_event_handler(
                Events.ITERATION_COMPLETED,
                PiecewiseLinear(
                    optimizer, "lr", [(0, 0.1), (5, 0.02), (10, 0.05)], save_history=True
                ),
            )
        else:
            engine.add_event_handler(
                Events.ITERATION_STARTED,
                CosineAnnealingScheduler(
                    optimizer, "lr", 0.1, 0.001, cycle_size=6, save_history=True
                ),
            )
        lrs: list[float] = []
        engine.add_event_handler(
            Events.ITERATION_COMPLETED, lambda e: lrs.append(optimizer.param_groups[0]["lr"])
        )
        return lrs

    return attach


@pytest.mark.parametrize(
    "kind", ["LRScheduler(StepLR)", "PiecewiseLinear", "CosineAnnealingScheduler"]
)
def test_param_schedulers_set_the_same_learning_rates(kind: str) -> None:
    a, b = both(scheduler(kind), 3)
    assert b.extra == a.extra and len(set(b.extra)) > 2
    assert b.engine.state.param_history == a.engine.state.param_history
    assert torch.equal(a.module.weight, b.module.weight)
    if kind == "LRScheduler(StepLR)":
        assert b.extra[:7] == [0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025]


def test_metrics_agree_each_epoch_and_land_in_runmodels_result() -> None:
    def attach(engine: Engine, *_: Any) -> list[dict[str, float]]:
        per_epoch: list[dict[str, float]] = []
        Accuracy().attach(engine, "acc")
        Loss(nn.CrossEntropyLoss()).attach(engine, "loss")  # reads o["criterion_kwargs"]
        RunningAverage(output_transform=lambda o: o["loss"]).attach(engine, "avg_loss")
        engine.add_event_handler(
            Events.EPOCH_COMPLETED, lambda e: per_epoch.append(dict(e.state.metrics))
        )
        return per_epoch

    a, b = both(attach, 3)
    assert b.extra == a.extra and len(b.extra) == 3
    assert b.extra[0]["acc"] != b.extra[2]["acc"]  # it trains
    assert b.result is not None and b.result.metrics == a.engine.state.metrics
    assert b.engine.state.metrics is b.runmodel.state.metrics  # type: ignore[union-attr]

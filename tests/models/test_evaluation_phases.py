"""Every evaluation has a beginning and an end: the ``eval_start`` and ``eval_end`` phases
fire around each pass of ``runmodel.evaluate(engine=)`` (the ``Evaluate`` pack's pass, in
``epoch_end`` of a train run) and once around an eval run's loop, so a model whose state
runs on from batch to batch (an RNN's hidden state) starts each evaluation afresh."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import runmodel
from runmodel.packs import Evaluate

from helpers import Tiny

VOCAB, HIDDEN, TRAIN_BSZ, EVAL_BSZ = 12, 8, 4, 3


def test_evaluate_fires_the_phases_of_the_engine_it_is_given_around_its_pass() -> None:
    engine = runmodel.Engine()
    seen: list[Any] = []
    engine.on(
        "eval_start",
        lambda e: seen.append(("eval_start", e.model.module.training, torch.is_grad_enabled())),
    )
    engine.on("eval_end", lambda e: seen.append(("eval_end", e.model.module.training)))

    @engine.on("epoch_end")
    def check(engine: runmodel.Engine) -> None:
        seen.append("before")
        metrics = runmodel.evaluate(engine.model, engine=engine)
        seen.append(sorted(metrics))
        runmodel.evaluate(engine.model)  # without engine=: a pass outside the run's phases
        seen.append("after")

    engine.run(Tiny(), epochs=1)
    # the module in eval mode and no grad inside the pass; in train mode again after it
    assert seen == ["before", ("eval_start", False, False), ("eval_end", False), ["loss"], "after"]


def test_the_evaluate_packs_pass_fires_them_inside_epoch_end_of_a_train_run() -> None:
    engine = runmodel.Engine(Evaluate())
    order: list[tuple[str, str, int]] = []
    for phase in ("epoch_start", "eval_start", "eval_end"):
        engine.on(
            phase,
            lambda e, phase=phase: order.append((phase, e.state.mode, e.state.epoch)),
            modes="train",
        )  # the pass is the train run's: modes= sees "train"
    engine.on(
        "epoch_end",
        lambda e: order.append(("epoch_end", e.state.mode, e.state.epoch)),
        after="evaluate",
    )
    engine.run(Tiny(), epochs=2)
    assert order == [
        ("epoch_start", "train", 0),
        ("eval_start", "train", 0),
        ("eval_end", "train", 0),
        ("epoch_end", "train", 0),
        ("epoch_start", "train", 1),
        ("eval_start", "train", 1),
        ("eval_end", "train", 1),
        ("epoch_end", "train", 1),
    ]


def test_an_eval_run_fires_them_once_after_setup_and_around_its_epochs() -> None:
    engine = runmodel.Engine()
    order: list[str] = []
    for phase in ("setup", "epoch_start", "epoch_end", "eval_start", "eval_end", "teardown"):
        engine.on(phase, lambda e, phase=phase: order.append(phase))
    engine.run(Tiny(), "eval", epochs=2)
    assert order == [
        "setup",
        "eval_start",
        "epoch_start",
        "epoch_end",
        "epoch_start",
        "epoch_end",
        "eval_end",
        "teardown",
    ]


def test_every_on_an_eval_phase_counts_evaluation_passes() -> None:
    engine = runmodel.Engine(Evaluate())
    at: list[int] = []
    engine.on("eval_start", lambda e: at.append(e.state.epoch), every=2)
    engine.run(Tiny(), epochs=5)
    assert at == [1, 3]


# -- a stateful model: a language model whose LSTM state runs on across batches ----------------


def stream(length: int, bsz: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Batches of 5 time steps of ``bsz`` parallel token streams, and their next tokens."""
    tokens = torch.randint(0, VOCAB, (length,), generator=torch.Generator().manual_seed(seed))
    columns = tokens[: length // bsz * bsz].view(bsz, -1).t()
    return [
        (columns[i : i + 5], columns[i + 1 : i + 6].reshape(-1))
        for i in range(0, len(columns) - 6, 5)
    ]


class LanguageModel(runmodel.TorchModel):
    """Its hidden state lives on the model: each batch continues from the last one."""

    def __init__(self, device: Any = "cpu", init_options: Any = None) -> None:
        super().__init__(device, init_options)
        torch.manual_seed(0)
        self.module = nn.ModuleDict(
            {
                "embed": nn.Embedding(VOCAB, HIDDEN),
                "lstm": nn.LSTM(HIDDEN, HIDDEN),
                "out": nn.Linear(HIDDEN, VOCAB),
            }
        )
        self.hidden: Any = None

    def setup(self, setup_options: Any = None) -> None:
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=0.5)
        self.loss_fn = nn.CrossEntropyLoss()
        self.train_data = stream(240, TRAIN_BSZ, seed=1)
        self.eval_data = stream(120, EVAL_BSZ, seed=2)

    def fresh_state(self, batch_size: int) -> None:
        self.hidden = tuple(torch.zeros(1, batch_size, HIDDEN) for _ in range(2))

    def compute_output(self, batch: Any) -> torch.Tensor:
        h = tuple(t.detach() for t in self.hidden)
        out, self.hidden = self.module["lstm"](self.module["embed"](batch[0]), h)
        return self.module["out"](out).view(-1, VOCAB)


def stateful_engine(*packs: runmodel.Pack) -> runmodel.Engine:
    engine = runmodel.Engine(*packs)
    engine.on("epoch_start", lambda e: e.model.fresh_state(TRAIN_BSZ), modes="train")
    engine.on("eval_start", lambda e: e.model.fresh_state(EVAL_BSZ))
    return engine


def test_a_stateful_model_is_evaluated_at_its_own_batch_size_from_a_fresh_state() -> None:
    model = LanguageModel()
    values: list[float] = []
    sizes: set[tuple[str, int]] = set()
    engine = stateful_engine(Evaluate())
    engine.on("epoch_end", lambda e: values.append(e.state.metrics["eval_loss"]), after="evaluate")
    engine.on("runstep", lambda e: sizes.add(("train", e.model.hidden[0].shape[1])))
    engine.on("eval_end", lambda e: sizes.add(("eval", e.model.hidden[0].shape[1])))
    engine.run(model, epochs=2)
    assert len(values) == 2 and sizes == {("train", TRAIN_BSZ), ("eval", EVAL_BSZ)}
    # an eval run of the trained model starts from a fresh state as the last pass did
    alone = stateful_engine().run(model, "eval")
    assert alone.metrics["loss"] == values[-1]


def test_without_the_phases_the_stateful_model_fails_as_it_did() -> None:
    """What the phases are for: the train batch size's state meets the eval batches."""
    engine = runmodel.Engine(Evaluate())
    engine.on("epoch_start", lambda e: e.model.fresh_state(TRAIN_BSZ), modes="train")
    with pytest.raises(
        RuntimeError,
        match=r"Expected hidden\[0\] size \(1, 3, 8\), got "
        r"\[1, 4, 8\]",
    ):
        engine.run(LanguageModel(), epochs=1)

"""Evaluate as scripts evaluate (issue 36, items 3 and 5): each test writes a training
script as a plain loop and as a run with the ``Evaluate`` pack, and compares every
evaluated number and the final weights bit for bit (``==``, never approximately).

- A script's evaluation draws from the global generators (a shuffled DataLoader's
  iterator draws a seed, a sampled batch draws its indices), and training goes on from
  there: ``Evaluate``'s default. ``isolate_rng=True`` puts them back.
- nanoGPT's ``estimate_loss``: named sources (``train``, ``val``), each a function that
  samples one batch per call, ``batches=N`` of each, every N iterations and before the
  first (``at_start=True``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import runmodel
from runmodel.packs import Checkpoint, Evaluate

from helpers import Tiny, assert_equal_params, build_module, make_data


def flat(batches: list[Any]) -> TensorDataset:
    x, y = (torch.cat(parts) for parts in zip(*batches, strict=True))
    return TensorDataset(x, y)


def loaders() -> tuple[DataLoader[Any], DataLoader[Any]]:
    """A shuffled train loader and a shuffled eval loader (its iterator draws a seed from
    torch's generator, as every DataLoader's does), the last batch of each smaller."""
    train = DataLoader(flat(make_data(4, 9)), batch_size=8, shuffle=True)
    held_out = DataLoader(flat(make_data(3, 7, seed=1)), batch_size=8, shuffle=True)
    return train, held_out


def script_evaluation(module: nn.Module, batches: Any, loss_fn: Callable[..., Any]) -> float:
    """How a script evaluates: ``total += loss.item() * len(y)``, then ``total / count``."""
    module.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in batches:
            total += loss_fn(module(x), y).item() * len(y)
            count += len(y)
    module.train()
    return total / count


def test_evaluation_draws_as_a_scripts_does() -> None:
    # the script: dropout, a shuffled train loader, evaluation on a shuffled loader at
    # each epoch's end; its second epoch's shuffle and masks come after the eval draws
    torch.manual_seed(0)
    module = build_module(4, 1, hidden=8, dropout=0.25)
    optimizer, loss_fn = torch.optim.Adam(module.parameters(), lr=0.05), nn.MSELoss()
    train, held_out = loaders()
    torch.manual_seed(1)
    expected = []
    for _ in range(3):
        for x, y in train:
            loss = loss_fn(module(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        expected.append(script_evaluation(module, held_out, loss_fn))

    train, held_out = loaders()
    model = Tiny(hidden=8, dropout=0.25, optimizer=torch.optim.Adam, lr=0.05, data=train)
    engine = runmodel.Engine()
    engine.attach(Evaluate(data=held_out))
    seen: list[float] = []
    engine.on("epoch_end", lambda e: seen.append(e.state.metrics["eval_loss"]), priority=-10)
    torch.manual_seed(1)
    engine.run(model, epochs=3)
    assert seen == expected
    assert_equal_params(model, module)


def test_isolate_rng_puts_the_generators_back_as_before() -> None:
    # the same run with isolate_rng=True trains as one that never evaluates
    train, held_out = loaders()
    plain = Tiny(hidden=8, dropout=0.25, data=train)
    torch.manual_seed(1)
    runmodel.Engine().run(plain, epochs=3)
    train, held_out = loaders()
    isolated = Tiny(hidden=8, dropout=0.25, data=train)
    engine = runmodel.Engine()
    engine.attach(Evaluate(data=held_out, isolate_rng=True))
    torch.manual_seed(1)
    engine.run(isolated, epochs=3)
    assert_equal_params(plain, isolated)
    # and by default the evaluations' draws change the training after them
    train, held_out = loaders()
    drawing = Tiny(hidden=8, dropout=0.25, data=train)
    engine = runmodel.Engine()
    engine.attach(Evaluate(data=held_out))
    torch.manual_seed(1)
    engine.run(drawing, epochs=3)
    with pytest.raises(AssertionError):
        assert_equal_params(plain, drawing)


# -- nanoGPT's estimate_loss: named, sampled sources ----------------------------------------

SPLITS = {"train": flat(make_data(8, 8)), "val": flat(make_data(4, 8, seed=1))}


def get_batch(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch of 8 rows sampled from the split with torch's global generator."""
    x, y = SPLITS[split].tensors
    ix = torch.randint(len(x), (8,))
    return x[ix], y[ix]


class Sampled:
    """The training batches of an iteration-based script: sampled, without end."""

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield get_batch("train")


def test_named_sampled_sources_every_n_iterations_and_at_start_as_nanogpt() -> None:
    eval_interval, eval_iters, max_iters = 3, 2, 6
    torch.manual_seed(0)
    module = build_module(4, 1, hidden=8, dropout=0.25)
    optimizer, loss_fn = torch.optim.SGD(module.parameters(), lr=0.1), nn.MSELoss()

    def estimate_loss() -> dict[str, float]:
        out = {}
        for split in ("train", "val"):
            out[f"{split}_loss"] = script_evaluation(
                module, (get_batch(split) for _ in range(eval_iters)), loss_fn
            )
        return out

    torch.manual_seed(1)
    expected = []
    for it in range(max_iters + 1):
        if it % eval_interval == 0:  # before any training, and every eval_interval after
            expected.append(estimate_loss())
        if it == max_iters:
            break
        x, y = get_batch("train")
        loss = loss_fn(module(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    model = Tiny(hidden=8, dropout=0.25, data=Sampled())
    engine = runmodel.Engine()
    evaluate = Evaluate(
        every=f"{eval_interval}st",
        data={"train": lambda: get_batch("train"), "val": lambda: get_batch("val")},
        batches=eval_iters,
        at_start=True,
    )
    engine.attach(evaluate)
    passes: list[int] = []
    engine.on("eval_start", lambda e: passes.append(e.state.step))
    seen: list[dict[str, float]] = []
    engine.on("step_start", lambda e: seen.append(dict(e.state.metrics)), once=0)
    engine.on("runstep", lambda e: seen.append(dict(e.state.metrics)), every="3st", priority=-10)
    torch.manual_seed(1)
    result = engine.run(model, steps=max_iters)
    # at its start, then after the 3rd and the 6th step (the script's iterations 3 and 6)
    assert seen == expected
    # a pass per source, each firing eval_start: at the start, then in the 3rd and the
    # 6th runstep's hooks (state.step is the runstep's index)
    assert passes == [0, 0, 2, 2, 5, 5]
    assert sorted(result.metrics) == ["train_loss", "val_loss"]
    assert_equal_params(model, module)


def test_at_start_evaluates_after_the_setup_hooks_before_the_first_step() -> None:
    engine, log = runmodel.Engine(), []
    engine.attach(Evaluate(at_start=True))
    for phase in ("setup", "epoch_start", "step_start", "eval_start", "eval_end"):
        engine.on(phase, lambda e, phase=phase: log.append((phase, e.state.step)))
    engine.run(Tiny(classes=3), steps=1)
    assert log[:5] == [
        ("setup", 0),
        ("eval_start", 0),
        ("eval_end", 0),
        ("epoch_start", 0),
        ("step_start", 0),
    ]  # then the end of the epoch the budget cut short evaluates again


def test_at_start_is_not_repeated_when_a_run_resumes(tmp_path: Path) -> None:
    straight = runmodel.Engine()
    straight.attach(Evaluate(at_start=True))
    expected = straight.run(Tiny(classes=3), epochs=3).metrics
    first = runmodel.Engine()
    first.attach(Evaluate(at_start=True), Checkpoint(tmp_path))
    first.run(Tiny(classes=3), epochs=2)
    second, passes = runmodel.Engine(), []
    second.attach(Evaluate(at_start=True), Checkpoint(tmp_path / "again"))
    second.on("eval_start", lambda e: passes.append(e.state.step))
    result = second.run(Tiny(classes=3), epochs=3, resume=tmp_path)
    assert passes == [12]  # the 3rd epoch's end only
    assert result.metrics == expected


def test_named_sources_are_passes_of_their_own_and_checkpoint_may_rank_by_one(
    tmp_path: Path,
) -> None:
    train, val = make_data(2, classes=3, seed=3), make_data(3, classes=3, seed=4)
    model, engine = Tiny(classes=3), runmodel.Engine()
    engine.attach(
        Evaluate(data={"train": train, "val": val}),
        Checkpoint(tmp_path, best=("val_loss", "min")),  # passes the setup's name check
    )
    result = engine.run(model, epochs=2)
    on_its_own = {
        f"{name}_{metric}": value
        for name, data in (("train", train), ("val", val))
        for metric, value in runmodel.evaluate(model, data).items()
    }
    assert result.metrics == on_its_own  # metrics reset between the sources
    assert sorted(on_its_own) == ["train_accuracy", "train_loss", "val_accuracy", "val_loss"]
    assert result.files["best_checkpoint"].startswith(str(tmp_path / "best-val_loss="))


def test_batches_takes_the_first_batches_of_an_iterable_each_time() -> None:
    data = make_data(4, classes=3, seed=3)
    model, engine = Tiny(classes=3), runmodel.Engine()
    engine.attach(Evaluate(data=data, batches=2))
    result = engine.run(model, epochs=1)
    assert result.metrics == {f"eval_{k}": v for k, v in runmodel.evaluate(model, data[:2]).items()}


def test_isolate_rng_keeps_pythons_and_numpys_generators_too() -> None:
    def sample() -> tuple[torch.Tensor, torch.Tensor]:
        random.random(), numpy.random.rand()
        return get_batch("val")

    model = Tiny()
    model.setup()
    states = (torch.get_rng_state(), random.getstate(), numpy.random.get_state()[1].copy())
    runmodel.evaluate(model, sample, batches=2, isolate_rng=True)
    assert torch.equal(torch.get_rng_state(), states[0])
    assert random.getstate() == states[1]
    assert (numpy.random.get_state()[1] == states[2]).all()
    runmodel.evaluate(model, sample, batches=2)  # the default: left as drawn
    assert not torch.equal(torch.get_rng_state(), states[0])
    assert random.getstate() != states[1]
    assert not (numpy.random.get_state()[1] == states[2]).all()


# -- mistakes -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ({"data": lambda: None}, ValueError, r"data=\) is a function .*give batches=N"),
        ({"data": {"val": lambda: None}}, ValueError, r"data\['val'\]=\) is a function"),
        ({"data": {"val": make_data(1)}, "prefix": "val_"}, ValueError, r"prefix='val_'\) with"),
        ({"data": {}}, ValueError, r"data=\) is an empty mapping"),
        ({"data": {"test": make_data(1)}}, ValueError, r"'test_' prefix is reserved"),
        ({"data": {3: make_data(1)}}, TypeError, r"names its sources by strings"),
        ({"data": {"val": iter(make_data(1))}}, TypeError, r"is a one-shot iterator"),
        ({"batches": 0}, ValueError, r"batches=\) must be a whole number"),
        ({"at_start": 1}, TypeError, r"at_start=\) takes True or False"),
        ({"isolate_rng": "yes"}, TypeError, r"isolate_rng=\) takes True or False"),
        ({"loss_reduction": "avg"}, ValueError, r"loss_reduction=\) is one of"),
    ],
)
def test_bad_sources_fail_at_construction(args: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match) as caught:
        Evaluate(**args)
    assert "\n" not in str(caught.value)

"""docs/huggingface.md's tiny BERT fine-tuning, run from the page and checked part by
part: dict batches and ``model(**batch).loss`` with no loss function, gradual unfreezing
from the top, ``LRSchedule("linear", warmup=0.1)`` equal to transformers' own schedule,
no-decay groups, clipping, accumulation, a plain-function F1, the best checkpoint, early
stopping; and the page's line counts (runmodel's fewer than the ``Trainer``'s)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch

import runmodel

transformers = pytest.importorskip("transformers")

PAGE = Path(__file__).resolve().parents[2] / "docs" / "huggingface.md"
BLOCK = re.compile(r"(<!-- fragment -->\n)?```python\n(.*?)```", re.S)


def blocks() -> list[tuple[bool, str]]:
    """The fine-tuning section's python blocks: (is it the Trainer's, its code)."""
    section = PAGE.read_text().split("## Fine-tuning a tiny BERT")[1].split("\n## ")[0]
    return [(bool(fragment), code) for fragment, code in BLOCK.findall(section)]


def lines(code: str) -> int:
    return sum(1 for line in code.splitlines() if line.strip())


def test_runmodels_version_is_shorter_and_the_page_says_by_how_much() -> None:
    shared, *ours, theirs = blocks()
    assert not shared[0] and not any(fragment for fragment, _ in ours) and theirs[0]
    counted = sum(lines(code) for _, code in ours)
    assert counted < lines(theirs[1])
    text = PAGE.read_text()
    assert f"the runmodel version is **{counted} lines**" in text
    assert f"`Trainer` version **{lines(theirs[1])} lines**" in text


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The page's blocks run in a folder of their own, with recorders attached to the
    engine before its run."""
    import os

    (shared, setup, start) = [code for fragment, code in blocks() if not fragment]
    folder = tmp_path_factory.mktemp("hf")
    here, threads = os.getcwd(), torch.get_num_threads()
    os.chdir(folder)
    torch.set_num_threads(1)  # a tiny model: threads only contend (on a busy machine, 10x)
    try:
        page: dict[str, Any] = {}
        exec(compile(shared, str(PAGE), "exec"), page)
        exec(compile(setup, str(PAGE), "exec"), page)
        engine, seen = page["engine"], {"trained": [], "steps": [], "batches": [], "f1s": []}

        @engine.on("epoch_start", priority=0)  # after Unfreeze's (100)
        def trained(e: runmodel.Engine) -> None:
            module = e.model.module
            seen["trained"].append({n for n, p in module.named_parameters() if p.requires_grad})

        @engine.on("forward")
        def forward(e: runmodel.Engine) -> None:
            seen["batches"].append(type(e.state.batch))
            assert e.state.loss is e.state.output.loss  # the model's own loss

        def step(e: runmodel.Engine, default: Any) -> None:  # innermost: the real steps
            grads = [p.grad for p in e.model.module.parameters() if p.grad is not None]
            norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))
            seen["steps"].append(([g["lr"] for g in e.model.optimizer.param_groups], norm))
            default(e)

        engine.override("optimizer_step", step, priority=-1000)
        engine.on(
            "epoch_end", lambda e: seen["f1s"].append(e.state.metrics["eval_f1"]), priority=-500
        )
        exec(compile(start, str(PAGE), "exec"), page)
    finally:
        os.chdir(here)
        torch.set_num_threads(threads)
    return {**page, **seen, "folder": folder}


def test_dict_batches_and_the_models_own_loss(run: dict[str, Any]) -> None:
    assert set(run["batches"]) == {dict} and run["model"].loss_fn is None


def test_layers_unfreeze_from_the_top(run: dict[str, Any]) -> None:
    names = [n for n, _ in run["module"].named_parameters()]

    def under(*prefixes: str) -> set[str]:
        return {n for n in names if n.startswith(prefixes)}

    head = under("classifier", "bert.pooler")
    trained = run["trained"]
    assert trained[0] == head
    assert trained[1] == head | under("bert.encoder.layer.1")
    assert trained[2] == head | under("bert.encoder.layer.")
    assert all(t == set(names) for t in trained[3:]) and len(trained) > 3


def test_no_decay_groups_clipping_and_the_linear_schedule(run: dict[str, Any]) -> None:
    optimizer = run["model"].optimizer
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    named = {id(p): n for n, p in run["module"].named_parameters()}
    assert all(
        "bias" in named[id(p)] or "LayerNorm.weight" in named[id(p)] for p in no_decay["params"]
    )
    steps = run["steps"]
    epochs = run["result"].epochs
    assert len(steps) == 4 * epochs  # 8 batches an epoch, accumulated 2 by 2
    assert all(norm <= 1.0 + 1e-5 for _, norm in steps)  # clipped to 1
    weight = torch.nn.Parameter(torch.zeros(1))
    reference = torch.optim.AdamW([{"params": [weight]}, {"params": []}], lr=2e-2)
    schedule = transformers.get_linear_schedule_with_warmup(reference, math.ceil(0.1 * 32), 32)
    for lrs, _ in steps:  # the lr of each step, as the Trainer's schedule has it
        assert lrs == [reference.param_groups[0]["lr"]] * 2
        reference.step(), schedule.step()


def test_the_f1_function_the_best_checkpoint_and_early_stopping(run: dict[str, Any]) -> None:
    f1s, result, module = run["f1s"], run["result"], run["module"]
    assert max(f1s) > 0.8  # it learned
    batch = next(iter(run["model"].eval_data))  # the 32 held-out examples
    with torch.no_grad():
        module.eval()
        logits = module(input_ids=batch["input_ids"]).logits
        module.train()
    assert result.metrics["eval_f1"] == run["f1"](logits, batch["labels"]) == f1s[-1]
    checkpoint = next(p for p in run["engine"].table.packs.values() if hasattr(p, "best_path"))
    assert (run["folder"] / checkpoint.best_path).exists()
    assert [value for value, _ in checkpoint.best_saved] == [max(f1s)]
    # stopped after two evaluations in a row without a better F1, or at the end
    stopped = result.epochs < 8
    assert stopped == (max(f1s[-2:]) <= max(f1s[:-2]))
    assert stopped  # it learns by mid-run, then no longer improves

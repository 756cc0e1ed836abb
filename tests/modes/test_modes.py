"""Each mode on a small real model: eval, infer, benchmark, profile."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import runmodel

from helpers import Counting, Tiny, make_data

#: 2 classes of 6 features, in batches of 32
SHAPE = {"classes": 2, "features": 6, "batch_size": 32}


class Classifier(Tiny):
    """Through a hidden layer of 16; 3 batches to train on, 2 others to evaluate;
    SGD(lr=0.2)."""

    def __init__(self, device: str = "cpu") -> None:
        super().__init__(device, hidden=16, batches=3, eval_batches=2, lr=0.2, **SHAPE)


def manual_metrics(model: Classifier) -> dict[str, float]:
    total, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for x, y in model.eval_data:
            x, y = x.to(model.device), y.to(model.device)
            out = model.module(x)
            total += nn.functional.cross_entropy(out, y, reduction="sum").item()
            correct += int((out.argmax(1) == y).sum())
            count += len(y)
    return {"loss": total / count, "accuracy": correct / count}


def test_eval_computes_ignite_loss_and_accuracy(device: str) -> None:
    model = Classifier(device)
    engine = runmodel.Engine()
    engine.run(model, epochs=3)
    grads: list[bool] = []
    engine.on("runstep", lambda e: grads.append(e.state.output.requires_grad))
    result = engine.run(model, mode="eval")
    expected = manual_metrics(model)
    assert result.metrics.keys() == {"loss", "accuracy"}
    assert result.metrics["loss"] == pytest.approx(expected["loss"], rel=1e-5)
    assert result.metrics["accuracy"] == expected["accuracy"]
    assert result.steps == 2 and grads == [False, False]
    assert model.module.training  # restored after the eval run
    assert all(p.grad is None for p in model.module.parameters())  # no optimizer touched


def test_eval_metrics_reset_per_epoch_and_are_seen_by_epoch_end_hooks(device: str) -> None:
    model = Classifier(device)
    seen: list[dict[str, float]] = []
    engine = runmodel.Engine()
    engine.on("epoch_end", lambda e: seen.append(dict(e.state.metrics)))
    result = engine.run(model, mode="eval", epochs=2)
    assert len(seen) == 2 and seen[0] == seen[1] == result.metrics  # not accumulated


def test_eval_without_a_classification_loss_has_loss_only() -> None:
    regression = Tiny()  # MSE
    assert set(runmodel.Engine().run(regression, mode="eval").metrics) == {"loss"}


def test_custom_metrics() -> None:
    from ignite.metrics import Precision

    class WithPrecision(Classifier):
        def metrics(self) -> dict[str, Any]:
            return {"precision": Precision(average=True)}

    result = runmodel.Engine().run(WithPrecision(), mode="eval")
    assert set(result.metrics) == {"precision"} and 0 <= result.metrics["precision"] <= 1


def test_evaluate_outside_a_run_matches_eval_mode(device: str) -> None:
    model = Classifier(device)
    runmodel.Engine().run(model, epochs=2)
    optimizer = model.optimizer
    assert runmodel.evaluate(model) == runmodel.Engine().run(model, mode="eval").metrics
    assert model.module.training
    data = make_data(1, seed=5, **SHAPE)
    metrics = runmodel.evaluate(model, data)
    assert metrics["accuracy"] == pytest.approx(manual_accuracy(model, data))
    assert model.optimizer is not optimizer  # the eval *run* called setup; evaluate() doesn't


def test_evaluate_with_isolate_rng_leaves_the_random_generators_as_they_were() -> None:
    from torch.utils.data import DataLoader, TensorDataset

    model = Classifier("cpu")
    runmodel.Engine().run(model, epochs=1)
    x, y = (torch.cat(parts) for parts in zip(*make_data(4, **SHAPE), strict=True))
    model.eval_data = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)  # draws
    before = torch.get_rng_state()
    runmodel.evaluate(model, isolate_rng=True)
    assert torch.equal(torch.get_rng_state(), before)
    iter(model.eval_data)  # the control: iterating it does draw from the generator
    assert not torch.equal(torch.get_rng_state(), before)


def manual_accuracy(model: Classifier, data: list[Any]) -> float:
    with torch.no_grad():
        right = sum(
            int((model.module(x.to(model.device)).argmax(1).cpu() == y).sum()) for x, y in data
        )
    return right / sum(len(y) for _, y in data)


def test_infer_collects_outputs_without_grad(device: str) -> None:
    model = Classifier(device)
    result = runmodel.Engine().run(model, mode="infer")
    assert result.outputs is not None and len(result.outputs) == 2
    with torch.no_grad():
        expected = model.module(model.eval_data[0][0].to(device))
    assert torch.equal(result.outputs[0], expected)
    assert not result.outputs[0].requires_grad and model.module.training


def test_infer_streams_to_a_hook_without_collecting() -> None:
    class Stream(Classifier):
        def setup(self, setup_options: dict[str, Any] | None = None) -> None:
            super().setup(setup_options)
            self.infer_data = make_data(5, **SHAPE)

    streamed: list[int] = []
    engine = runmodel.Engine()
    engine.on("runstep", lambda e: streamed.append(len(e.state.output)))
    result = engine.run(Stream(), runmodel.Infer(collect=False))
    assert result.outputs is None and streamed == [32] * 5


def test_plain_models_run_in_every_mode(tmp_path: Path) -> None:
    for mode in ("train", "eval", "infer"):
        model = Counting(batches=3)
        result = runmodel.Engine().run(model, mode=mode)
        assert result.steps == 3 and len(model.seen) == 3
    result = runmodel.Engine().run(Counting(batches=4), mode="infer")
    assert result.outputs == [(0, 0), (0, 1), (0, 2), (0, 3)]
    bench = runmodel.Engine().run(Counting(batches=4), runmodel.Benchmark(warmup=2), steps=9)
    assert bench.timings["measured_steps"] == 7 and bench.timings["samples_per_s"] is None
    profile = runmodel.Profile(warmup=1, directory=tmp_path)
    prof = runmodel.Engine().run(Counting(batches=4), profile, steps=6)
    assert Path(prof.files["trace"]).is_file()


def test_benchmark_times_measured_steps_after_warmup(device: str) -> None:
    model = Classifier(device)
    before = [p.detach().clone() for p in model.module.parameters()]
    engine = runmodel.Engine()
    engine.on("runstep", lambda e: None, name="noop")
    result = engine.run(model, runmodel.Benchmark(warmup=4), steps=20)
    t = result.timings
    assert result.mode == "benchmark" and result.steps == 20 and result.ended == "budget"
    assert t["measured_steps"] == 16 and t["warmup"] == 4 and t["device"] == device
    assert 0 < t["step_ms_median"] <= t["step_ms_p90"]
    assert t["steps_per_s"] > 0
    # 16 measured batches of 32 samples in the measured window
    assert t["samples_per_s"] == pytest.approx(t["steps_per_s"] * 32)
    after = list(model.module.parameters())
    assert not any(torch.equal(a, b) for a, b in zip(before, after, strict=True))  # trained


def test_benchmark_of_infer_steps_uses_eval_data(device: str) -> None:
    model = Classifier(device)
    sizes: list[int] = []
    engine = runmodel.Engine()
    engine.on("runstep", lambda e: sizes.append(len(e.state.batch[0])))
    result = engine.run(model, runmodel.Benchmark(measure="infer", warmup=2), steps=8)
    assert result.timings["measured_steps"] == 6 and sizes == [32, 32] * 4


def test_benchmark_defaults_to_fifty_measured_steps() -> None:
    result = runmodel.Engine().run(Counting(batches=1000), runmodel.Benchmark(warmup=3))
    assert result.steps == 53 and result.timings["measured_steps"] == 50


def test_too_few_benchmark_steps_fail_before_setup() -> None:
    model = Counting()
    with pytest.raises(
        ValueError,
        match=r"benchmark mode needs more steps \(5\) than warm-up "
        r"steps \(5\)",
    ):
        runmodel.Engine().run(model, runmodel.Benchmark(warmup=5), steps=5)
    assert model.calls == []


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"warmup": -1}, "warmup= must be a whole number"),
        ({"warmup": True}, "warmup= must be a whole number"),
        ({"measure": "eval"}, "measure='eval': benchmark mode measures a 'train' or 'infer' step"),
    ],
)
def test_bad_benchmark_options_fail_when_the_mode_is_made(
    options: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        runmodel.Benchmark(**options)


def test_a_mode_name_is_the_mode_with_its_defaults() -> None:
    result = runmodel.Engine().run(Counting(batches=100), "benchmark")
    assert result.steps == 55 and result.timings["warmup"] == 5
    with pytest.raises(
        ValueError,
        match=r"unknown mode 'bench'; valid modes: train, eval, "
        r"infer, benchmark, profile",
    ):
        runmodel.Engine().run(Counting(), "bench")


def test_profile_writes_a_trace_and_times_hooks(tmp_path: Path, device: str) -> None:
    engine = runmodel.Engine()

    @engine.on("runstep", name="slow_hook")
    def slow(engine: runmodel.Engine) -> None:
        torch.ones(64, 64) @ torch.ones(64, 64)

    engine.on("epoch_end", lambda e: None, name="end_hook")
    result = engine.run(Classifier(device), runmodel.Profile(warmup=2, directory=tmp_path), steps=6)
    trace = Path(result.files["trace"])
    assert trace.parent == tmp_path and trace.name.endswith(".pt.trace.json")
    names = {event.get("name", "") for event in json.loads(trace.read_text())["traceEvents"]}
    assert {
        "runmodel/runstep",
        "runmodel/forward",
        "runmodel/backward",
        "runmodel/optimizer_step",
        "runmodel/runstep/slow_hook",
    } <= names
    hooks = {(row["phase"], row["hook"]): row for row in result.timings["hooks"]}
    assert hooks[("runstep", "slow_hook")]["calls"] == 6
    assert hooks[("epoch_end", "end_hook")]["calls"] == 2  # 3 batches an epoch, 6 steps
    assert hooks[("runstep", "slow_hook")]["total_ms"] > 0


def test_the_benchmark_window_ends_with_the_last_measured_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a clock that moves 1 ms a reading, an epoch_end hook after the last step takes
    1000 s: the window (18 measured steps, a few readings each) does not hold them."""
    from types import SimpleNamespace

    from runmodel.modes import timed

    now = [0]

    def clock() -> int:
        now[0] += 1_000_000
        return now[0]

    monkeypatch.setattr(timed, "time", SimpleNamespace(perf_counter_ns=clock))
    engine = runmodel.Engine()
    engine.on("epoch_end", lambda e: now.__setitem__(0, now[0] + 1000 * 10**9))
    result = engine.run(Counting(batches=100), runmodel.Benchmark(warmup=2), steps=20)
    assert 0 < result.timings["seconds"] < 1

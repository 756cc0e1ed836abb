"""The Throughput pack on a tiny GPT (nanoGPT's model, shrunk, with its attention written
out): samples/s, tokens/s and MFU against nanoGPT's ``estimate_mfu`` formula on the same
(fake) clock; the FLOPs counted once; windows that leave evaluation out; no device sync
on the steps it does not report; the table of peaks; bad arguments."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tiny_gpt import GPT, VOCAB, B, H, L, Q, T, matmul_parameters
from torch import nn

import runmodel
from runmodel.packs import Evaluate
from runmodel.packs import throughput as throughput_module
from runmodel.packs.grad_accumulation import GradAccumulation
from runmodel.packs.throughput import PEAK_FLOPS, Throughput, peak_flops_of

PEAK = 1e9  # a made-up peak FLOP/s for the CPU


def batches(steps: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(VOCAB, (steps, B, T + 1), generator=g)
    return [(d[:, :-1], d[:, 1:].reshape(-1)) for d in data]


def gpt_model(steps: int = 20, device: str = "cpu") -> runmodel.TorchModel:
    torch.manual_seed(0)
    return runmodel.TorchModel.from_parts(
        GPT(),
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
        loss_fn=nn.CrossEntropyLoss(),
        train_data=batches(steps),
        eval_data=batches(2, seed=1),
        device=device,
    )


def fake_clock(monkeypatch: pytest.MonkeyPatch, engine: runmodel.Engine, dt: float) -> list[float]:
    """The pack's clock reads ``dt`` seconds per step done (and what ``extra[0]`` adds)."""
    extra = [0.0]
    monkeypatch.setattr(throughput_module, "clock", lambda: (engine.state.step + 1) * dt + extra[0])
    return extra


def reported(engine: runmodel.Engine, every: str) -> list[dict[str, float]]:
    """The pack's metrics at each of its reports (``every``, as given to the pack)."""
    seen: list[dict[str, float]] = []

    def record(engine: Any) -> None:
        metrics = engine.state.metrics
        seen.append(
            {k: metrics[k] for k in ("samples_per_s", "items_per_s", "mfu") if k in metrics}
        )

    engine.on("runstep", record, every=every, priority=-2e9)  # after the pack's report
    return seen


# -- MFU and rates --------------------------------------------------------------------------


def test_the_flops_counted_are_nanogpts_formula_over_the_matmul_parameters() -> None:
    """FlopCounterMode counts a step's matmuls, forward and backward: 6 per parameter in
    a matmul and 12·L·H·Q·T for attention, per token; nanoGPT's 6N also counts the
    LayerNorms' weights, which run no matmul."""
    model, pack = gpt_model(), Throughput(every="5st", peak_flops=PEAK)
    runmodel.Engine(pack).run(model, steps=6)
    n = matmul_parameters(model.module)
    assert pack.flops_per_step == (6 * n + 12 * L * H * Q * T) * T * B
    nanogpt = model.module.estimate_mfu(B, 1.0, 1.0)  # FLOPs per iteration
    norms = model.module.get_num_params() - n
    assert nanogpt - pack.flops_per_step == 6 * norms * T * B > 0


@pytest.mark.parametrize("gas", [1, 2])
def test_mfu_is_nanogpts_estimate_mfu_where_they_count_the_same_flops(
    monkeypatch: pytest.MonkeyPatch, gas: int
) -> None:
    """On a clock of 0.25 s a step (so nanoGPT's dt of an iteration is 0.25·gas), MFU
    is nanoGPT's with N over the matmul parameters; tokens/s is B·T per step."""
    model, engine = gpt_model(), runmodel.Engine()
    engine.attach(Throughput(every="5st", items_per_batch=B * T, peak_flops=PEAK))
    if gas > 1:
        engine.attach(GradAccumulation(gas))
    fake_clock(monkeypatch, engine, 0.25)
    seen = reported(engine, "5st")
    engine.run(model, steps=20)
    assert len(seen) == 4  # steps 4, 9, 14, 19
    module = model.module
    monkeypatch.setattr(module, "get_num_params", lambda: matmul_parameters(GPT()))
    expected = module.estimate_mfu(B * gas, 0.25 * gas, PEAK)
    for metrics in seen:
        assert metrics["mfu"] == pytest.approx(expected, rel=1e-12)
        assert metrics["samples_per_s"] == B / 0.25
        assert metrics["items_per_s"] == B * T / 0.25


def test_the_first_window_opens_after_the_first_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first step (warm-up, the FLOP count) is in no window; each window is from the
    last report: samples/s from the samples of its steps, batches of any size."""
    model, engine = gpt_model(), runmodel.Engine()
    model.train_data = [
        (x[: 1 + i % 3], y[: (1 + i % 3) * T]) for i, (x, y) in enumerate(batches(12))
    ]
    engine.attach(Throughput(every="6st", peak_flops=PEAK))
    fake_clock(monkeypatch, engine, 1.0)
    seen = reported(engine, "6st")
    engine.run(model, steps=12)
    rows = [1 + i % 3 for i in range(12)]
    assert [m["samples_per_s"] for m in seen] == [sum(rows[1:6]) / 5, sum(rows[6:12]) / 6]


def test_callables_count_the_items_of_each_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    model, engine = gpt_model(), runmodel.Engine()
    engine.attach(
        Throughput(
            every="4st",
            samples_per_batch=lambda batch: 2,
            items_per_batch=lambda batch: int(batch[0].numel()),
        )
    )
    fake_clock(monkeypatch, engine, 0.5)
    seen = reported(engine, "4st")
    engine.run(model, steps=9)
    assert seen == [{"samples_per_s": 4.0, "items_per_s": B * T / 0.5}] * 2


def test_evaluation_passes_are_left_out_of_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """Evaluate every 5 steps takes 100 s of the fake clock: not in samples/s."""
    model, engine = gpt_model(), runmodel.Engine()
    engine.attach(Throughput(every="10st"), Evaluate(every="5st"))
    extra = fake_clock(monkeypatch, engine, 0.5)

    @engine.on("eval_end", priority=1e9)  # before the pack's eval_end
    def slow_evaluation(engine: Any) -> None:
        extra[0] += 100.0

    seen = reported(engine, "10st")
    engine.run(model, steps=20)
    assert extra[0] == 400.0
    assert [m["samples_per_s"] for m in seen] == [B / 0.5, B / 0.5]
    assert all("mfu" not in m for m in seen)  # a CPU, no peak given: no MFU


def test_flops_per_step_given_counts_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    entered: list[int] = []
    monkeypatch.setattr(
        throughput_module.FlopCounterMode, "__enter__", lambda self: entered.append(1)
    )
    model, engine = gpt_model(), runmodel.Engine()
    pack = Throughput(every="5st", flops_per_step=1e6, peak_flops=PEAK)
    engine.attach(pack)
    fake_clock(monkeypatch, engine, 0.5)
    seen = reported(engine, "5st")
    engine.run(model, steps=10)
    assert entered == [] and pack.flops_per_step == 1e6
    assert seen[-1]["mfu"] == pytest.approx(1e6 / 0.5 / PEAK, rel=1e-12)


def test_without_a_peak_on_the_cpu_no_flops_are_counted() -> None:
    model, pack = gpt_model(), Throughput(every="5st")
    result = runmodel.Engine(pack).run(model, steps=10)
    assert pack.flops_per_step is None
    assert "mfu" not in result.metrics and result.metrics["samples_per_s"] > 0
    assert "items_per_s" not in result.metrics


# -- the device -----------------------------------------------------------------------------


def test_no_device_sync_on_the_steps_it_does_not_report(
    monkeypatch: pytest.MonkeyPatch, device: str
) -> None:
    """On CUDA, one ``torch.cuda.synchronize()`` per report and none between; no
    ``.item()`` more than the run makes without the pack (none on the CPU)."""
    syncs: list[int] = []
    real_sync = torch.cuda.synchronize
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: (syncs.append(1), real_sync(*a)))
    items: list[int] = []
    real_item = torch.Tensor.item
    monkeypatch.setattr(torch.Tensor, "item", lambda self: (items.append(1), real_item(self))[1])

    def run(*packs: runmodel.Pack) -> tuple[int, int]:
        syncs.clear()
        items.clear()
        runmodel.Engine(*packs).run(gpt_model(device=device), steps=20)
        return len(syncs), len(items)

    _, items_without = run()
    syncs_with, items_with = run(Throughput(every="5st", items_per_batch=B * T))
    assert items_with == items_without
    assert syncs_with == (4 if device == "cuda" else 0)


def test_the_table_of_peaks(monkeypatch: pytest.MonkeyPatch) -> None:
    assert peak_flops_of(torch.device("cpu")) is None
    names = {
        "NVIDIA H100 80GB HBM3": 989.5e12,
        "NVIDIA H100 PCIe": 756.5e12,
        "NVIDIA H200": 989.5e12,
        "NVIDIA A100-SXM4-80GB": 312e12,
        "NVIDIA A100 80GB PCIe": 312e12,
        "NVIDIA L40S": 362.05e12,
        "NVIDIA L4": 121e12,
        "Tesla V100-SXM2-16GB": 125e12,
        "Tesla T4": 65e12,
        "NVIDIA GeForce RTX 4090": None,
    }
    for name, peak in names.items():
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None, n=name: n)
        assert peak_flops_of(torch.device("cuda")) == peak, name
    assert len(PEAK_FLOPS) == 8


# -- arguments ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        {"items_per_batch": 0},
        {"items_per_batch": 1.5},
        {"samples_per_batch": True},
        {"flops_per_step": -1.0},
        {"peak_flops": 0},
        {"peak_flops": "312e12"},
    ],
)
def test_bad_arguments_fail_at_construction(args: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"Throughput \w+= must be"):
        Throughput(**args)


def test_a_batch_it_cannot_count_asks_for_samples_per_batch() -> None:
    model = gpt_model()
    model.train_data = [object()] * 3

    class Step(runmodel.Pack):
        @runmodel.override("runstep")
        def step(self, engine: Any, default: Any) -> None:
            pass

    with pytest.raises(TypeError, match="give samples_per_batch="):
        runmodel.Engine(Throughput(every="2st"), Step()).run(model, steps=3)


def test_with_numbers_for_both_counts_nothing_runs_per_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``samples_per_batch=`` and ``items_per_batch=`` as numbers: no hook reads the
    batches; the rates are the steps' counts times the numbers."""
    model, engine = gpt_model(), runmodel.Engine()
    engine.attach(Throughput(every="5st", samples_per_batch=B, items_per_batch=B * T))
    fake_clock(monkeypatch, engine, 0.25)
    seen = reported(engine, "5st")
    engine.run(model, steps=10)
    assert "throughput.count" not in engine.describe()
    assert seen == [{"samples_per_s": B / 0.25, "items_per_s": B * T / 0.25}] * 2


def test_the_run_is_the_same_with_the_pack() -> None:
    """Counting FLOPs on the first step and measuring after every step change nothing of
    the training: the same weights, bit for bit."""
    plain, measured = gpt_model(), gpt_model()
    runmodel.Engine().run(plain, steps=10)
    runmodel.Engine(Throughput(every="3st", peak_flops=PEAK)).run(measured, steps=10)
    assert all(
        torch.equal(a, b)
        for a, b in zip(plain.module.parameters(), measured.module.parameters(), strict=True)
    )

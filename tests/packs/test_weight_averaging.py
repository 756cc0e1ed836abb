"""The EMA and SWA packs: the averages torch.optim.swa_utils computes by hand, the averaged
weights used for evaluation when asked and kept in checkpoints, an exact resume after
SIGKILL, the averaged weights of a checkpoint read back (eval, export), refusals."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.optim.swa_utils import SWALR, AveragedModel, get_ema_multi_avg_fn, update_bn

import runmodel
from runmodel.checkpoint.export import averaged_weights, export, model_state
from runmodel.packs import EMA, SWA, Checkpoint, Evaluate, LRSchedule

import warm as subprocess
from helpers import Tiny, build_module, make_data

HERE = Path(__file__).parent


def _by_hand_ema(decay: float, epochs: int) -> AveragedModel:
    """Tiny(hidden=8, Adam, lr=0.05) trained as a hand-written loop, with an EMA updated
    after each optimizer step."""
    torch.manual_seed(0)
    module = build_module(4, 1, 8)
    optimizer = torch.optim.Adam(module.parameters(), lr=0.05)
    averaged = AveragedModel(module, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)
    for _ in range(epochs):
        for x, y in make_data():
            nn.functional.mse_loss(module(x), y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            averaged.update_parameters(module)
    return averaged


def test_ema_after_n_steps_equals_a_hand_written_averaged_model_loop() -> None:
    ema = EMA(decay=0.9)
    runmodel.Engine(ema).run(Tiny(hidden=8, optimizer=torch.optim.Adam, lr=0.05), epochs=3)
    expected = _by_hand_ema(0.9, epochs=3)
    assert ema.averaged is not None
    mine, theirs = ema.averaged.state_dict(), expected.state_dict()
    assert list(mine) == list(theirs)
    for key in theirs:  # bit for bit
        assert torch.equal(mine[key], theirs[key]), key
    assert int(ema.averaged.n_averaged) == 12


def test_the_comparison_can_fail() -> None:
    """Another decay gives another average: the test above compares something."""
    ema = EMA(decay=0.8)
    runmodel.Engine(ema).run(Tiny(hidden=8, optimizer=torch.optim.Adam, lr=0.05), epochs=3)
    assert ema.averaged is not None
    expected = _by_hand_ema(0.9, epochs=3)
    assert not torch.equal(ema.averaged.module[0].weight, expected.module[0].weight)


def test_swa_equals_torch_recipe_with_swalr_and_update_bn() -> None:
    """torch's SWA recipe by hand: from epoch 1, average at each epoch's end, SWALR stepped
    after it, update_bn over the training data."""

    def make() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1))

    model = Tiny(optimizer=torch.optim.SGD, lr=0.05)
    model.module = make()
    swa = SWA(start=1, swa_lr=0.01, anneal_epochs=2)
    runmodel.Engine(swa).run(model, epochs=4)

    module = make()
    optimizer = torch.optim.SGD(module.parameters(), lr=0.05)
    averaged = AveragedModel(module)
    scheduler = SWALR(optimizer, swa_lr=0.01, anneal_epochs=2)
    data = make_data()
    for epoch in range(4):
        for x, y in data:
            nn.functional.mse_loss(module(x), y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if epoch >= 1:
            averaged.update_parameters(module)
            update_bn(data, averaged)
            scheduler.step()
    assert swa.averaged is not None
    for (key, value), theirs in zip(
        swa.averaged.state_dict().items(), averaged.state_dict().values(), strict=True
    ):
        assert torch.equal(value, theirs), key
    assert model.optimizer.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"] == 0.01
    assert int(swa.averaged.n_averaged) == 3


def test_use_averaged_evaluates_the_average_and_checkpoints_keep_it(tmp_path: Path) -> None:
    """With use_averaged=True, Evaluate's metrics are the averaged weights' (and so is
    Checkpoint(best=)'s ranking); the module keeps its own weights; the checkpoint holds
    the average, which eval and export read back with averaged=True."""
    model = Tiny(classes=3, hidden=8, optimizer=torch.optim.Adam, lr=0.05)
    ema, evaluate = EMA(decay=0.5, use_averaged=True), Evaluate()
    seen: list[float] = []
    engine = runmodel.Engine(ema, evaluate, Checkpoint(tmp_path, best=("eval_loss", "min")))
    engine.on("epoch_end", lambda e: seen.append(e.state.metrics["eval_loss"]), priority=-10)
    result = engine.run(model, epochs=2)
    assert ema.averaged is not None
    own = runmodel.evaluate(model)["loss"]
    with ema.averaged_weights():
        on_average = runmodel.evaluate(model)["loss"]
    assert seen[-1] == pytest.approx(on_average, abs=0) and own != on_average
    assert result.metrics["eval_loss"] == seen[-1]

    weights = averaged_weights(Path(result.files["last_checkpoint"]))
    for key, value in ema.averaged.module.state_dict().items():
        assert torch.equal(weights[key], value)
    assert torch.equal(
        model_state(result.files["best_checkpoint"], averaged=True)["module"]["0.weight"],
        ema.averaged.module[0].weight,
    )
    _, out = export(tmp_path, tmp_path / "averaged.pt", averaged=True)
    assert torch.equal(torch.load(out, weights_only=True)["2.bias"], ema.averaged.module[2].bias)
    plain = torch.load(export(tmp_path, tmp_path / "plain.pt")[1], weights_only=True)
    assert torch.equal(plain["2.bias"], model.module[2].bias)


def test_before_swa_starts_evaluate_measures_the_module_s_own_weights() -> None:
    """SWA(use_averaged=True) before its start epoch has nothing averaged: Evaluate sees the
    module's weights; from the second averaged epoch on, the average (another loss)."""
    swa, seen, own = SWA(start=2, use_averaged=True), [], []
    engine = runmodel.Engine(swa, Evaluate())

    def both(engine: runmodel.Engine) -> None:
        seen.append(engine.state.metrics["eval_loss"])
        own.append(runmodel.evaluate(engine.model)["loss"])

    engine.on("epoch_end", both, priority=-10)
    engine.run(Tiny(classes=3, hidden=8), epochs=4)
    assert seen[:3] == own[:3]  # epochs 0 and 1: none; epoch 2: one epoch averaged
    assert seen[3] != own[3]


def test_a_checkpoint_without_an_average_says_so(tmp_path: Path) -> None:
    result = runmodel.Engine(Checkpoint(tmp_path)).run(Tiny(), epochs=1)
    with pytest.raises(ValueError, match=r"holds no averaged weights.*no EMA or SWA pack"):
        averaged_weights(Path(result.files["last_checkpoint"]))
    _, plain = export(tmp_path, tmp_path / "weights.pt")  # the module's weights alone
    with pytest.raises(ValueError, match=r"is no checkpoint \(the module's weights alone"):
        averaged_weights(plain)
    # SWA before its start (a start past the run's end is refused): nothing averaged yet
    runmodel.Engine(SWA(start=1), Checkpoint(tmp_path / "swa", keep=None)).run(Tiny(), epochs=2)
    with pytest.raises(ValueError, match="holds no averaged weights"):
        averaged_weights(min((tmp_path / "swa").glob("ckpt-*.pt")))


def test_resume_after_sigkill_is_exact_with_ema_and_swa(tmp_path: Path) -> None:
    """A run killed (SIGKILL) after step 12 of 15 and resumed ends with the weights, both
    averages and the learning rate of a straight run, bit for bit."""
    script = str(HERE / "averaging_run.py")
    straight = subprocess.Popen(
        [sys.executable, script, str(tmp_path / "a"), str(tmp_path / "straight.pt")]
    )
    killed = subprocess.run(
        [sys.executable, script, str(tmp_path / "b"), "unused", "12"], timeout=300
    )
    assert killed.returncode == -9
    assert straight.wait(timeout=300) == 0
    subprocess.run(
        [sys.executable, script, str(tmp_path / "b"), str(tmp_path / "resumed.pt")],
        timeout=300,
        check=True,
    )
    a = torch.load(tmp_path / "straight.pt", weights_only=True)
    b = torch.load(tmp_path / "resumed.pt", weights_only=True)
    assert a["lr"] == b["lr"] != 1e-2
    for part in ("module", "ema", "swa"):
        assert list(a[part]) == list(b[part])
        for key in a[part]:
            assert torch.equal(a[part][key], b[part][key]), (part, key)
    assert int(a["swa"]["n_averaged"]) == 2 and int(a["ema"]["n_averaged"]) == 15


def test_refusals() -> None:
    with pytest.raises(ValueError, match=r"EMA\(decay=\).*\[0, 1\]"):
        EMA(decay=1.5)
    with pytest.raises(ValueError, match=r"SWA\(start=\)"):
        SWA(start=-1)
    with pytest.raises(ValueError, match=r"SWA\(swa_lr=\)"):
        SWA(swa_lr=0)
    schedule = LRSchedule(lambda optimizer: torch.optim.lr_scheduler.StepLR(optimizer, 1))
    engine = runmodel.Engine(SWA(swa_lr=0.01), schedule)
    with pytest.raises(ValueError, match="would both set the learning rate"):
        engine.run(Tiny(), epochs=1)


def test_registered_for_configs() -> None:
    assert isinstance(runmodel.make_pack(runmodel.Spec("ema", {"decay": 0.99})), EMA)
    assert isinstance(runmodel.make_pack(runmodel.Spec("swa", {"start": 2})), SWA)


def test_refused_under_fsdp_with_the_reason(tmp_path: Path) -> None:
    """One process as torchrun starts it: the fsdp backend shards the module, and EMA
    refuses the run at setup, saying why."""
    import os
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    script = tmp_path / "fsdp_ema.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(HERE.parent)!r})\n"
        "import runmodel\nfrom helpers import Tiny\nfrom runmodel.packs import EMA\n"
        "try:\n"
        "    runmodel.Engine(EMA()).run(Tiny(hidden=8), epochs=1, backend='fsdp')\n"
        "except ValueError as error:\n"
        "    print('refused:', error)\n"
    )
    env = {
        **os.environ,
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert (
        "refused: EMA is refused under the fsdp backend: the module's parameters are "
        "sharded" in done.stdout
    )

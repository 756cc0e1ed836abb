"""Less ceremony in scripts (issue 19): packs given to ``Engine(...)``, a runstep override's
return value as the step's result, ``from_parts`` without the parts an override does not
use, a progress bar by default where a person watches, an Unfreeze schedule that would
freeze again, and ``profile`` listing packs' hooks that did not fire."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import runmodel
from runmodel.packs import Checkpoint, Evaluate, Progress, Unfreeze

from helpers import Tiny, make_data


class Terminal(io.StringIO):
    """A stream that says it is a terminal, as a shell's stderr does."""

    def isatty(self) -> bool:
        return True


def _progress_packs(engine: runmodel.Engine) -> list[Any]:
    return [p for p in engine.table.packs.values() if isinstance(p, Progress)]


# -- Engine(*packs) ---------------------------------------------------------------------------


def test_engine_attaches_the_packs_it_is_given(tmp_path: Path) -> None:
    checkpoint, evaluate = Checkpoint(tmp_path), Evaluate()
    engine = runmodel.Engine(checkpoint, evaluate)
    assert list(engine.table.packs.values()) == [checkpoint, evaluate]
    result = engine.run(Tiny(classes=3), epochs=1)
    assert "eval_accuracy" in result.metrics and any(tmp_path.iterdir())


# -- a runstep override's return value ------------------------------------------------------


def _gan_like_model() -> runmodel.TorchModel:
    torch.manual_seed(0)
    return runmodel.TorchModel.from_parts(nn.Linear(4, 1), train_data=make_data(3))


def test_returned_loss_tensor_becomes_state_loss_and_output() -> None:
    model = _gan_like_model()
    optimizer = torch.optim.SGD(model.module.parameters(), lr=0.1)  # type: ignore[union-attr]
    engine = runmodel.Engine()
    seen: list[Any] = []

    @engine.override("runstep")
    def step(engine: runmodel.Engine, default: Any) -> torch.Tensor:
        x, y = engine.state.batch
        loss = nn.functional.mse_loss(model.module(x), y)  # type: ignore[misc]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    engine.on("runstep", lambda e: seen.append((e.state.loss, e.state.output)))
    engine.run(model, epochs=1)
    assert len(seen) == 3
    assert all(isinstance(loss, torch.Tensor) and output is loss for loss, output in seen)


def test_returned_dict_gives_loss_and_outputs_and_none_keeps_what_the_override_set() -> None:
    engine = runmodel.Engine()
    outputs: list[Any] = []
    returns: list[Any] = [{"loss": torch.tensor(2.0), "d_loss": torch.tensor(1.0)}, None]

    @engine.override("runstep")
    def step(engine: runmodel.Engine, default: Any) -> Any:
        engine.state.loss, engine.state.output = torch.tensor(5.0), "set by the override"
        return returns[engine.state.step]

    engine.on("runstep", lambda e: outputs.append((float(e.state.loss), e.state.output)))
    engine.run(_gan_like_model(), steps=2)
    assert outputs[0][0] == 2.0 and set(outputs[0][1]) == {"loss", "d_loss"}
    assert outputs[1] == (5.0, "set by the override")


def test_returning_something_else_says_what_to_return() -> None:
    engine = runmodel.Engine()
    engine.override("runstep", lambda engine, default: 1.5)
    with pytest.raises(TypeError, match=r"returned float.*loss tensor, a dict with 'loss'"):
        engine.run(_gan_like_model(), steps=1)


# -- from_parts without optimizer and loss ------------------------------------------------------


def test_train_without_optimizer_or_override_stops_before_a_step() -> None:
    engine = runmodel.Engine()
    starts: list[int] = []
    engine.on("step_start", lambda e: starts.append(e.state.step))
    with pytest.raises(
        ValueError,
        match=r"optimizer and \.loss_fn.*from_parts: optimizer=.*"
        r"engine\.override\('runstep'",
    ):
        engine.run(_gan_like_model(), epochs=1)
    assert starts == []


def test_an_eval_only_override_does_not_excuse_a_missing_optimizer() -> None:
    engine = runmodel.Engine()
    engine.override("runstep", lambda engine, default: default(engine), modes="eval")
    with pytest.raises(ValueError, match="optimizer"):
        engine.run(_gan_like_model(), epochs=1)


# -- the progress bar by default --------------------------------------------------------------


def _bars_during_a_run(
    engine: runmodel.Engine, stderr: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> list[int]:
    """How many Progress packs were attached at each step of a 2-epoch run."""
    counts: list[int] = []
    engine.on("runstep", lambda e: counts.append(len(_progress_packs(e))))
    monkeypatch.setattr(sys, "stderr", stderr)
    engine.run(Tiny(), epochs=2)
    return counts


def test_a_terminal_gets_one_bar_for_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    engine, terminal = runmodel.Engine(), Terminal()
    assert set(_bars_during_a_run(engine, terminal, monkeypatch)) == {1}
    assert "train epoch" in terminal.getvalue()
    assert _progress_packs(engine) == []  # for that run only


def test_no_bar_added_when_not_interactive_or_turned_off_or_one_is_attached(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert set(_bars_during_a_run(runmodel.Engine(), io.StringIO(), monkeypatch)) == {0}
    assert set(_bars_during_a_run(runmodel.Engine(progress=False), Terminal(), monkeypatch)) == {0}
    own = Progress(file=io.StringIO())
    engine = runmodel.Engine(own)
    assert set(_bars_during_a_run(engine, Terminal(), monkeypatch)) == {1}
    assert _progress_packs(engine) == [own]


def test_no_bar_in_a_benchmark_of_train_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    engine, counts = runmodel.Engine(), []
    engine.on("runstep", lambda e: counts.append(len(_progress_packs(e))))
    monkeypatch.setattr(sys, "stderr", Terminal())
    engine.run(Tiny(), runmodel.Benchmark(warmup=1), steps=3)  # a bar would cost time
    assert counts == [0, 0, 0]


def test_ignite_progress_bar_is_the_only_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    from ignite.handlers import ProgressBar

    engine = runmodel.Engine()
    ProgressBar(file=io.StringIO()).attach(engine.ignite)
    assert set(_bars_during_a_run(engine, Terminal(), monkeypatch)) == {0}


def test_the_added_bar_is_not_saved_in_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = runmodel.Engine(Checkpoint(tmp_path))
    _bars_during_a_run(engine, Terminal(), monkeypatch)
    from runmodel.checkpoint import checkpoints_in, load

    saved = load(checkpoints_in(tmp_path)[-1])[1]
    assert list(saved["engine"]["packs"]) == ["checkpoint"]


# -- Unfreeze ---------------------------------------------------------------------------------


def test_unfreeze_schedule_that_would_freeze_again_is_refused() -> None:
    with pytest.raises(
        ValueError,
        match=r"'all' at epoch 0, then lists \['conv'\] at epoch 3.*"
        r"only unfreezes",
    ):
        Unfreeze({0: "all", 3: ["conv"]})


# -- profile ----------------------------------------------------------------------------------


def test_profile_lists_pack_hooks_that_did_not_fire(tmp_path: Path) -> None:
    engine = runmodel.Engine(Evaluate(), Checkpoint(tmp_path / "ck"))
    result = engine.run(
        Tiny(classes=3), runmodel.Profile(warmup=1, directory=tmp_path / "p"), steps=3
    )
    calls = {(r["phase"], r["hook"]): r["calls"] for r in result.timings["hooks"]}
    assert calls[("epoch_end", "checkpoint.save")] == 0
    assert calls[("setup", "evaluate.setup")] == 0

"""A test split: ``TorchModel.test_data`` evaluated once after training, with the best
checkpoint's weights (else the trained ones), as ``test_*`` metrics in the result and
``metrics.json``; the ``test_`` prefix reserved, so no pack or hook reads it (nor
Evaluate writes it); ``runmodel eval RUN_DIR --split test``."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

import runmodel
from runmodel.checkpoint.export import model_state
from runmodel.cli import main
from runmodel.config.runconfig import RunConfig
from runmodel.packs import Checkpoint, EarlyStopping, Evaluate
from runmodel.runs import execute

from helpers import Tiny, make_data, params


class WithTestSplit(Tiny):
    """Tiny's 3-class classifier with a test split of 2 batches of other data (seed 7)."""

    def __init__(
        self, device: str | None = None, init_options: dict[str, Any] | None = None
    ) -> None:
        super().__init__(device or "cpu", init_options, classes=3)

    def setup(self, setup_options: dict[str, Any] | None = None) -> None:
        super().setup(setup_options)
        self.test_data = make_data(2, 8, 4, classes=3, seed=7)


def evaluated(weights: dict[str, torch.Tensor]) -> dict[str, float]:
    """The test split's metrics with ``weights``, by hand: ``runmodel.evaluate``."""
    model = WithTestSplit()
    model.setup()
    model.module.load_state_dict(weights)
    return runmodel.evaluate(model, model.test_data)


def test_the_test_split_is_evaluated_once_with_the_best_weights(tmp_path: Path) -> None:
    # "best" by the highest eval loss: an early epoch, so the best weights are not the last
    checkpoint = Checkpoint("checkpoint", best=("eval_loss", "max"), keep=None)
    engine = runmodel.Engine(Evaluate(), checkpoint, progress=False)
    passes: list[int] = []
    model = WithTestSplit()
    original = model.interface.evaluate
    model.interface = type(model.interface)()
    model.interface.evaluate = lambda m, data: (passes.append(len(data)), original(m, data))[1]
    result = engine.run(model, epochs=4, run_dir=tmp_path / "run")

    best, last = checkpoint.best_path, checkpoint.last_path
    assert best is not None and last is not None and "-00001-" in best.name
    expected = {f"test_{k}": v for k, v in evaluated(model_state(best)["module"]).items()}
    assert {k: v for k, v in result.metrics.items() if k.startswith("test_")} == expected
    trained = {f"test_{k}": v for k, v in evaluated(model_state(last)["module"]).items()}
    assert trained != expected  # the best weights made a difference
    assert passes == [4, 2]  # the eval data once (eval_*), the test split once
    recorded = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert {k: recorded["metrics"][k] for k in expected} == expected
    assert recorded["files"]["test_weights"] == f"checkpoint/{best.name}"
    # the model keeps its trained weights
    assert torch.equal(
        params(model), torch.cat([w.flatten() for w in model_state(last)["module"].values()])
    )


def test_without_a_best_checkpoint_the_trained_weights_are_tested(tmp_path: Path) -> None:
    model = WithTestSplit()
    result = runmodel.Engine(progress=False).run(model, epochs=2, run_dir=tmp_path / "run")
    expected = {f"test_{k}": v for k, v in evaluated(model.module.state_dict()).items()}
    assert {k: v for k, v in result.metrics.items() if k.startswith("test_")} == expected
    recorded = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert recorded["files"]["test_weights"] == "model.pt"


@pytest.mark.parametrize(
    "attach",
    [
        lambda e: e.attach(Checkpoint("c", best=("test_accuracy", "max"))),
        lambda e: e.attach(EarlyStopping("test_loss", patience=2)),
        lambda e: e.on("epoch_end", lambda e: None, reads=["test_loss"]),
        lambda e: e.on("epoch_end", lambda e: None, writes=["test_score"]),
    ],
    ids=["checkpoint-best", "early-stopping", "hook-reads", "hook-writes"],
)
def test_no_pack_or_hook_may_read_or_write_a_test_metric(tmp_path: Path, attach: Any) -> None:
    engine = runmodel.Engine(Evaluate(), progress=False)
    attach(engine)
    steps: list[int] = []
    engine.on("runstep", lambda e: steps.append(e.state.step))
    with pytest.raises(ValueError, match=r"'test_\w+': test_\* metrics are reserved"):
        engine.run(WithTestSplit(), epochs=1, run_dir=tmp_path / "run")
    assert steps == []  # refused at setup


def test_evaluate_may_not_use_the_test_prefix() -> None:
    with pytest.raises(ValueError, match="'test_' prefix is reserved"):
        Evaluate(prefix="test_")


def test_runmodel_eval_split_test(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A config run's test metrics, measured again by ``runmodel eval --split test`` with
    the same (best) weights; recorded in eval.json beside the eval split's."""
    name = f"test_split_{uuid.uuid4().hex[:8]}"
    runmodel.register_model(name, WithTestSplit)
    config = RunConfig.from_dict(
        {
            "model": name,
            "epochs": 2,
            "packs": [
                {"type": "evaluate"},
                {"type": "checkpoint", "args": {"best": ["eval_accuracy", "max"]}},
            ],
        }
    )
    result, run_dir = execute(config, tmp_path, progress=False)
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--split", "test", "--json"]) == 0
    measured = json.loads(capsys.readouterr().out)["metrics"]
    assert measured == {k: v for k, v in result.metrics.items() if k.startswith("test_")}
    assert main(["eval", str(run_dir), "--json"]) == 0
    assert set(json.loads(capsys.readouterr().out)["metrics"]) == {"loss", "accuracy"}
    recorded = json.loads((run_dir / "eval.json").read_text())
    best = Path(result.files["best_checkpoint"]).name
    assert recorded[f"checkpoint/{best} [test]"]["metrics"] == measured
    assert recorded[f"checkpoint/{best}"]["split"] == "eval"


def test_runmodel_eval_split_test_without_test_data_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = f"no_test_split_{uuid.uuid4().hex[:8]}"
    runmodel.register_model(name, WithoutTestSplit)
    _, run_dir = execute(
        RunConfig.from_dict({"model": name, "epochs": 1}), tmp_path, progress=False
    )
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--split", "test"]) == 2
    assert (
        "WithoutTestSplit has no test_data to evaluate on (--split test)" in capsys.readouterr().err
    )


class WithoutTestSplit(Tiny):
    def __init__(
        self, device: str | None = None, init_options: dict[str, Any] | None = None
    ) -> None:
        super().__init__(device or "cpu", init_options, classes=3)

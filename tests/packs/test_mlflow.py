"""The MLflow pack: real runs logged to a real local MLflow store (SQLite, made once for
the module), read back with MLflow's own ``MlflowClient``.

Skipped where MLflow is not installed (``pip install 'runmodel[mlflow]'``; the dev extra
has it), except the test of what the pack says then.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

import runmodel
import runmodel.session.folder
from runmodel.config.runconfig import RunConfig
from runmodel.packs import Checkpoint, Evaluate, MLflow
from runmodel.runs import execute
from runmodel.runs.table import flatten

from helpers import Tiny


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A local MLflow store (SQLite) and its artifacts' folder, and a client of it."""
    mlflow = pytest.importorskip(
        "mlflow",
        reason="MLflow is not installed: pip install 'runmodel[mlflow]' (the dev extra has it)",
    )
    folder = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    return {
        "uri": uri,
        "artifacts": str(folder / "artifacts"),
        "client": mlflow.MlflowClient(tracking_uri=uri),
    }


def tracker(store: dict[str, Any], experiment: str, **options: Any) -> MLflow:
    return MLflow(store["uri"], experiment, artifact_location=store["artifacts"], **options)


def mlflow_runs(store: dict[str, Any], experiment: str) -> list[Any]:
    client = store["client"]
    found = client.get_experiment_by_name(experiment)
    return [] if found is None else client.search_runs([found.experiment_id])


def history(store: dict[str, Any], run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in store["client"].get_metric_history(run_id, key))


def test_a_run_and_its_resume_are_one_mlflow_run(
    tmp_path: Path, store: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run interrupted after 2 epochs (KILLED: resumable), then resumed to 4 epochs:
    one MLflow run, FINISHED, with the script's record, its params, every epoch's metrics
    and every other step's loss once each, the final metrics, and the checkpoints."""
    experiment = f"resume-{uuid.uuid4().hex[:8]}"
    run_dir = tmp_path / "run"
    script = tmp_path / "scripts" / ".." / "train.py"  # the script the run was started as
    monkeypatch.setattr(sys.modules["__main__"], "__file__", str(script), raising=False)

    def run(epochs: int, interrupt_after: int | None = None) -> runmodel.RunResult:
        engine = runmodel.Engine(
            Evaluate(),
            Checkpoint("checkpoint", best=("eval_accuracy", "max")),
            tracker(store, experiment, every_steps=2, params={"lr": 0.1, "layers": [4, 3]}),
            progress=False,
        )
        if interrupt_after is not None:
            engine.on("epoch_end", lambda e: e.interrupt(), once=interrupt_after - 1)
        return engine.run(Tiny(classes=3), epochs=epochs, run_dir=run_dir, resume="auto")

    runmodel.seed(5)
    with pytest.raises(runmodel.Interrupted):
        run(4, interrupt_after=2)
    (first,) = mlflow_runs(store, experiment)
    assert first.info.status == "KILLED"
    result = run(4)

    (logged,) = mlflow_runs(store, experiment)
    run_id = logged.info.run_id
    assert run_id == first.info.run_id and logged.info.status == "FINISHED"
    assert logged.data.params == {"lr": "0.1", "layers": "[4, 3]"}
    tags = logged.data.tags
    record = runmodel.session.folder.read_json(run_dir / "run.json")
    assert tags["runmodel.run_id"] == record["id"]
    assert tags["runmodel.seed"] == "5" and record["seed"] == 5
    assert tags["runmodel.script"] == str(tmp_path / "train.py")  # resolved
    # every epoch's end once (4 steps an epoch); the final evaluation at the end measures
    # what the last epoch's end logged at step 16 already, so it is not logged twice
    accuracy = history(store, run_id, "eval_accuracy")
    assert [step for step, _ in accuracy] == [4, 8, 12, 16]
    assert accuracy[-1][1] == result.metrics["eval_accuracy"]
    assert [step for step, _ in history(store, run_id, "epoch")] == [4, 8, 12, 16]
    assert [step for step, _ in history(store, run_id, "loss_step")] == list(range(2, 17, 2))
    assert history(store, run_id, "lr/group0") == [(step, 0.1) for step in (4, 8, 12, 16)]
    saved = {Path(result.files[key]).name for key in ("best_checkpoint", "last_checkpoint")}
    artifacts = {Path(a.path).name for a in store["client"].list_artifacts(run_id, "checkpoints")}
    assert saved <= artifacts and "ckpt-00004-0000000016.pt" in artifacts


def test_config_run_logs_its_config_as_params(tmp_path: Path, store: dict[str, Any]) -> None:
    """A config run with an ``mlflow`` pack: its config flattened as ``runmodel runs``
    shows it, as the MLflow run's params; the run named as its folder."""
    name, experiment = f"tiny_mlflow_{uuid.uuid4().hex[:8]}", f"config-{uuid.uuid4().hex[:8]}"
    runmodel.register_model(name, Classifier)
    config = RunConfig.from_dict(
        {
            "model": name,
            "epochs": 1,
            "optimizer": {"type": "sgd", "args": {"lr": 0.1}},
            "packs": [
                {
                    "type": "mlflow",
                    "args": {
                        "tracking_uri": store["uri"],
                        "experiment": experiment,
                        "artifacts": False,
                    },
                }
            ],
        }
    )
    _, run_dir = execute(config, tmp_path, progress=False)
    (logged,) = mlflow_runs(store, experiment)
    params = {
        k: str(v) if not isinstance(v, str) else v for k, v in flatten(config.to_dict()).items()
    }
    assert {k: v for k, v in logged.data.params.items()} == {
        k: ("null" if v == "None" else v) for k, v in params.items()
    }
    assert logged.data.params["optimizer.args.lr"] == "0.1"
    assert logged.data.tags["mlflow.runName"] == run_dir.name
    assert "runmodel.script" not in logged.data.tags  # a config run: its config says it all
    assert logged.info.status == "FINISHED"


class Classifier(Tiny):
    """Tiny's 3-class classifier, as a registered model builds it."""

    def __init__(
        self, device: str | None = None, init_options: dict[str, Any] | None = None
    ) -> None:
        super().__init__(device or "cpu", init_options, classes=3)


def test_a_store_that_cannot_be_used_stops_the_run_at_setup(tmp_path: Path) -> None:
    pytest.importorskip("mlflow", reason="MLflow is not installed: pip install 'runmodel[mlflow]'")
    (tmp_path / "a-file").write_text("not a folder")
    engine = runmodel.Engine(
        MLflow(f"sqlite:///{tmp_path / 'a-file' / 'mlflow.db'}"), progress=False
    )
    steps: list[int] = []
    engine.on("runstep", lambda e: steps.append(e.state.step))
    with pytest.raises(ValueError, match=r"the tracking store 'sqlite:///.*' cannot be used"):
        engine.run(Tiny(classes=3), epochs=1)
    assert steps == []


def test_without_mlflow_the_pack_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if it were not installed
    engine = runmodel.Engine(MLflow(), progress=False)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'runmodel\[mlflow\]'"):
        engine.run(Tiny(classes=3), epochs=1)


def test_bad_arguments_are_refused_when_made() -> None:
    with pytest.raises(ValueError, match="every_steps"):
        MLflow(every_steps=0)
    with pytest.raises(TypeError, match="params="):
        MLflow(params=[("lr", 0.1)])  # type: ignore[arg-type]

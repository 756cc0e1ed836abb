"""Track a run in MLflow, through MLflow's own client (``mlflow.MlflowClient``):
parameters, metrics per epoch (and every N steps), the run's status, and its best and
last checkpoints as artifacts. A resumed run continues the same MLflow run.

MLflow is an optional dependency: ``pip install 'runmodel[mlflow]'`` (``docs/packs/mlflow.md``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from ..core import Hook, HookOptions, Interrupted, Pack
from ..core.checks import is_number, whole_number
from ..extras import require

__all__ = ["MLflow"]

#: At most this many values go in one ``log_batch`` call (MLflow's own limit).
BATCH = 1000
#: MLflow keeps a parameter's value up to this many characters.
PARAM_CHARS = 6000


class MLflow(Pack):
    """Log the run to MLflow: a new MLflow run at the start of a run, the same one
    continued when the run resumes (its id is part of this pack's checkpointed state).

    - **parameters**, once, when the MLflow run is made: a config run's config, flattened
      as ``runmodel runs`` shows it (``optimizer.args.lr``), and ``params`` (a dict of
      names to values; a value that is no number, string or bool is logged as JSON).
    - **tags**: the run's record (``runmodel.run_id``, ``runmodel.mode``, and for a script
      its path, arguments and ``runmodel.seed``; ``mlflow.source.name``), and ``tags``.
    - **metrics**: at each epoch's end, against the global step, the loss (the ``loss``
      metric, such as the epoch's mean, else the last step's), each number in
      ``state.metrics`` (``eval_accuracy``...), each optimizer group's learning rate
      (``lr/group0``) and ``epoch``; with ``every_steps=N`` also ``loss_step`` every N
      steps (one ``.item()`` each time, sent in one batch at the epoch's end); at the end,
      the final metrics (the run folder's ``eval_*`` and ``test_*``).
    - **status**: RUNNING, then FINISHED, KILLED (Ctrl-C, a preemption: resumable) or
      FAILED.
    - **artifacts**: the best and last checkpoints (``checkpoints/``) at the run's end,
      unless ``artifacts=False``.

    ``tracking_uri`` (default: MLflow's, ``MLFLOW_TRACKING_URI`` or ``sqlite:///mlflow.db``)
    is the tracking store, ``experiment`` the experiment's name (default:
    ``MLFLOW_EXPERIMENT_NAME``, else MLflow's ``Default``), made if missing, with
    ``artifact_location`` when given. Only process rank 0 logs.
    """

    name = "mlflow"
    #: the epoch's loss: where a pack reads ``loss``, the run computes the epoch's mean
    reads = ("loss",)

    def __init__(
        self,
        tracking_uri: str | None = None,
        experiment: str | None = None,
        *,
        run_name: str | None = None,
        params: Mapping[str, Any] | None = None,
        tags: Mapping[str, Any] | None = None,
        every_steps: int | None = None,
        artifacts: bool = True,
        artifact_location: str | None = None,
        modes: str | Iterable[str] = "train",
    ) -> None:
        whole_number(
            every_steps,
            "MLflow(every_steps=)",
            least=1,
            none=True,
            meaning="a row every that many steps",
        )
        for name, given in (("params", params), ("tags", tags)):
            if given is not None and not (
                isinstance(given, Mapping) and all(isinstance(k, str) for k in given)
            ):
                raise TypeError(f"MLflow({name}=) takes a dict of names to values, got {given!r}")
        if not isinstance(artifacts, bool):
            raise TypeError(f"MLflow(artifacts=) takes True or False, got {artifacts!r}")
        self.tracking_uri, self.experiment, self.run_name = tracking_uri, experiment, run_name
        self.params, self.tags = dict(params or {}), dict(tags or {})
        self.every_steps, self.artifacts = every_steps, artifacts
        self.artifact_location = artifact_location
        self.modes = HookOptions.of(modes=modes).modes
        #: what makes a run in a derived folder (a config's, a model source's), flattened
        #: (``describe_run``, as TensorBoard's)
        self.hparams: dict[str, Any] | None = None
        #: the MLflow run this run logs to (checkpointed: a resumed run continues it)
        self.run_id: str | None = None
        self.client: Any = None
        self._pending: list[Any] = []  # step metrics not sent yet
        self._sent: tuple[int, dict[str, float]] = (-1, {})  # the last epoch's end: step, values

    def hooks(self) -> Iterator[Hook]:
        yield Hook(
            self.start, "setup", HookOptions.of(name="mlflow.start", rank=0, modes=self.modes)
        )
        if self.every_steps:
            yield Hook(
                self.log_step,
                "runstep",
                HookOptions.of(
                    every=self.every_steps, name="mlflow.step", rank=0, modes=self.modes
                ),
            )
        yield Hook(
            self.log_epoch,
            "epoch_end",
            HookOptions.of(name="mlflow.epoch", priority=-100, rank=0, modes=self.modes),
        )  # after Evaluate
        # last: after the run folder's final metrics and the Checkpoint packs' last save
        yield Hook(
            self.end,
            "teardown",
            HookOptions.of(name="mlflow.end", priority=-1000, rank=0, modes=self.modes),
        )

    # -- setup ------------------------------------------------------------------------------

    def check_setup(self, engine: Any) -> None:
        """On rank 0 of a run it logs: MLflow is installed, the tracking store answers,
        the experiment is there (made if missing), and a resumed run's MLflow run is in
        this store; any of these failing stops the run before its first step."""
        if engine.resumed_from is None:
            self.run_id = None  # a run from step 0: a new MLflow run
        if engine.state.rank != 0 or (
            self.modes is not None and engine.state.mode not in self.modes
        ):
            return
        mlflow = require("mlflow", needed_by="runmodel.packs.MLflow")
        uri = self.tracking_uri or mlflow.get_tracking_uri()
        try:
            self.client = mlflow.MlflowClient(tracking_uri=uri)
            self._experiment_id()
        except Exception as error:  # a store that cannot be reached or made, in its words
            raise ValueError(
                f"MLflow: the tracking store {uri!r} cannot be used: {_first_line(error)}"
            ) from None
        if self.run_id is not None:
            try:
                self.client.get_run(self.run_id)
            except Exception:
                raise ValueError(
                    f"MLflow: the checkpoint continues MLflow run {self.run_id}, which the "
                    f"tracking store {uri!r} does not hold; give the store the run was logged "
                    f"to (MLflow(tracking_uri=...) or MLFLOW_TRACKING_URI)"
                ) from None

    def _experiment_id(self) -> str:
        name = self.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "Default"
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return str(found.experiment_id)
        return str(self.client.create_experiment(name, artifact_location=self.artifact_location))

    def start(self, engine: Any) -> None:
        """Make the MLflow run (with its parameters), or mark the continued one running."""
        self._pending = []
        tags = {**self._record(engine), **{k: str(v) for k, v in self.tags.items()}}
        if self.run_id is None:
            run = self.client.create_run(self._experiment_id(), run_name=self.run_name, tags=tags)
            self.run_id = run.info.run_id
            self._log_params()
        else:  # a resumed run: the same MLflow run goes on
            self.client.update_run(self.run_id, status="RUNNING")
            self._send([], tags)

    def describe_run(self, name: str, params: Mapping[str, Any]) -> None:
        """What a run in a derived folder tells its trackers (``runs/folder_run.py``): its
        parameters become the MLflow run's params, and its folder's name the MLflow run's
        name, unless one was given."""
        self.hparams = dict(params)
        if self.run_name is None:
            self.run_name = name

    def _record(self, engine: Any) -> dict[str, str]:
        """The run's record as tags: its id and mode; a script's path, arguments and
        seed (``runmodel.seed``)."""
        from ..models.seeding import last_seed

        record = {
            "runmodel.run_id": str(engine.run_record.get("id")),
            "runmodel.mode": str(engine.state.mode),
        }
        if self.hparams is None:  # a script run (a derived folder's run has its params)
            script = getattr(sys.modules.get("__main__"), "__file__", None)
            if script is not None:
                record["mlflow.source.name"] = str(Path(script).resolve())
                record["runmodel.script"] = str(Path(script).resolve())
            record["runmodel.argv"] = json.dumps(sys.argv[1:])
            seed = last_seed()
            if seed is not None:
                record["runmodel.seed"] = str(seed)
        return record

    def _log_params(self) -> None:
        from mlflow.entities import Param

        values = {**(self.hparams or {}), **self.params}
        params = [Param(key, _param_text(value)) for key, value in values.items()]
        for i in range(0, len(params), 100):  # MLflow takes 100 params a batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    # -- metrics ----------------------------------------------------------------------------

    def log_step(self, engine: Any) -> None:
        loss = engine.state.loss
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            self._pending.append(_metric("loss_step", float(loss.detach()), engine.state.step + 1))

    def log_epoch(self, engine: Any) -> None:
        s = engine.state
        if s.interrupted and not s.epoch_complete:
            return  # a partial epoch, cut short by an interrupt: no point of the curves
        values = {"epoch": s.epoch + 1, **self._metrics(engine)}
        optimizer = getattr(engine.model, "optimizer", None)
        for i, group in enumerate(
            getattr(optimizer, "param_groups", ()) if s.kind == "train" else ()
        ):
            values[f"lr/group{i}"] = group["lr"]
        pending, self._pending = self._pending, []
        self._send(pending + [_metric(k, v, s.step) for k, v in values.items()])
        self._sent = (s.step, values)

    def _metrics(self, engine: Any) -> dict[str, float]:
        """The loss and every number in ``state.metrics``."""
        s = engine.state
        found: dict[str, float] = {}
        loss = s.metrics.get("loss", s.loss)
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            found["loss"] = loss.detach().item()
        found.update((k, float(v)) for k, v in s.metrics.items() if is_number(v))
        return found

    def _send(self, metrics: list[Any], tags: Mapping[str, str] | None = None) -> None:
        from mlflow.entities import RunTag

        run_tags = [RunTag(k, v) for k, v in (tags or {}).items()]
        if run_tags:
            self.client.log_batch(self.run_id, tags=run_tags)
        for i in range(0, len(metrics), BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + BATCH])

    # -- the end ----------------------------------------------------------------------------

    def end(self, engine: Any) -> None:
        """The final metrics, the checkpoints, the status; whatever ended the run."""
        if self.run_id is None or self.client is None:
            return
        s = engine.state
        try:
            if s.error is None:
                # what the last epoch's end sent at this step already is not sent again
                step, sent = self._sent
                final = {
                    k: v
                    for k, v in self._metrics(engine).items()
                    if step != s.step or sent.get(k) != v
                }
                pending, self._pending = self._pending, []
                self._send(pending + [_metric(k, v, s.step) for k, v in final.items()])
            if self.artifacts:
                self._log_checkpoints(s.files)
        finally:
            self.client.set_terminated(self.run_id, status=_status(s.error))

    def _log_checkpoints(self, files: Mapping[str, str]) -> None:
        """The best and last checkpoints (a file, or a sharded one's folder) under
        ``checkpoints/``."""
        for key in ("best_checkpoint", "last_checkpoint"):
            path = Path(files[key]) if files.get(key) else None
            if path is None or not path.exists():
                continue
            if path.is_dir():
                self.client.log_artifacts(self.run_id, str(path), f"checkpoints/{path.name}")
            else:
                self.client.log_artifact(self.run_id, str(path), "checkpoints")

    def state_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.run_id = state.get("run_id")


def _metric(key: str, value: float, step: int) -> Any:
    from mlflow.entities import Metric

    return Metric(key, float(value), int(time.time() * 1000), int(step))


def _param_text(value: Any) -> str:
    text = (
        value
        if isinstance(value, str)
        else json.dumps(value)
        if isinstance(value, (list, dict)) or value is None
        else str(value)
    )
    return text[:PARAM_CHARS]


def _status(error: BaseException | None) -> str:
    """The MLflow status of a run that ended with ``error``."""
    if error is None:
        return "FINISHED"
    if isinstance(error, (Interrupted, KeyboardInterrupt)):
        return "KILLED"
    return "FAILED"


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__

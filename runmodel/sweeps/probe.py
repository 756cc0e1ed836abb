"""The sweep's metric, checked at setup against what a config run of its config records:
the run is set up in a temporary folder and ended before its first step, and the
metric names it would record are read from what its packs and hooks declare. It is
ended as by an error of its own (``Probed``), not stopped: a stopped run is saved
(``Checkpoint``), evaluated and ranked by its metrics, which only a run produces."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

from ..config.runconfig import load_config
from ..core import Pack, hook
from ..core.metric_names import declared_writes
from ..runs import prepare
from .spec import SweepError, SweepSpec, close_to

__all__ = ["TEST_PREFIX", "check_metric", "recorded_metrics"]

#: Metrics of a test split: never tuned on (the test set would no longer measure).
TEST_PREFIX = "test_"


def recorded_metrics(engine: Any) -> dict[str, str]:
    """The metric names a config run of ``engine``'s run (set up, not started) records in
    its ``metrics.json``, each with who writes it: the names its packs and hooks declare
    they put in ``state.metrics`` (the run's metrics are those at its end) and, for a
    training run whose model has eval data, ``eval_<name>`` of each of the model's
    ``metrics()``, which a config run evaluates after training.

    The step's ``loss`` is not among them: packs may read the last step's loss under that
    name, but the run does not record it."""
    mode, model = engine.state.mode, engine.model
    found = declared_writes(engine.table, mode, 0, ())
    metrics = getattr(model, "metrics", None)
    if callable(metrics) and (
        mode == "eval" or (mode == "train" and getattr(model, "eval_data", None) is not None)
    ):
        prefix = "eval_" if mode == "train" else ""
        found.update((prefix + name, f"{type(model).__name__}.metrics()") for name in metrics())
    return found


class Probed(Exception):
    """Ends the probe's run once the metric names are read."""


class _Probe(Pack):
    """After every other setup hook, reads the metric names the run records, and ends
    it before its first step (``Probed``)."""

    name = "sweep_probe"

    def __init__(self) -> None:
        self.found: dict[str, str] = {}

    @hook(priority=-10_000)
    def setup(self, engine: Any) -> None:
        self.found.update(recorded_metrics(engine))
        raise Probed("sweep: the metric names read")


def check_metric(spec: SweepSpec) -> None:
    """Refuse, before any trial, a metric that the base config's run does not record
    (``recorded_metrics``), and any ``test_*`` metric."""
    if spec.metric.startswith(TEST_PREFIX):
        raise SweepError(
            f"metric {spec.metric!r}: a sweep does not tune on a test split's "
            f"metric ({TEST_PREFIX}*): the chosen values would be fitted to the "
            f"test set, which then no longer measures them; sweep on a "
            f"validation metric (eval_*) and read {spec.metric} of the best "
            f"trial once"
        )
    probe = _Probe()
    # in this one process: the metric names do not depend on the backend (ddp, fsdp)
    config = dataclasses.replace(load_config(spec.config, list(spec.overrides)), backend=None)
    with tempfile.TemporaryDirectory(prefix="runmodel-sweep-") as folder:
        try:
            prepared = prepare(
                config,
                directory=Path(folder) / "run",
                progress=False,
                packs=[probe],
                base=spec.config.parent,
            )
            prepared.engine.run(
                prepared.model,
                mode=config.mode,
                epochs=1,
                backend=prepared.built.backend,
                setup_options=prepared.built.setup_options,
            )
        except Probed:
            pass
        except Exception as error:  # the base config itself is broken: every trial would be
            raise SweepError(
                f"the sweep's config cannot run: {type(error).__name__}: {error}"
            ) from None
    found = {k: v for k, v in probe.found.items() if not k.startswith(TEST_PREFIX)}
    if spec.metric not in found:
        raise SweepError(
            f"metric {spec.metric!r}: a run of the sweep's config does not record it"
            f"{close_to(spec.metric, list(found))}; it records: "
            f"{', '.join(sorted(found)) or 'nothing'}. If a hook of yours writes it into "
            f"state.metrics, declare it (engine.on(phase, fn, writes=[{spec.metric!r}]), or "
            f"writes = [...] in a pack)"
        )

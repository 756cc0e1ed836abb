"""Evaluate and infer with a trained run: its best checkpoint (else its last, else its
final weights) loaded into the run's model, on the run's data (``split="test"``: its
``test_data``, metrics named ``test_*``); ``runmodel eval`` and ``runmodel infer``. The
result goes into the run's ``eval.json``, keyed by the weights used (and the split, for
the test split); no new folder is made."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from .._io import read_json
from ..checkpoint.export import model_state
from ..checkpoint.format import ranked_best, run_of
from ..checkpoint.names import best_in, checkpoints_in, is_best, is_checkpoint
from ..core import Pack, RunResult
from ..engine import Engine
from ..session.folder import METRICS, MODEL, RECORD, read_status, record_evaluation, resolve

__all__ = ["SPLITS", "choose_weights", "evaluate_model", "record_eval", "weights_kind"]

WHICH = ("best", "last")
#: The data ``runmodel eval`` evaluates on: the model's eval_data or test_data.
SPLITS = ("eval", "test")


def choose_weights(run_dir: Path, which: str | None = None) -> Path:
    """The weights to use: ``which`` is ``"best"``, ``"last"``, a file, or None (the best
    checkpoint if there is one, else the last, else the final weights ``model.pt``). A
    checkpoint may be a sharded one's folder (an ``fsdp`` run's).

    The run's files name checkpoints relative to its folder, so a folder that was moved,
    copied or moved aside (``--restart``) uses its own; a checkpoint whose run record
    names another run than the folder's is never used (a folder written before paths
    were relative names the place it was started in, which may hold another run now)."""
    files = {
        **read_json(run_dir / METRICS).get("files", {}),
        **read_status(run_dir).get("files", {}),
    }
    run = read_json(run_dir / RECORD).get("id")
    newest = [p for p in checkpoints_in(run_dir, best=False) if _of_run(p, run)]
    best = _existing(run_dir, files.get("best_checkpoint"), run) or _best(run_dir, run, newest)
    last = _existing(run_dir, files.get("last_checkpoint"), run) or next(iter(newest), None)
    if which == "best":
        if best is None:
            raise FileNotFoundError(
                f"{run_dir} has no best checkpoint (its Checkpoint pack had "
                f"no best=); use --checkpoint last"
            )
        return best
    if which == "last":
        if last is None:
            raise FileNotFoundError(f"{run_dir} has no checkpoint")
        return last
    if which is not None:
        path = Path(which)
        if not _usable(path) and _usable(run_dir / path):
            path = run_dir / path
        if not _usable(path):
            raise FileNotFoundError(
                f"--checkpoint {which}: no such file (give best, last, or a checkpoint file)"
            )
        if not _of_run(path, run):
            raise FileNotFoundError(
                f"--checkpoint {which}: a checkpoint of run "
                f"{(run_of(path) or {}).get('id')}, and {run_dir} holds run "
                f"{run}: give one of its own checkpoints"
            )
        return path
    for found in (best, last, run_dir / MODEL):
        if found is not None and _usable(found):
            return found
    raise FileNotFoundError(
        f"{run_dir} has no trained weights: no checkpoint and no "
        f"model.pt (did the run finish an epoch?)"
    )


def weights_kind(path: Path) -> str:
    """What ``choose_weights`` chose, in words: ``"best checkpoint"``, ``"final weights"``
    (``model.pt``) or ``"checkpoint"`` (the newest, where the run has no best)."""
    if path.name == MODEL:
        return "final weights"
    return "best checkpoint" if is_best(path) else "checkpoint"


def _existing(run_dir: Path, name: str | None, run: str | None) -> Path | None:
    """The checkpoint the run's files name: relative to its folder, else (written
    before) as named, else by its name in the folder's ``checkpoint/``; one of the run
    ``run``."""
    if not name:
        return None
    for path in (resolve(run_dir, name), Path(name), run_dir / "checkpoint" / Path(name).name):
        if path is not None and _usable(path) and _of_run(path, run):
            return path
    return None


def _of_run(path: Path, run: str | None) -> bool:
    """Whether the checkpoint at ``path`` belongs to run ``run`` (its record says so, or
    one of them does not say)."""
    held = (run_of(path) or {}).get("id")
    return run is None or held is None or held == run


def _usable(path: Path) -> bool:
    """A file, or a whole sharded checkpoint folder."""
    return is_checkpoint(path)


def _best(run_dir: Path, run: str | None, newest: list[Path]) -> Path | None:
    """Where the run's files name no best checkpoint: the best of its best-K files, as
    its newest checkpoint file ranked them (the files' names do not say whether the
    metric is minimised or maximised); one alone is the best."""
    found = [p for p in best_in(run_dir) if _of_run(p, run)]
    if len(found) <= 1:
        return next(iter(found), None)
    by_name = {p.name: p for p in found}
    for checkpoint in newest:
        for name in ranked_best(checkpoint) if checkpoint.is_file() else ():
            if name in by_name:
                return by_name[name]
    return None


def load_weights(model: Any, path: Path, averaged: bool = False) -> None:
    """Put the weights of ``path`` (a checkpoint, a sharded checkpoint's folder, or a
    ``model.pt`` state dict) into ``model``, set up already; its optimizer is left
    alone. A file that holds no weights is one ``ValueError`` naming it and saying why.
    ``averaged``: the average an ``EMA`` or ``SWA`` pack kept in the checkpoint."""
    model.load_state_dict(model_state(path, averaged=averaged))


def evaluate_model(
    model: Any,
    weights: Path,
    mode: str,
    *,
    setup_options: dict[str, Any] | None = None,
    engine: Engine | None = None,
    averaged: bool = False,
    split: str = "eval",
) -> RunResult:
    """Run ``model`` in ``mode`` (eval or infer) with ``weights`` (``averaged``: their
    EMA or SWA average) loaded once it is set up; ``split="test"`` runs it on the model's
    ``test_data`` (which its setup makes) in place of its eval data, and names the
    metrics ``test_*``."""
    if split not in SPLITS:
        raise ValueError(
            f"split={split!r}: the data to evaluate on is one of "
            f"{', '.join(SPLITS)} (the model's eval_data or test_data)"
        )
    engine = engine or Engine()
    handles = [
        engine.on(
            "setup",
            lambda e: load_weights(e.model, weights, averaged),
            priority=3000,
            name="runmodel.load_weights",
        )
    ]
    if split == "test":
        handles.append(engine.attach(TestSplit()))
    try:
        result = engine.run(model, mode, setup_options=setup_options)
    finally:
        for handle in handles:
            handle.detach()
    if split == "test" and mode == "eval":
        result.metrics = {f"test_{k}": v for k, v in result.metrics.items()}
    return result


class TestSplit(Pack):
    """Puts the model's test split where its eval (and infer) steps read their data, once
    ``setup()`` made it, before the run's first step; a model without one is refused
    there."""

    name = "test_split"

    def check_setup(self, engine: Any) -> None:
        model = engine.model
        data = getattr(model, "test_data", None)
        if data is None:
            raise ValueError(
                f"{type(model).__name__} has no test_data to evaluate on (--split "
                f"test): set self.test_data in its setup(), beside eval_data"
            )
        model.eval_data = data
        if getattr(model, "infer_data", None) is not None:
            model.infer_data = data


def record_eval(
    run_dir: Path, weights: Path, result: RunResult, averaged: bool = False, split: str = "eval"
) -> str:
    """Add ``result`` to the run's ``eval.json``, keyed by the weights used (``averaged``:
    `` (averaged)`` after the checkpoint's name; the test split: ``" [test]"``); the
    key."""
    try:
        key = str(weights.resolve().relative_to(run_dir.resolve()))
    except ValueError:
        key = str(weights.resolve())
    key += " (averaged)" if averaged else ""
    if split != "eval":
        key = f"{key} [{split}]"
    entry = {"metrics": result.metrics, "steps": result.steps, "at": time.time(), "split": split}
    record_evaluation(run_dir, key, entry)
    return key

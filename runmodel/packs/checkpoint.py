"""Save the run's state every so often; resume from it with ``engine.run(resume=...)``."""

from __future__ import annotations

import math
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .._io import prepare_folder, remove_stale
from ..checkpoint.format import run_of
from ..checkpoint.names import checkpoints_in, saved_entries
from ..checkpoint.storage import AsyncWriter, Storage
from ..core import Hook, HookOptions, Interrupted, Pack
from ..core.checks import is_whole_number, whole_number
from ..core.options import parse_duration
from ..models.torch_model import state_parts
from ._common import read_metric
from ._finite import check_finite_parameters, module_of
from .metric_watcher import MetricWatcher

__all__ = ["Checkpoint"]

#: the metrics an async save records: its stall, and the least it could be
_COSTS = ("checkpoint_stall_s", "checkpoint_floor_s")


class Checkpoint(Pack):
    """Write checkpoints into ``directory``: ``every="1ep"`` (at the end of every epoch),
    ``"2ep"``, ``"500st"`` (after every 500th step) or ``"10min"``; keep the newest
    ``keep`` (older ones are deleted only once the new one is on disk). Only process
    rank 0 writes (under the ``fsdp`` backend, every process writes its shards).

    ``best=("eval_accuracy", "max")`` also keeps the best ``keep_best`` checkpoints by
    that metric of ``engine.state.metrics`` (``"min"`` for a loss), as
    ``best-<metric>=<value>-<epoch>-<step>.pt`` beside the newest ones; ``resume=`` with
    the folder still takes the newest checkpoint, not the best. ``keep=0`` with ``best=``
    keeps the best alone (and ``resume="auto"`` continues from the newest of them).
    ``best_path`` and ``last_path`` name the best and the newest checkpoint (also in the
    run's ``result.files``).

    The folder holds one run's checkpoints (``docs/runs.md``): every checkpoint records
    the run that wrote it (its id and start time). A run started afresh (no
    ``resume=``) into a folder that holds another run's checkpoints is refused at setup,
    unless ``overwrite=True``, which moves the old run's checkpoints into a subfolder
    ``previous-<run id>/`` (nothing is deleted) and starts afresh, or
    ``overwrite="replace"``, which deletes them (a script that reruns into one ``out_dir``).
    The folder's other files (a script's own ``ckpt.pt``, exported weights, logs) are
    never moved or deleted, and need no ``overwrite``.

    With ``best=``, the values an evaluation measured before the first step
    (``Evaluate(at_start=True)``) are the baseline a checkpoint must beat to be among the
    best (nothing is saved at start); with ``keep=0`` a save that is not a new best
    writes nothing.

    ``save()`` called from any hook of a train run saves the run as it stands, now, named
    for where a resumed run starts (``docs/packs/checkpoint.md`` says what each phase's
    save holds).

    A run resumed from any of them goes on exactly as a straight run would, also from one
    taken mid-epoch (by ``"Nst"``, or at the end of an epoch that the step budget or
    ``stop()`` cut short): the checkpoint holds where the epoch's data stands
    (``runmodel/core/position.py``).

    ``async_save=True`` copies the state into CPU buffers at the save (the training waits
    only for that copy) and writes the file in the background (plain files: from a
    writer process, ``checkpoint.writer.Writer``, which checks the parameters finite on
    its copy, and takes a ``TorchModel``'s state from its live module and optimizer,
    planned at the first save), with the same temporary file, rename and pruning. At
    most one checkpoint
    is written at a time: a
    save that comes while the previous one is still being written waits for it. The end
    of the run (also one ended by an error) waits for the last write; an error that a
    background write met is raised at the next save or at the end of the run, naming the
    file. ``wait()`` waits for the write under way. Each async save records what it
    cost the training in ``engine.state.metrics`` until the next save (so the loggers
    and the run's log show them; checkpoints do not hold them): ``checkpoint_stall_s``,
    the seconds the save hook kept the training waiting, and ``checkpoint_floor_s``, the
    least it could: the state's bytes over the best copy bandwidth measured (where the
    writer measures it: plain files on a CPU).

    How a checkpoint is written is the run's checkpoint storage (``engine.storage``, from
    the backend; ``runmodel.checkpoint.storage``): plain files written by rank 0, or under
    the ``fsdp`` backend a folder of shards per save, written by every process and made
    visible by one rename once all have written; best-K keeps the best folders themselves
    (no links) and lists them in ``best.json``; ``async_save`` writes with
    ``torch.distributed.checkpoint``'s async save. The pack keeps the policy: when, which
    to keep, the best-K, and the lists put back when a background write fails.

    Each save first removes the temporary files and staging folders that writers killed
    mid-write left in ``directory`` (``runmodel._io``: a live writer's file is
    locked, a sharded save's staging folder holds a shared lock of each process writing
    it, and they are kept), and refuses to write non-finite parameters
    (``FloatingPointError`` naming the step; under ``fsdp`` the processes' verdicts on
    their shards are all-reduced, and all refuse together); a full disk stops the run with
    one ``DiskFullError`` naming the file (under ``fsdp``, every process, naming the
    checkpoint's folder).

    A folder is one pack's: two Checkpoint packs of a run on one folder are refused at
    setup.
    """

    name = "checkpoint"

    def __init__(
        self,
        directory: str | os.PathLike[str],
        every: int | str = "1ep",
        keep: int | None = 2,
        best: tuple[str, str] | None = None,
        keep_best: int = 1,
        async_save: bool = False,
        overwrite: bool | str = False,
    ) -> None:
        self.every = parse_duration(every, "every")
        if self.every.unit == "own":  # a count of epochs
            self.every = parse_duration(f"{int(self.every.amount)}ep", "every")
        if (not is_whole_number(keep) and keep is not None) or (keep == 0 and best is None):
            raise ValueError(
                f"keep= must be a whole number >= 1 or None (keep all), or 0 with "
                f"best= (keep only the best); got {keep!r}"
            )
        #: ranks the checkpoints by best= (its metric and direction, checked by it)
        self._ranker: MetricWatcher | None = None
        if best is not None:
            try:
                if not isinstance(best, (tuple, list)) or len(best) != 2:
                    raise ValueError(best)
                self._ranker = MetricWatcher(*best, owner="Checkpoint")
            except (TypeError, ValueError):
                raise ValueError(
                    f"best= names a metric and whether lower or higher is better, as "
                    f"('eval_accuracy', 'max') or ('eval_loss', 'min'); got {best!r}"
                ) from None
        whole_number(keep_best, "keep_best=", least=1)
        if not isinstance(async_save, bool):
            raise TypeError(f"async_save= takes True or False, got {async_save!r}")
        if not isinstance(overwrite, bool) and overwrite != "replace":
            raise TypeError(
                f"overwrite= takes False (refuse a folder holding another run's "
                f'checkpoints), True (move them into previous-<run id>/) or "replace" '
                f"(delete them); got {overwrite!r}"
            )
        self.overwrite = overwrite
        self.directory, self.keep = Path(directory), keep
        self.best, self.keep_best = (None if best is None else (best[0], best[1])), keep_best
        #: the metric best= ranks by: checked at setup against those the run declares
        self.reads = () if best is None else (best[0],)
        self.saved: list[str] = []
        self.best_saved: list[tuple[float, str]] = []  # (metric value, name), best first
        #: the metric's value before the first step (Evaluate(at_start=True)): to beat
        self.baseline: float | None = None
        self.async_save = async_save
        if async_save:
            self.writes = _COSTS
        # the run's checkpoint storage (engine.storage, taken at setup) and its background
        # writer (async_save), kept while the storage is the same
        self._storage: Storage | None = None
        self._writer: AsyncWriter | None = None
        # the lists before the save being written: put back if writing it fails
        self._rollback: tuple[list[str], list[tuple[float, str]]] | None = None
        self._move_old = False  # overwrite=True found another run's checkpoints there
        # a step's save that fell on the epoch's last step: taken at the epoch's end
        self._at_epoch_end = False
        self._engine: Any = None  # the run under way (from setup to teardown): save()'s

    @property
    def last_path(self) -> Path | None:
        """The newest checkpoint this pack wrote or resumed with (None: none yet)."""
        return self.directory / self.saved[-1] if self.saved else None

    @property
    def best_path(self) -> Path | None:
        """The best checkpoint by ``best=``'s metric (None: no ``best=``, or none yet)."""
        return self.directory / self.best_saved[0][1] if self.best_saved else None

    def folder_run(self, rank: int = 0) -> dict[str, Any] | None:
        """The run whose checkpoints the folder holds, as its newest readable checkpoint
        records it (``{}``: checkpoints written before runs had records, which count as
        one run's); None for a folder without checkpoints. (A sharded checkpoint holds
        each process's record: process ``rank`` reads the one it would resume with.)"""
        for path in checkpoints_in(self.directory) if self.directory.is_dir() else ():
            if path.parent != self.directory:
                break  # checkpoints_in looks into DIR/checkpoint/ too: not this folder
            record = run_of(path, rank)
            if record is not None:
                return record
        return None

    def check_setup(self, engine: Any) -> None:
        """The folder is this pack's alone, and holds one run's checkpoints: a fresh run
        into one that holds a run is refused (unless ``overwrite=True``), and so is
        continuing another run there. Then the folder is made and tried, where this
        process will write (rank 0 of a train run), so that one that cannot be written
        stops the run before its first step, not at the first save."""
        if engine.state.mode != "train":  # the only mode it saves in
            return
        self._check_one_pack(engine)
        if engine.storage is None:
            raise ValueError(
                "Checkpoint writes through the engine's checkpoint storage, and "
                "this engine has none: use runmodel.Engine, or give "
                "runmodel.core.BareEngine(storage=runmodel.checkpoint.FileStorage())"
            )
        self._check_folder_run(engine)
        if engine.state.rank == 0:
            prepare_folder(self.directory, "Checkpoint")

    def _check_one_pack(self, engine: Any) -> None:
        """Two packs writing one folder would prune each other's checkpoints."""
        mine = os.path.abspath(self.directory)
        keys = [
            key
            for key, pack in engine.table.packs.items()
            if isinstance(pack, Checkpoint) and os.path.abspath(pack.directory) == mine
        ]
        if len(keys) > 1:
            raise ValueError(
                f"Checkpoint packs {' and '.join(repr(k) for k in keys)} both write "
                f"to {str(self.directory)!r}: each would delete the other's "
                f"checkpoints as its own old ones. Give each its own folder "
                f"(or attach one Checkpoint pack)"
            )

    def _check_folder_run(self, engine: Any) -> None:
        holder, record = self.folder_run(engine.state.rank), engine.run_record
        self._move_old = False
        if holder is None:
            return
        if engine.resumed_from is None:
            if self.overwrite:
                self._move_old = True
                return
            started = holder.get("started")
            when = (
                f", started {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(started))}"
                if isinstance(started, (int, float))
                else ""
            )
            name = f"run {holder['id']}{when}" if holder.get("id") else "a run"
            raise FileExistsError(
                f"{self.directory} holds the checkpoints of {name}; this run starts from step "
                f'0. Continue that run with resume="auto", give this run another folder, or '
                f"use Checkpoint({str(self.directory)!r}, overwrite=True) to move the old run "
                f"into {self.directory / 'previous-<run id>'} and start afresh (nothing is "
                f"deleted)"
            )
        if holder.get("id") and holder["id"] != record.get("id"):
            raise FileExistsError(
                f"{self.directory} holds the checkpoints of run {holder['id']}, and this run "
                f"continues run {record.get('id')} (from {engine.resumed_from}); a folder "
                f"holds one run's checkpoints: give this run another folder"
            )

    def setup(self, engine: Any) -> None:
        """The run's checkpoint storage (and a background writer for it); on rank 0,
        ``overwrite=True`` on a folder that holds a run moves that run aside."""
        storage: Storage = engine.storage
        if self.async_save and (self._writer is None or storage is not self._storage):
            self._writer = storage.writer()
        self._storage, self._engine = storage, engine
        self._at_epoch_end = False
        if self._move_old and engine.state.rank == 0:
            self._move_old = False
            self._move_aside()

    def _move_aside(self) -> Path | None:
        """The other run's checkpoints (and nothing else of the folder) moved into
        ``previous-<run id>/``, or deleted where ``overwrite="replace"``."""
        if self.overwrite == "replace":
            for item in saved_entries(self.directory):
                if item.is_dir():
                    shutil.rmtree(item)
                else:
                    item.unlink()
            return None
        holder = self.folder_run() or {}
        base = f"previous-{holder.get('id') or time.strftime('%Y%m%d-%H%M%S')}"
        target, n = self.directory / base, 2
        while target.exists():
            target, n = self.directory / f"{base}-{n}", n + 1
        target.mkdir(parents=True)
        for item in saved_entries(self.directory):
            os.replace(item, target / item.name)
        return target

    def take_baseline(self, engine: Any) -> None:
        """Before a run's first step (a run from step 0, not a resumed one): the value
        ``best=``'s metric has then (an ``Evaluate(at_start=True)``'s) is what a
        checkpoint must beat to be among the best."""
        s = engine.state
        if self.best is None or s.step != 0 or engine.resumed_from is not None:
            return
        value = read_metric(s, self.best[0])
        self.baseline = float(value) if value is not None else None
        if self.baseline is not None and not math.isfinite(self.baseline):
            self.baseline = None

    def hooks(self) -> Iterator[Hook]:
        # first: the storage is there for any other setup hook that saves
        yield Hook(self.setup, "setup", HookOptions.of(modes="train", priority=10_000))
        if self.best is not None:  # after Evaluate(at_start=True) (priority 10_000)
            yield Hook(
                self.take_baseline,
                "epoch_start",
                HookOptions.of(modes="train", priority=9_999, name="checkpoint.baseline"),
            )
        phase = "epoch_end" if self.every.unit == "ep" else "runstep"
        # last: after other hooks' state changes, and after Evaluate's evaluation of the
        # same step or epoch whatever other hooks' constraints do to priorities (best=
        # ranks what it measured); every rank: under fsdp each writes its shard, else all
        # but rank 0 return at once
        yield Hook(
            self._save_scheduled,
            phase,
            HookOptions.of(
                every=self.every.text,
                modes="train",
                priority=-1000,
                after="evaluate",
                name="checkpoint.save",
            ),
        )
        if phase == "runstep":
            yield Hook(
                self.save_at_epoch_end,
                "epoch_end",
                HookOptions.of(
                    modes="train", priority=-1000, after="evaluate", name="checkpoint.epoch_end"
                ),
            )
        yield Hook(self.save_last, "teardown", HookOptions.of(modes="train"))

    def _writes_here(self, engine: Any) -> bool:
        return self._storage is not None and self._storage.writes_here(engine.state.rank)

    def save_last(self, engine: Any) -> Path | None:
        """A run that ``stop()`` ended (early stopping, a sweep's pruner) or that
        ``engine.interrupt()`` ended (Ctrl-C or a preemption signal, in any run:
        ``Interrupted``, after a whole step) is saved where it stopped, unless the newest
        checkpoint is there already. Waits for the background write, however the run
        ended."""
        s = engine.state
        if not self._writes_here(engine):
            return None
        storage = self._storage
        assert storage is not None
        try:
            whole = isinstance(s.error, Interrupted) or (s.error is None and s.ended == "stopped")
            if not whole or not storage.ended_together:
                return None  # (a collective save needs every process: they did not agree)
            counters = {} if not s.epoch_complete else {"epoch_step": 0}
            if self.saved and self.saved[-1] == storage.name(s.epoch, s.step):
                return None
            return self._write(engine, counters)
        finally:
            try:
                self.wait()
            finally:  # the run's storage (and its model) go with the run
                self._storage = self._engine = None
                s.files.update(
                    {
                        k: str(v)
                        for k, v in (
                            ("best_checkpoint", self.best_path),
                            ("last_checkpoint", self.last_path),
                        )
                        if v is not None
                    }
                )

    def save(self, engine: Any = None) -> Path | None:
        """Save the run now, from any hook of a train run (``engine``: the run's engine,
        else the one this pack's ``setup`` hook saw): a checkpoint named and counted for
        where the run stands, from which a resumed run goes on as this one does
        (``engine.counters_now()``). In a ``runstep`` hook, it holds the step as done;
        in an ``epoch_end`` hook, the epoch as ended; in a ``step_start`` or
        ``epoch_start`` hook, the step or epoch as about to begin (a resumed run begins
        it, and runs its hooks, again); in ``setup`` or ``teardown`` hooks, the run
        between epochs. The hooks after the saving one in its phase ran in this run but
        do not run again in a resumed one: save from the phase's last hook. Kept and
        ranked as the pack's own saves (``keep=``, ``best=``). Returns the checkpoint's
        path (being written, with ``async_save``); None where this process does not write,
        or where a resumed run has not reached its checkpoint's state yet (its ``setup``
        hooks, or its first epoch's before the first step): nothing new to save. A
        ``RuntimeError`` outside a train run (before the pack's ``setup`` hook, after its
        ``teardown``, once ``engine.run`` returned) and after an error ended the run."""
        engine = engine if engine is not None else self._engine
        if engine is None or self._storage is None:
            raise RuntimeError(
                "Checkpoint.save() saves a train run under way, from one of its hooks (after "
                "this pack's setup hook, before its teardown hook); no run of this pack is "
                "under way. The newest checkpoint a run saved is checkpoint.last_path"
            )
        error = engine.state.error
        if error is not None and not isinstance(error, Interrupted):
            raise RuntimeError(
                f"Checkpoint.save(): the run failed ({error!r}), so its state may be half a "
                f"step's; nothing is saved (the newest checkpoint is {self.last_path})"
            )
        if not self._writes_here(engine):
            return None
        counters = engine.counters_now()
        return None if counters is None else self._write(engine, counters)

    def _save_scheduled(self, engine: Any) -> Path | None:
        """``every=``'s save: after the step, or the epoch (where it cut short: where it
        stopped); a step's that falls on its epoch's last step waits for the epoch's end
        (``save_at_epoch_end``)."""
        if not self._writes_here(engine):
            return None
        counters = engine.counters_now()
        if counters is None:
            return None
        if self.every.unit != "ep" and engine.epoch_drawn(counters):
            self._at_epoch_end = True  # the epoch's last step: its end is the moment
            return None
        return self._write(engine, counters)

    def save_at_epoch_end(self, engine: Any) -> Path | None:
        """The save of a step that was its epoch's last, taken at the epoch's end (after
        its ``epoch_end`` hooks, as ``every="1ep"``'s): a run resumed from it starts the
        next epoch and never ends this one twice (``docs/runs.md``)."""
        if not self._at_epoch_end:
            return None
        self._at_epoch_end = False
        if not self._writes_here(engine):
            return None
        # an epoch cut short after its last step (an interrupt): where it stopped
        counters = engine.counters_now()
        return None if counters is None else self._write(engine, counters)

    def wait(self) -> None:
        """Wait until the checkpoint being written in the background (``async_save``) is
        on disk; raise the error that writing it met, naming the file."""
        if self._writer is None:
            return
        try:
            self._writer.wait()
        except Exception:  # not on disk: the newest are the ones before it
            if self._rollback is not None:
                self.saved, self.best_saved = self._rollback
            self._rollback = None
            raise
        self._rollback = None

    def _write(self, engine: Any, counters: dict[str, int]) -> Path | None:
        """Save now (or start saving in the background) where ``counters`` say a run
        resumed from it starts; then (once it is on disk) record the best-K and delete
        the checkpoints neither kept nor best."""
        started = time.perf_counter()
        self.wait()  # at most one write under way
        storage = self._storage
        assert storage is not None
        if storage.leads:  # what writers killed mid-save left behind (a live one's stays)
            remove_stale(self.directory)
        s = engine.state
        epoch, step = counters.get("epoch", s.epoch), counters.get("step", s.step)
        name = storage.name(epoch, step)
        previous, previous_best = self.saved, self.best_saved
        path = self.directory / name
        try:
            # the lists saved inside the checkpoint already hold the checkpoint itself, so
            # a run resumed from it prunes it in its turn
            kept = [n for n in previous if n != name] + [name]
            self.saved = kept if self.keep is None else kept[-self.keep :] if self.keep else []
            best = self._rank_best(storage, s, epoch, step)
            if best is None and not self.saved:  # keep=0, not a new best: nothing to keep
                self.saved, self.best_saved = previous, previous_best
                return None
            # deleted only once the new one is on disk: what is neither kept nor best (the
            # new one too, when keep=0 keeps the best alone and it is not among them)
            old = {*previous, *(n for _, n in previous_best), name} - {
                *self.saved,
                *(n for _, n in self.best_saved),
            }
            # sharded: each process sees its shards alone; they refuse together (a writer
            # that checks the copy it makes refuses in submit instead: the parameters are
            # read once)
            if self._writer is None or not self._writer.checks_finite:
                check_finite_parameters(engine, epoch, step, storage.group)
            finish = _Finish(
                storage,
                path,
                None if best is None else self.directory / best,
                self._ranking(),
                [self.directory / n for n in sorted(old)],
            )
            for cost in _COSTS:  # a save's cost is no state of the training: never saved
                s.metrics.pop(cost, None)
            writer = self._writer
            # a writer that takes the model's state from its live module and optimizer
            # itself (the plain one, planned once: no state_dict() built at each save);
            # a storage that writes the model's state leaves it out of any snapshot
            parts = None
            if writer is not None and not storage.writes_model_state and writer.writes_model_state:
                parts = state_parts(engine.model)
            snapshot = engine.snapshot(counters, model_state=parts is None)
            if writer is not None:
                writer.submit(path, snapshot, finish, module_of(engine), model_parts=parts)
                self._rollback = (previous, previous_best)
                self._record_stall(s, time.perf_counter() - started)
                return path
            storage.save(path, snapshot, finish)
        except BaseException:
            self.saved, self.best_saved = previous, previous_best
            raise
        return path

    def _record_stall(self, state: Any, stall: float) -> None:
        """What this async save cost the training, and the least it could have."""
        state.metrics["checkpoint_stall_s"] = stall
        floor = None if self._writer is None else self._writer.floor_s
        if floor is not None:  # a writer that measures its copy
            state.metrics["checkpoint_floor_s"] = floor

    def _rank_best(self, storage: Storage, state: Any, epoch: int, step: int) -> str | None:
        """Put this checkpoint among the best by the metric; its best name if it is."""
        if self.best is None or self._ranker is None:
            return None
        metric, mode = self.best
        value = read_metric(state, metric)
        if value is None:
            raise ValueError(
                f"Checkpoint(best=({metric!r}, {mode!r})): no metric {metric!r} in "
                f"engine.state.metrics at epoch {epoch}, step {step}; there are: "
                f"{', '.join(sorted(state.metrics)) or 'none'} (attach an Evaluate "
                f"pack, or name one of these)"
            )
        value = float(value)
        if not math.isfinite(value):  # NaN sorts anywhere: never the best
            return None
        name = storage.best_name(metric, value, epoch, step)
        if self.baseline is not None:  # what was measured before the first step
            first = self._ranker.best_first([(self.baseline, ""), (value, name)])[0]
            if first[1] != name:  # not better than the baseline (a tie keeps it)
                return None
        # an equal value keeps the older first
        self.best_saved = self._ranker.best_first([*self.best_saved, (value, name)], self.keep_best)
        return name if (value, name) in self.best_saved else None

    def _ranking(self) -> dict[str, Any] | None:
        """The best-K as a record: the metric, its direction, the names and values."""
        if self.best is None:
            return None
        return {
            "metric": self.best[0],
            "mode": self.best[1],
            "best": [{"checkpoint": n, "value": v} for v, n in self.best_saved],
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "saved": list(self.saved),
            "best_saved": [[value, name] for value, name in self.best_saved],
            "baseline": self.baseline,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.saved = list(state.get("saved", []))
        self.best_saved = [(float(value), str(name)) for value, name in state.get("best_saved", [])]
        baseline = state.get("baseline")
        self.baseline = None if baseline is None else float(baseline)


class _Finish:
    """Once a checkpoint is on disk (called where the storage leads): the best-K are
    recorded, then the checkpoints it replaces go."""

    __slots__ = ("best", "old", "path", "ranking", "storage")

    def __init__(
        self,
        storage: Storage,
        path: Path,
        best: Path | None,
        ranking: dict[str, Any] | None,
        old: list[Path],
    ) -> None:
        self.storage, self.path, self.best, self.ranking, self.old = (
            storage,
            path,
            best,
            ranking,
            old,
        )

    def __call__(self) -> None:
        self.storage.mark_best(self.path, self.best, self.ranking)
        for old in self.old:
            self.storage.remove(old)

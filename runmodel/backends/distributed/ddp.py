"""``DistributedDataParallel`` in processes started by torchrun (``runmodel run SOURCE
--nproc-per-node N``, or ``torchrun ... script.py`` with ``backend="ddp"``).

For the run, the backend joins the processes into torch.distributed's default group
(from torchrun's environment: gloo on the CPU, nccl on CUDA, one GPU a process), wraps the
model's module in ``DistributedDataParallel``, and deals out the data: the training
``DataLoader`` is made again with the settings it was made with but a
``DistributedSampler`` (one seed for every process, ``set_epoch`` at each epoch's start,
so a resumed run draws the same shards), and the eval data is split without padding, so
that metrics (pytorch-ignite's, which add up across processes) are those of the whole
set. When the run ends the model, its data and the process group are as they were.

How a run ends (``docs/distributed.md``, "How a run ends"): at a normal end every process
checks, with a bounded wait and no collective, that every other one ended at the same
step (``EndAgreement``: marks in the group's store), then tears down; a failed run never
waits. Before the backend makes a process group it imports the torch
modules that capture the default group in their functions' default arguments when
imported while one exists (``torch.distributed.nn.functional``,
``torch.distributed.optim``): imported later (by DDP itself, or by ignite), they keep the
destroyed group alive, its gloo worker threads live on into the interpreter's exit, and
one that releases its last collective's tensors then aborts the process
(``terminate called without an active exception``).
"""

from __future__ import annotations

import datetime
import importlib
import inspect
import itertools
import json
import os
import sys
import time
import traceback
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
)

from ...core import FineTuneSpec, Hook, HookOptions, Pack
from ...models import unwrap
from ..base import Backend

__all__ = ["DDP", "TORCHRUN_VARIABLES", "record_failure", "shard_eval_data", "shard_train_data"]

#: What torchrun sets in each process it starts (``init_method="env://"`` reads them).
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")

#: torch modules whose functions take the default process group as a default argument,
#: evaluated on import: imported before the group exists, they hold None instead of it.
GROUP_CAPTURING_MODULES = ("torch.distributed.nn.functional", "torch.distributed.optim")

#: Runs in this process that used a process group: each run's end marks have keys of
#: their own in the group's store (every process runs the same runs, in the same order).
_run_numbers = itertools.count()


class DDP(Backend):
    """Data-parallel training over the processes torchrun started.

    ``process_group`` is torch.distributed's backend (default: ``"nccl"`` when the model
    is on CUDA, else ``"gloo"``); ``timeout`` (seconds) bounds how long a collective waits
    for a process that stopped answering without exiting. ``seed`` is the training
    sampler's seed (default: drawn by process 0 from the training loader's generator, or
    torch's, and shared; a checkpoint keeps it). ``shard_data=False`` leaves the model's
    data alone, for data that every process already reads its own part of.
    ``ddp_options`` go to ``DistributedDataParallel`` (``find_unused_parameters``,
    ``broadcast_buffers``, ``gradient_as_bucket_view``...). ``end_timeout`` (seconds)
    bounds how long a process whose run ends (or whose epoch a ``stop()`` cut short)
    waits for the others to end at the same step; one that does not (a ``stop()`` on some
    processes only) fails the run. Raise it if rank 0's last checkpoint takes longer.

    If the default process group exists already (a script made it), the backend uses it
    and leaves it; otherwise it makes it for the run and destroys it at the run's end.
    """

    def __init__(self, process_group: str | None = None, timeout: float | None = None,
                 seed: int | None = None, shard_data: bool = True,
                 ddp_options: dict[str, Any] | None = None, end_timeout: float = 60.0,
                 **options: Any) -> None:
        super().__init__(**options)
        who = type(self).__name__
        if process_group is not None and process_group not in ("gloo", "nccl", "mpi"):
            raise ValueError(f"{who}(process_group={process_group!r}): give 'gloo' (CPU), 'nccl' "
                             f"(CUDA), 'mpi', or None to choose by the model's device")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(
                timeout, (int, float)) or timeout <= 0):
            raise ValueError(f"{who}(timeout={timeout!r}): give seconds > 0, or None for "
                             f"torch's default")
        if isinstance(end_timeout, bool) or not isinstance(end_timeout, (int, float)) or (
                end_timeout <= 0):
            raise ValueError(f"{who}(end_timeout={end_timeout!r}): give the seconds a process "
                             f"that ended waits for the others to end too (> 0)")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"{who}(seed={seed!r}): give a whole number, or None to draw one")
        if not isinstance(shard_data, bool):
            raise TypeError(f"{who}(shard_data=) takes True or False, got {shard_data!r}")
        if ddp_options is not None and not isinstance(ddp_options, dict):
            raise TypeError(f"{who}(ddp_options=) takes a dict of DistributedDataParallel "
                            f"arguments, got {ddp_options!r}")
        if not dist.is_available():
            raise RuntimeError(f"the {self.backend_name} backend needs torch.distributed, which "
                               f"this build of torch ({torch.__version__}) does not have")
        if not dist.is_initialized():
            missing = [name for name in TORCHRUN_VARIABLES if name not in os.environ]
            if missing:
                raise RuntimeError(
                    f"the {self.backend_name} backend runs in processes started by torchrun, and "
                    f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set: "
                    f"start the run with `runmodel run SOURCE --nproc-per-node N` or "
                    f"`torchrun --nproc-per-node N script.py` (or make the default process "
                    f"group yourself first)")
        self.process_group, self.timeout, self.seed = process_group, timeout, seed
        self.end_timeout = float(end_timeout)
        self.shard_data = shard_data
        self.ddp_options = dict(ddp_options or {})
        self._pack: DistributedRun | None = None

    #: The backend's name, in messages.
    backend_name = "ddp"

    def initialize(self, model: Any, spec: FineTuneSpec) -> None:
        super().initialize(model, spec)
        module = getattr(model, "module", None)
        if not isinstance(module, torch.nn.Module):
            raise ValueError(f"the {self.backend_name} backend wraps "
                             f"{type(model).__name__}.module, and it is "
                             f"{type(module).__name__}, not a torch.nn.Module")
        device = model_device(model)
        owned = not dist.is_initialized()
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            torch.cuda.set_device(device)  # one GPU a process, whatever the model chose
        if owned:
            for name in GROUP_CAPTURING_MODULES:  # before the group exists: see the docstring
                importlib.import_module(name)
            timeout = None if self.timeout is None else datetime.timedelta(seconds=self.timeout)
            backend = self.process_group or ("nccl" if device.type == "cuda" else "gloo")
            dist.init_process_group(backend, timeout=timeout,
                                    device_id=device if backend == "nccl" else None)
        _sync_ignite()  # ignite's metrics then add up across the processes
        run = self._run(model, module, owned)
        self._pack = run
        try:
            if device.type == "cuda" and hasattr(model, "device"):
                model.device = device
            inner = unwrap(module)
            assert inner is not None
            inner.to(device)
            self._wrap(model, inner, device)
            if self.shard_data:
                run.shard(self.seed)
        except BaseException:
            run.restore()
            raise

    def _run(self, model: Any, module: torch.nn.Module, owned: bool) -> DistributedRun:
        """The backend's pack for this run."""
        return DistributedRun(model, module, owned, self.end_timeout)

    def _wrap(self, model: Any, inner: torch.nn.Module, device: torch.device) -> None:
        """Make ``model.module`` (``inner``, on ``device``) distributed."""
        ids = [device.index] if device.type == "cuda" else None
        # DDP's constructor is a collective: every process gives process 0's weights
        model.module = DistributedDataParallel(inner, device_ids=ids, output_device=(
            None if ids is None else ids[0]), **self.ddp_options)

    def pack(self) -> Pack | None:
        return self._pack


class DistributedRun(Pack):
    """The ``ddp`` backend's part of a run: ``set_epoch`` at each epoch's start, the
    sampler's seed in checkpoints, the processes' agreement that they ended together,
    and everything put back at the end (last of all teardown hooks). No collective runs
    at the end: the agreement goes through the group's store, with a bounded wait, and
    only when this process ended normally."""

    name = "ddp"
    #: Whether the processes agree at the start of teardown (before the teardown hooks:
    #: a final save is collective under fsdp) rather than at its end.
    agree_first = False

    def __init__(self, model: Any, module: torch.nn.Module, owned: bool,
                 end_timeout: float = 60.0) -> None:
        self.model, self.module, self.owned = model, module, owned
        self.device = getattr(model, "device", None)
        self.sampler: DistributedSampler[Any] | None = None
        self.data: dict[str, Any] = {}  # attribute -> the model's own data, put back after
        self.ending = EndAgreement(end_timeout)

    def shard(self, seed: int | None) -> None:
        model, rank, world = self.model, dist.get_rank(), dist.get_world_size()
        train = getattr(model, "train_data", None)
        if train is not None:
            if seed is None:
                seed = shared_seed(getattr(train, "generator", None))
            sharded = shard_train_data(train, rank, world, seed)
            self.data["train_data"] = train
            model.train_data = sharded
            sampler = getattr(sharded, "sampler", None)
            self.sampler = sampler if isinstance(sampler, DistributedSampler) else None
        for name in ("eval_data",):
            data = getattr(model, name, None)
            if data is not None:
                self.data[name] = data
                setattr(model, name, shard_eval_data(data, rank, world))

    def hooks(self) -> Iterator[Hook]:
        if self.sampler is not None:
            # first, before any hook that could draw from the epoch's data
            yield Hook(self.epoch_start, "epoch_start", HookOptions.of(
                priority=1000, name="ddp.set_epoch"))
        # first: before a rank-0 checkpoint, or an evaluation's collective
        for phase in ("epoch_start", "epoch_end"):
            yield Hook(getattr(self.ending, phase), phase, HookOptions.of(
                priority=10_000, name=f"ddp.{phase}_mark"))
        yield Hook(self.failed, "exception", HookOptions.of(priority=10_000, name="ddp.failed"))
        if self.agree_first:  # before the teardown hooks, whose saves talk to the others
            yield Hook(self.agree, "teardown", HookOptions.of(priority=10_000,
                                                              name=f"{self.name}.agree"))
        yield Hook(self.teardown, "teardown", HookOptions.of(priority=-10_000,
                                                             name=f"{self.name}.teardown"))

    def failed(self, engine: Any) -> None:
        # first of all: the processes this one's failure brings down fail later, so the
        # launcher can tell which failure came first
        error = engine.state.error
        if error is not None:
            record_failure(error)
            first = self.ending.failed(error)
            if first is not None:
                error.add_note(f"runmodel: rank {first[0]} failed first: {first[1]}")

    def epoch_start(self, engine: Any) -> None:
        assert self.sampler is not None
        self.sampler.set_epoch(engine.state.epoch)

    def agree(self, engine: Any) -> None:
        """At a normal end, that every process ended here too; a failure never waits."""
        if engine.state.error is None:
            self.ending.agree(engine.state)

    def teardown(self, engine: Any) -> None:
        try:
            if not self.agree_first:
                self.agree(engine)
        finally:
            self.restore()

    def restore(self) -> None:
        """The model's module and data as they were; the process group gone if the
        backend made it. Local work only: a peer may have failed."""
        model = self.model
        for name, data in self.data.items():
            setattr(model, name, data)
        self.data = {}
        if isinstance(model.module, DistributedDataParallel):
            model.module = self.module
        if self.device is not None and hasattr(model, "device"):
            model.device = self.device
        if self.owned and dist.is_initialized():
            self.owned = False
            dist.destroy_process_group()
            _sync_ignite()

    def state_dict(self) -> dict[str, Any]:
        return {} if self.sampler is None else {"seed": int(self.sampler.seed)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # a resumed run shuffles as the run it continues, epoch by epoch
        if self.sampler is not None and "seed" in state:
            self.sampler.seed = int(state["seed"])


class EndAgreement:
    """That the processes end a run together, found without a collective. Each leaves a
    mark in the process group's store as it goes: ``start``/``end`` of each epoch and,
    at a normal end, ``done`` (with the epoch and step). Two waits, each at most
    ``timeout`` seconds:

    - an epoch cut short (``stop()``, the budget) waits, before its end hooks (which may
      talk to the others: an evaluation), until every process ended it at the same step;
    - a normal end waits until every process is done at the same step.

    A process found further on (in a later epoch) shows a ``stop()`` that the others did
    not reach: that fails at once, as a timeout does. The ranks are in step (every step
    all-reduces), so the waits are short: a rank-0 checkpoint written at the last step or
    epoch end is the longest of them."""

    __slots__ = ("_last", "_prefix", "_store", "timeout")

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._store: Any = None
        self._last: tuple[str, int, int] | None = None  # this process's last mark
        self._prefix = f"runmodel/run{next(_run_numbers)}/at"

    def epoch_start(self, engine: Any) -> None:
        self._mark("start", engine.state.epoch, engine.state.step)

    def epoch_end(self, engine: Any) -> None:
        s = engine.state
        self._mark("end", s.epoch, s.step)
        if not s.epoch_complete:
            self._wait({"end", "done"}, s)

    def agree(self, state: Any) -> None:
        """At a normal end: mark done, wait until every process is done there too."""
        if self._last is None or not dist.is_initialized():
            return  # no epoch began: no step ran that could leave the others behind
        _, epoch, step = self._last
        self._mark("done", epoch, step)
        self._wait({"done"}, state)

    def failed(self, error: BaseException) -> tuple[int, str] | None:
        """Record this process's failure in the store; the failure of another process
        recorded before it, if any, as (rank, what), the one this may follow from. Local
        work and one store call each way: a peer may be gone."""
        try:
            store = self._store or dist.distributed_c10d._get_default_store()
            rank = dist.get_rank()
            store.set(f"{self._prefix}/failed/{rank}", f"{time.time()!r} "
                      f"{type(error).__name__}: {str(error).splitlines()[0][:300]}")
            first = None
            for other in range(dist.get_world_size()):
                key = f"{self._prefix}/failed/{other}"
                if other != rank and store.check([key]):
                    at, what = store.get(key).decode().split(" ", 1)
                    if first is None or float(at) < first[0]:
                        first = (float(at), other, what)
        except Exception:  # the store went with a failed process: nothing to learn
            return None
        return None if first is None else (first[1], first[2])

    def _mark(self, kind: str, epoch: int, step: int) -> None:
        if self._store is None:
            # the group's own store (torchrun's, or the script's), which every process
            # reaches; private in name, in torch for years
            self._store = dist.distributed_c10d._get_default_store()
        self._last = (kind, epoch, step)
        self._store.set(f"{self._prefix}/{dist.get_rank()}", f"{kind} {epoch} {step}")

    def _wait(self, kinds: set[str], state: Any) -> None:
        assert self._last is not None
        _, epoch, step = self._last
        rank, world = dist.get_rank(), dist.get_world_size()
        others = [r for r in range(world) if r != rank]
        deadline = time.monotonic() + self.timeout
        while True:
            marks = {r: self._read(r) for r in others}
            behind = [r for r, m in marks.items()
                      if m is None or m[0] not in kinds or m[1:] != (epoch, step)]
            if not behind:
                return
            if time.monotonic() >= deadline or any(
                    m is not None and m[1:] > (epoch, step) for m in marks.values()):
                break
            time.sleep(0.01)
        where = ", ".join(f"rank {r} " + _where(marks[r]) for r in behind)
        raise RuntimeError(
            f"rank {rank} ended its run ({'stopped' if state.ended is None else state.ended}"
            f") at step {step}, and the others did not end with it within {self.timeout:g} s "
            f"({where}): a stop() that some processes reach and others do not; decide to "
            f"stop from values every process has (a reduced metric, the counters), or "
            f"raise end_timeout= (DDP, FSDP) if the others were only slow")

    def _read(self, rank: int) -> tuple[str, int, int] | None:
        key = f"{self._prefix}/{rank}"
        if not self._store.check([key]):
            return None
        kind, epoch, step = self._store.get(key).decode().split()
        return kind, int(epoch), int(step)


def _where(mark: tuple[str, int, int] | None) -> str:
    if mark is None:
        return "had not begun an epoch"
    kind, epoch, step = mark
    return {"start": f"was in epoch {epoch}, begun at step {step}",
            "end": f"was ending epoch {epoch} at step {step}",
            "done": f"ended at step {step}"}[kind]


def record_failure(error: BaseException) -> None:
    """In a process torchrun started: write why it failed where torchrun's launcher reads
    it (``$TORCHELASTIC_ERROR_FILE``, as ``torch.distributed.elastic``'s ``@record``
    does), with the time to the microsecond, so that the launcher can tell the first
    failure from those it caused. The first record of a process stands."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or os.path.exists(path):
        return
    now = time.time()
    data = {"message": {"message": f"{type(error).__name__}: {error}", "extraInfo": {
        "py_callstack": "".join(traceback.format_exception(error)),
        "timestamp": str(int(now)), "runmodel_time": now}}}
    temporary = f"{path}.tmp{os.getpid()}"
    with open(temporary, "w") as file:
        json.dump(data, file)
    os.replace(temporary, path)


def model_device(model: Any) -> torch.device:
    device = getattr(model, "device", None)
    if isinstance(device, (str, torch.device)):
        return torch.device(device)
    parameter = next(model.module.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def shared_seed(generator: torch.Generator | None) -> int:
    """One seed for every process: each draws one (from ``generator``, or torch's), so
    that their generators stay alike; process 0's is given to all."""
    drawn = int(torch.randint(0, 2**62, (), dtype=torch.int64, generator=generator))
    box: list[Any] = [drawn]
    dist.broadcast_object_list(box, src=0)
    return int(box[0])


def _sync_ignite() -> None:
    """ignite keeps its own view of the distributed context: bring it up to date. Not
    imported yet, it reads the context when first asked (importing it costs seconds)."""
    idist = sys.modules.get("ignite.distributed")
    if idist is not None:
        idist.sync()


# -- data ------------------------------------------------------------------------------------

#: DataLoader arguments that are not copied to the loader made again.
_NOT_COPIED = frozenset({"self", "dataset", "shuffle", "sampler", "batch_sampler"})


def shard_train_data(data: Any, rank: int, world: int, seed: int) -> Any:
    """This process's part of training ``data``: a DataLoader made again with a
    ``DistributedSampler`` (shuffled if it was; padded so that every process runs as
    many steps), one with a DistributedSampler as it is, a list of batches dealt out
    (as many to each process; the rest dropped, with a warning), anything else as it is
    (with a warning: every process would read all of it)."""
    if isinstance(data, DataLoader):
        if isinstance(data.sampler, DistributedSampler):
            return data  # dealt out already
        shuffle = _was_shuffled(data, "training")
        sampler: DistributedSampler[Any] = DistributedSampler(
            data.dataset, num_replicas=world, rank=rank, shuffle=shuffle, seed=seed)
        return _remade(data, sampler)
    if isinstance(data, (list, tuple)):
        per_rank = len(data) // world
        if per_rank * world != len(data):
            warnings.warn(f"the ddp backend deals {len(data)} training batches out to {world} "
                          f"processes: the last {len(data) - per_rank * world} are left out, "
                          f"so that every process runs as many steps", stacklevel=3)
        return type(data)(data[rank:per_rank * world:world])
    warnings.warn(f"the ddp backend cannot deal out training data of type "
                  f"{type(data).__name__}: every process reads all of it; give a DataLoader "
                  f"over a map-style dataset, a list of batches, or data that reads this "
                  f"process's part (torch.distributed.get_rank()) with DDP(shard_data=False)",
                  stacklevel=3)
    return data


def shard_eval_data(data: Any, rank: int, world: int) -> Any:
    """This process's part of eval ``data``, every sample exactly once over all the
    processes (no padding: metrics add up to those of the whole set): a DataLoader made
    again with every ``world``-th sample from ``rank`` on, a list of batches dealt out;
    anything else as it is."""
    if isinstance(data, DataLoader):
        if isinstance(data.sampler, DistributedSampler):
            return data
        _was_shuffled(data, "eval")  # checks it can be dealt out
        return _remade(data, EvalShard(len(data.dataset), rank, world))  # type: ignore[arg-type]
    if isinstance(data, (list, tuple)):
        return type(data)(data[rank::world])
    return data


class EvalShard(Sampler[int]):
    """Every ``world``-th index of ``range(size)`` from ``rank`` on, in order: the
    processes' parts differ by one sample at most, and nothing is repeated."""

    def __init__(self, size: int, rank: int, world: int) -> None:
        self.indices = range(rank, size, world)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def _was_shuffled(loader: DataLoader[Any], what: str) -> bool:
    """Whether ``loader`` shuffles; a loader that cannot be dealt out is an error here."""
    if isinstance(loader.dataset, IterableDataset):
        raise TypeError(f"the ddp backend cannot deal out {what} data from an "
                        f"IterableDataset ({type(loader.dataset).__name__}); have it yield "
                        f"this process's part (torch.distributed.get_rank()) and use "
                        f"DDP(shard_data=False)")
    if type(loader).__init__ is not DataLoader.__init__:
        raise TypeError(f"the ddp backend makes the {what} DataLoader again with a "
                        f"DistributedSampler, and {type(loader).__name__} has its own "
                        f"__init__; give a plain DataLoader, or one with a DistributedSampler")
    batch_sampler = loader.batch_sampler
    if batch_sampler is not None and type(batch_sampler) is not BatchSampler:
        raise TypeError(f"the {what} DataLoader has its own batch_sampler "
                        f"({type(batch_sampler).__name__}), which the ddp backend cannot deal "
                        f"out; give it a DistributedSampler yourself, or DDP(shard_data=False)")
    sampler = loader.sampler
    if isinstance(sampler, RandomSampler):
        if sampler.replacement or sampler._num_samples is not None:
            raise TypeError(f"the {what} DataLoader's RandomSampler draws with replacement or "
                            f"a set number of samples, which a DistributedSampler cannot; "
                            f"give it a DistributedSampler yourself, or DDP(shard_data=False)")
        return True
    if isinstance(sampler, SequentialSampler):
        return False
    raise TypeError(f"the {what} DataLoader has its own sampler ({type(sampler).__name__}), "
                    f"which the ddp backend cannot deal out; give it a DistributedSampler "
                    f"yourself, or DDP(shard_data=False)")


def _remade(loader: DataLoader[Any], sampler: Sampler[Any]) -> DataLoader[Any]:
    """``loader`` made again with every setting it was made with, and ``sampler``."""
    settings = {name: getattr(loader, name) for name in _loader_arguments()
                if name not in _NOT_COPIED and hasattr(loader, name)}
    return DataLoader(loader.dataset, sampler=sampler, **settings)


def _loader_arguments() -> Sequence[str]:
    return list(inspect.signature(DataLoader.__init__).parameters)

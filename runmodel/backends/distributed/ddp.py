"""``DistributedDataParallel`` in processes started by torchrun (``runmodel run SOURCE
--nproc-per-node N``, or ``torchrun ... script.py`` with ``backend="ddp"``).

For the run, the backend joins the processes into torch.distributed's default group
(``env.make_group``: from torchrun's environment, gloo on the CPU, nccl on CUDA, one GPU
a process; a group made once lives on for the process's later runs), wraps the model's
module in ``DistributedDataParallel``, and deals out the data (``data.py``): the
training ``DataLoader`` is made again with a ``DistributedSampler`` (one seed for every
process, ``set_epoch`` at each epoch's start, so a resumed run draws the same shards),
and the eval data is split without padding. When the run ends the model has its own
module and data back.

How a run ends (``docs/distributed.md``, "How a run ends"): at a normal end every process
checks, with a bounded wait and no collective, that every other one ended at the same
step (``agreement.py``: marks in the group's store), then tears down; a failed run never
waits, and records its failure for the launcher (``failures.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

from ...core import FineTuneSpec, Hook, HookOptions, Pack
from ...models import unwrap
from ..base import Backend
from . import env
from .agreement import EndAgreement
from .data import shard_eval_data, shard_train_data
from .failures import record_failure

__all__ = ["DDP", "DistributedRun", "model_device", "shared_seed"]


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

    If the default process group exists already (an earlier run made it, or the script),
    the backend uses it; otherwise it makes it, and the group lives on after the run (the
    trained model can be evaluated, or its weights gathered, in the same script) until
    the process exits or ``runmodel.end_distributed()`` ends it. A group the script made
    is the script's to end.
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
        if not torch.distributed.is_available():
            raise RuntimeError(f"the {self.backend_name} backend needs torch.distributed, which "
                               f"this build of torch ({torch.__version__}) does not have")
        if not env.has_group():
            missing = env.missing_variables()
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
        if device.type == "cuda":
            device = torch.device("cuda", env.local_rank())
            torch.cuda.set_device(device)  # one GPU a process, whatever the model chose
        if not env.has_group():  # made once, for this run and the process's later ones
            env.make_group(self.process_group or ("nccl" if device.type == "cuda" else "gloo"),
                           self.timeout, device)
        env.sync_ignite()  # ignite's metrics then add up across the processes
        run = self._run(model, module)
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

    def _run(self, model: Any, module: torch.nn.Module) -> DistributedRun:
        """The backend's pack for this run."""
        return DistributedRun(model, module, self.end_timeout)

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
    def __init__(self, model: Any, module: torch.nn.Module, end_timeout: float = 60.0) -> None:
        self.model, self.module = model, module
        self.device = getattr(model, "device", None)
        self.sampler: DistributedSampler[Any] | None = None
        self.data: dict[str, Any] = {}  # attribute -> the model's own data, put back after
        self.ending = EndAgreement(end_timeout)

    def shard(self, seed: int | None) -> None:
        model, rank, world = self.model, env.rank(), env.world_size()
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
        # first of the teardown hooks: a final save under fsdp and the run folder's final
        # evaluation are collectives, which need every process to have ended normally
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
        self.restore()

    def restore(self) -> None:
        """The model's module and data as they were. Local work only: a peer may have
        failed. The process group stays, for the script's later runs and collectives
        (an evaluation, gathering the weights): ``runmodel.end_distributed()`` or the
        process's exit ends it."""
        model = self.model
        for name, data in self.data.items():
            setattr(model, name, data)
        self.data = {}
        if isinstance(model.module, DistributedDataParallel):
            model.module = self.module
        if self.device is not None and hasattr(model, "device"):
            model.device = self.device

    def state_dict(self) -> dict[str, Any]:
        return {} if self.sampler is None else {"seed": int(self.sampler.seed)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # a resumed run shuffles as the run it continues, epoch by epoch
        if self.sampler is not None and "seed" in state:
            self.sampler.seed = int(state["seed"])


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
    return int(env.broadcast_from_0(drawn))

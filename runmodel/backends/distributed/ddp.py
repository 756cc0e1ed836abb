"""``DistributedDataParallel`` in processes started by torchrun (``runmodel run SOURCE
--nproc-per-node N``, or ``torchrun ... script.py`` with ``backend="ddp"``).

For the run, the backend joins the processes into torch.distributed's default group
(``env.make_group``: from torchrun's environment, gloo on the CPU, nccl on CUDA, one GPU
a process; a group made once lives on for the process's later runs), wraps the model's
module in ``DistributedDataParallel``, and deals out the data (``data.py``, with
``data.py``): the training ``DataLoader`` is made again with a ``DistributedSampler``
(one seed for every process, ``set_epoch`` at each epoch's start, so a resumed run draws
the same shards), and the eval data is split without padding. When the run ends the
model has its own module and data back.

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

from ...core import Hook, HookOptions, Interrupted, Pack, RunHorizon
from ...models import unwrap
from ..base import Backend
from . import env
from .agreement import EndAgreement
from .data import Dealer, shared_seed
from .failures import record_failure
from .options import DDPOptions
from .stopping import REQUEST, StopCheck

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
    ``preempt_check_every`` (steps) is how often the processes check, together, whether
    any of them was sent Ctrl-C or a preemption signal, so that all stop after the same
    step and save it (``docs/distributed.md``, "Preemption: stopping together"): a smaller
    number stops sooner after the signal, for one tiny all-reduce more per that many steps.

    If the default process group exists already (an earlier run made it, or the script),
    the backend uses it; otherwise it makes it, and the group lives on after the run (the
    trained model can be evaluated, or its weights gathered, in the same script) until
    the process exits or ``runmodel.end_distributed()`` ends it. A group the script made
    is the script's to end.

    The options are declared, each with what it means, and checked together in
    ``options.DDPOptions``.
    """

    def __init__(
        self,
        process_group: str | None = None,
        timeout: float | None = None,
        seed: int | None = None,
        shard_data: bool = True,
        ddp_options: dict[str, Any] | None = None,
        end_timeout: float = 60.0,
        preempt_check_every: int = 10,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        checked = DDPOptions(
            owner=type(self).__name__,
            process_group=process_group,
            timeout=timeout,
            seed=seed,
            shard_data=shard_data,
            ddp_options=ddp_options,
            end_timeout=end_timeout,
            preempt_check_every=preempt_check_every,
        )
        self._require_torchrun()
        self.process_group = checked.process_group
        self.timeout = checked.timeout
        self.seed = checked.seed
        self.end_timeout = checked.end_timeout
        self.preempt_check_every = checked.preempt_check_every
        self.shard_data = checked.shard_data
        self.ddp_options: dict[str, Any] = checked.ddp_options or {}
        self._pack: DistributedRun | None = None

    #: The backend's name, in messages.
    backend_name = "ddp"

    def _require_torchrun(self) -> None:
        """Refuse a process torchrun did not start (unless the default group exists)."""
        if not torch.distributed.is_available():
            raise RuntimeError(
                f"the {self.backend_name} backend needs torch.distributed, which "
                f"this build of torch ({torch.__version__}) does not have"
            )
        if not env.has_group():
            missing = env.missing_variables()
            if missing:
                raise RuntimeError(
                    f"the {self.backend_name} backend runs in processes started by torchrun, and "
                    f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set: "
                    f"start the run with `runmodel run SOURCE --nproc-per-node N` or "
                    f"`torchrun --nproc-per-node N script.py` (or make the default process "
                    f"group yourself first)"
                )

    def initialize(self, model: Any, spec: RunHorizon) -> None:
        super().initialize(model, spec)
        module = getattr(model, "module", None)
        if not isinstance(module, torch.nn.Module):
            raise ValueError(
                f"the {self.backend_name} backend wraps "
                f"{type(model).__name__}.module, and it is "
                f"{type(module).__name__}, not a torch.nn.Module"
            )
        device = model_device(model)
        if device.type == "cuda":
            device = torch.device("cuda", env.local_rank())
            torch.cuda.set_device(device)  # one GPU a process, whatever the model chose
        if not env.has_group():  # made once, for this run and the process's later ones
            env.make_group(
                self.process_group or ("nccl" if device.type == "cuda" else "gloo"),
                self.timeout,
                device,
            )
        env.sync_ignite()  # ignite's metrics then add up across the processes
        run = self._run(model, module)
        self._pack = run
        try:
            run.stop_check = StopCheck(env.gloo_group("stop"))
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
        return DistributedRun(model, module, self.end_timeout, self.preempt_check_every)

    def _wrap(self, model: Any, inner: torch.nn.Module, device: torch.device) -> None:
        """Make ``model.module`` (``inner``, on ``device``) distributed."""
        ids = [device.index] if device.type == "cuda" else None
        # DDP's constructor is a collective: every process gives process 0's weights
        model.module = DistributedDataParallel(
            inner,
            device_ids=ids,
            output_device=(None if ids is None else ids[0]),
            **self.ddp_options,
        )

    def pack(self) -> Pack | None:
        return self._pack


class DistributedRun(Pack):
    """The ``ddp`` backend's part of a run: its data (a ``Dealer``: dealt out, ``set_epoch``
    at each epoch's start, where the epoch stands in checkpoints, put back at the end),
    and the run's distributed lifecycle: one run record for every process, the check that
    stops every process at one step after a signal (``stopping.py``), the processes'
    agreement that they ended together, and everything put back at the end (last of all
    teardown hooks). No collective runs at the end: the agreement goes through the
    group's store, with a bounded wait, and only when this process ended normally (or
    stopped with the others at a check)."""

    name = "ddp"

    def __init__(
        self, model: Any, module: torch.nn.Module, end_timeout: float = 60.0, check_every: int = 10
    ) -> None:
        self.model, self.module = model, module
        self.device = getattr(model, "device", None)
        self.dealer = Dealer(model, self.name)
        self.ending = EndAgreement(end_timeout)
        self.check_every = check_every
        self.stop_check: StopCheck | None = None  # made once the group exists
        self.checking = True
        REQUEST.checks += 1  # a signal now waits for this run's check

    def shard(self, seed: int | None) -> None:
        """Deal the model's data out to the processes (``seed``: the training sampler's,
        None to draw one for all)."""
        self.dealer.shard(seed)

    def hooks(self) -> Iterator[Hook]:
        # first: before any hook that could draw from the epoch's data
        yield Hook(
            self.dealer.epoch_start,
            "epoch_start",
            HookOptions.of(priority=1000, name=f"{self.name}.set_epoch"),
        )
        yield Hook(
            self.setup,
            "setup",
            HookOptions.of(priority=1000, modes="train", name=f"{self.name}.setup"),
        )
        if self.stop_check is not None:  # every process stops at one step after a signal
            yield Hook(
                self.check_stop,
                "runstep",
                HookOptions.of(
                    every=self.check_every,
                    modes="train",
                    priority=5000,
                    name=f"{self.name}.stop_check",
                ),
            )
        # first: before a rank-0 checkpoint, or an evaluation's collective
        for phase in ("epoch_start", "epoch_end"):
            yield Hook(
                getattr(self.ending, phase),
                phase,
                HookOptions.of(priority=10_000, name=f"{self.name}.{phase}_mark"),
            )
        yield Hook(
            self.failed, "exception", HookOptions.of(priority=10_000, name=f"{self.name}.failed")
        )
        # first of the teardown hooks: a final save under fsdp and the run folder's final
        # evaluation are collectives, which need every process to have ended normally
        yield Hook(
            self.agree, "teardown", HookOptions.of(priority=10_000, name=f"{self.name}.agree")
        )
        yield Hook(
            self.teardown,
            "teardown",
            HookOptions.of(priority=-10_000, name=f"{self.name}.teardown"),
        )

    def check_setup(self, engine: Any) -> None:
        self.dealer.check_setup(engine)

    def setup(self, engine: Any) -> None:
        """At setup: one run record for every process (rank 0's: under ``fsdp`` each
        process writes it into its part of every checkpoint); then the data's setup (a
        run resumed in the middle of an epoch in another number of processes)."""
        record = engine.run_record
        record["id"], record["started"] = env.broadcast_from_0(
            (record.get("id"), record.get("started"))
        )
        self.dealer.setup(engine)

    def check_stop(self, engine: Any) -> None:
        assert self.stop_check is not None
        self.stop_check(engine)

    def stopped_together(self, engine: Any) -> bool:
        """Whether the run ends with an interrupt that every process took at the same
        step (the stop check's; a process alone always does): an agreed end, not a
        failure."""
        return isinstance(engine.state.error, Interrupted) and (
            not env.several() or (self.stop_check is not None and self.stop_check.fired)
        )

    def failed(self, engine: Any) -> None:
        # first of all: the processes this one's failure brings down fail later, so the
        # launcher can tell which failure came first
        error = engine.state.error
        if error is not None and not self.stopped_together(engine):
            record_failure(error)
            first = self.ending.failed(error)
            if first is not None:
                error.add_note(f"runmodel: rank {first[0]} failed first: {first[1]}")

    # -- the end ---------------------------------------------------------------------------

    def agree(self, engine: Any) -> None:
        """At a normal end (or a stop every process took at one check), that every
        process ended here too; a failure never waits."""
        if engine.state.error is None or self.stopped_together(engine):
            self.ending.agree(engine.state)

    def teardown(self, engine: Any) -> None:
        self.restore()

    def restore(self) -> None:
        """The model's module and data as they were. Local work only: a peer may have
        failed. The process group stays, for the script's later runs and collectives
        (an evaluation, gathering the weights): ``runmodel.end_distributed()`` or the
        process's exit ends it."""
        if self.checking:
            self.checking = False
            REQUEST.checks -= 1
        if self.stop_check is not None:  # no reference to a group outlives the run
            self.stop_check.group = None
        model = self.model
        self.dealer.restore()
        if isinstance(model.module, DistributedDataParallel):
            model.module = self.module
        if self.device is not None and hasattr(model, "device"):
            model.device = self.device

    def state_dict(self) -> dict[str, Any]:
        """Where the epoch under way stands, and the sampler's seed (``Dealer``)."""
        return self.dealer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dealer.load_state_dict(state)


def model_device(model: Any) -> torch.device:
    device = getattr(model, "device", None)
    if isinstance(device, (str, torch.device)):
        return torch.device(device)
    parameter = next(model.module.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")

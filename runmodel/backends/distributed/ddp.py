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

from ...core import FineTuneSpec, Hook, HookOptions, Interrupted, Pack
from ...models import unwrap
from ..base import Backend
from . import env
from .agreement import EndAgreement
from .data import Chain, DealingSampler, DealtBatches, shard_eval_data, shard_train_data
from .failures import record_failure
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
        who = type(self).__name__
        if process_group is not None and process_group not in ("gloo", "nccl", "mpi"):
            raise ValueError(
                f"{who}(process_group={process_group!r}): give 'gloo' (CPU), 'nccl' "
                f"(CUDA), 'mpi', or None to choose by the model's device"
            )
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0
        ):
            raise ValueError(
                f"{who}(timeout={timeout!r}): give seconds > 0, or None for torch's default"
            )
        if (
            isinstance(end_timeout, bool)
            or not isinstance(end_timeout, (int, float))
            or (end_timeout <= 0)
        ):
            raise ValueError(
                f"{who}(end_timeout={end_timeout!r}): give the seconds a process "
                f"that ended waits for the others to end too (> 0)"
            )
        if (
            isinstance(preempt_check_every, bool)
            or not isinstance(preempt_check_every, int)
            or preempt_check_every < 1
        ):
            raise ValueError(
                f"{who}(preempt_check_every={preempt_check_every!r}): give the "
                f"number of steps between the processes' checks for a signal "
                f"to stop at (a whole number >= 1)"
            )
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"{who}(seed={seed!r}): give a whole number, or None to draw one")
        if not isinstance(shard_data, bool):
            raise TypeError(f"{who}(shard_data=) takes True or False, got {shard_data!r}")
        if ddp_options is not None and not isinstance(ddp_options, dict):
            raise TypeError(
                f"{who}(ddp_options=) takes a dict of DistributedDataParallel "
                f"arguments, got {ddp_options!r}"
            )
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
        self.process_group, self.timeout, self.seed = process_group, timeout, seed
        self.end_timeout = float(end_timeout)
        self.preempt_check_every = preempt_check_every
        self.shard_data = shard_data
        self.ddp_options = dict(ddp_options or {})
        self._pack: DistributedRun | None = None

    #: The backend's name, in messages.
    backend_name = "ddp"

    def initialize(self, model: Any, spec: FineTuneSpec) -> None:
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
    """The ``ddp`` backend's part of a run: ``set_epoch`` at each epoch's start, the
    sampler's seed and where the epoch's data stand in checkpoints (the rest of an epoch
    begun in another number of processes dealt out anew), the check that stops every
    process at one step after a signal (``stopping.py``), the processes' agreement that
    they ended together, and everything put back at the end (last of all teardown hooks).
    No collective runs at the end: the agreement goes through the group's store, with a
    bounded wait, and only when this process ended normally (or stopped with the others
    at a check)."""

    name = "ddp"

    def __init__(
        self, model: Any, module: torch.nn.Module, end_timeout: float = 60.0, check_every: int = 10
    ) -> None:
        self.model, self.module = model, module
        self.device = getattr(model, "device", None)
        self.sampler: DistributedSampler[Any] | None = None
        self.data: dict[str, Any] = {}  # attribute -> the model's own data, put back after
        self.ending = EndAgreement(end_timeout)
        self.check_every = check_every
        self.stop_check: StopCheck | None = None  # made once the group exists
        # the training data this backend dealt out (None: dealt otherwise, or not at all),
        # and what one item of it is, in batches: the loader's batch size (1 for a list)
        self.dealt: DealingSampler | DealtBatches | None = None
        self.unit = 1
        # where the epoch under way stands: its number, the skipped batches before it, and
        # the parts of it that ran in another number of processes (data.Chain)
        self.epoch, self.skipped_before = -1, 0
        self.chain: Chain = []
        self.loaded: dict[str, Any] | None = None  # the checkpoint's state of this pack
        self.first_epoch = True
        self.checking = True
        REQUEST.checks += 1  # a signal now waits for this run's check

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
            if isinstance(sampler, DealingSampler):
                self.dealt, self.unit = sampler, sharded.batch_size or 1
            elif isinstance(sharded, DealtBatches):
                self.dealt = sharded
        for name in ("eval_data",):
            data = getattr(model, name, None)
            if data is not None:
                self.data[name] = data
                setattr(model, name, shard_eval_data(data, rank, world))

    def hooks(self) -> Iterator[Hook]:
        # first: before any hook that could draw from the epoch's data
        yield Hook(
            self.epoch_start,
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

    def check_stop(self, engine: Any) -> None:
        assert self.stop_check is not None
        self.stop_check(engine)

    def stopped_together(self, engine: Any) -> bool:
        """Whether the run ends with an interrupt that every process took at the same
        step (the stop check's): an agreed end, not a failure."""
        return isinstance(engine.state.error, Interrupted) and (
            self.stop_check is not None and self.stop_check.fired
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

    # -- the data of an epoch ------------------------------------------------------------

    def drawn(self, state: Any) -> int:
        """How many batches of the epoch under way this process had drawn when the
        checkpoint this run resumes from was taken (0: it resumes at an epoch's start)."""
        loaded = self.loaded
        if loaded is None or loaded.get("epoch") != state.epoch:
            return 0
        return max(0, state.epoch_step + state.skipped - int(loaded.get("skipped_before", 0)))

    def check_setup(self, engine: Any) -> None:
        """A run resumed in the middle of an epoch begun in another number of processes
        deals the epoch's rest out anew: only data this backend dealt out can be."""
        s, loaded = engine.state, self.loaded
        if s.mode != "train" or loaded is None or loaded.get("world") is None:
            return
        drawn, saved = self.drawn(s), int(loaded["world"])
        if not drawn or (saved == env.world_size() and not loaded.get("chain")):
            return
        if loaded.get("epoch_batches") is not None and drawn >= int(loaded["epoch_batches"]):
            return  # the epoch's data were all drawn: it resumes as at the epoch's end
        why = self.why_not_dealt()
        if why is None and loaded.get("dealt") not in (None, self.dealt_kind()):
            why = f"{self.dealt_kind()}, and the checkpoint's were {loaded['dealt']}"
        if why is None:
            return
        raise ValueError(
            f"the checkpoint {engine.resumed_from} was written by {saved} process(es) in the "
            f"middle of epoch {s.epoch + 1} (after {drawn} of its batches), and this run has "
            f"{env.world_size()}: the rest of the epoch is dealt out anew only for training "
            f"data the {self.name} backend deals out itself (a DataLoader it makes again, a "
            f"list of batches), and this run's are {why}. Resume in {saved} process(es), or "
            f"from a checkpoint taken at an epoch's end (Checkpoint(every='1ep'))"
        )

    def dealt_kind(self) -> str:
        return "a list of batches" if isinstance(self.dealt, DealtBatches) else "a DataLoader"

    def why_not_dealt(self) -> str | None:
        """None when this backend dealt the training data out; else what they are."""
        if self.dealt is not None:
            return None
        data = getattr(self.model, "train_data", None)
        if "train_data" not in self.data:
            return "read by each process as it is (DDP(shard_data=False))"
        if self.sampler is not None:
            loader = type(data).__name__
            return f"dealt out by the script's own DistributedSampler (in a {loader})"
        return f"of a type it cannot deal out ({type(data).__name__})"

    def setup(self, engine: Any) -> None:
        """At setup: one run record for every process (rank 0's: under ``fsdp`` each
        process writes it into its part of every checkpoint), which says whether the
        run's data are this backend's to deal out (a resume in another number of
        processes checks it); a run resumed in the middle of an epoch that began in
        another number of processes (or went on in one) draws the rest of it, dealt out
        anew."""
        s, record = engine.state, engine.run_record
        record["id"], record["started"] = env.broadcast_from_0(
            (record.get("id"), record.get("started"))
        )
        why = self.why_not_dealt()
        record["data"] = "dealt" if why is None else why
        drawn, loaded = self.drawn(s), self.loaded
        self.chain = []
        if not drawn or self.dealt is None or loaded is None or loaded.get("world") is None:
            return
        saved, chain = int(loaded["world"]), [list(part) for part in loaded.get("chain") or []]
        if saved == env.world_size() and not chain:
            return  # the epoch goes on as it began: the resume skips the drawn batches
        count = drawn * self.unit - sum(part[1] for part in chain)
        if count > 0:
            chain.append([saved, count])
        if isinstance(self.dealt, DealingSampler):
            self.dealt.set_epoch(s.epoch)
        self.dealt.deal(chain)
        self.chain = chain

    def epoch_start(self, engine: Any) -> None:
        s = engine.state
        if self.sampler is not None:
            self.sampler.set_epoch(s.epoch)
        if self.first_epoch:  # maybe resumed in its middle: count its skips as they were
            self.first_epoch = False
            self.skipped_before = s.skipped - max(0, self.drawn(s) - s.epoch_step)
        else:
            self.chain, self.skipped_before = [], s.skipped
            if isinstance(self.dealt, DealtBatches):
                self.dealt.dealt_as_ever()
        self.epoch = s.epoch

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
        for name, data in self.data.items():
            setattr(model, name, data)
        self.data = {}
        if isinstance(model.module, DistributedDataParallel):
            model.module = self.module
        if self.device is not None and hasattr(model, "device"):
            model.device = self.device

    def state_dict(self) -> dict[str, Any]:
        """The sampler's seed, and where the epoch under way stands: the number of
        processes, the skipped batches before it, its parts in other numbers of
        processes, what the data are and how many batches the epoch has here."""
        try:
            batches: int | None = len(self.model.train_data)
        except TypeError:
            batches = None
        state: dict[str, Any] = {
            "world": env.world_size(),
            "epoch": self.epoch,
            "skipped_before": self.skipped_before,
            "chain": [list(part) for part in self.chain],
            "epoch_batches": batches,
            "dealt": None if self.dealt is None else self.dealt_kind(),
        }
        if self.sampler is not None:
            state["seed"] = int(self.sampler.seed)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loaded = dict(state)
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

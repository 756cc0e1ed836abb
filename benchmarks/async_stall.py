"""The stall of an async checkpoint save against its floor: a bare copy of the same bytes
into preallocated buffers, measured in the same run, moments apart.

With ``Checkpoint(async_save=True)`` the training waits only while the state is copied
into CPU buffers (kept from one save to the next); a thread writes the copy. On a CPU
that copy is bounded by memory bandwidth, so its floor is a plain ``copy_`` of the same
tensors into buffers allocated beforehand. Measured in one training run, at each save
(one every ``EVERY`` steps), in turn, the order rotated from save to save:

* ``floor``: ``buffer.copy_(tensor)`` for every tensor of the state (the module's
  ``state_dict()`` and the optimizer's state: this process's shards under fsdp), into
  buffers allocated and touched before the run;
* ``writer``: the storage's background writer alone (``engine.storage.writer()``, a second
  one beside the pack's): ``submit`` of the snapshot, taken before as the pack takes it,
  without the model's part (plain: ``runmodel.checkpoint.writer.Writer``, which takes
  the model's state from the live module and optimizer, planned once; sharded:
  ``ShardedWriter``, whose ``submit`` takes the sharded state itself);
* ``pack``: the time the training waits in the ``Checkpoint`` pack's save hook (hooks
  just before and after it): ``engine.snapshot`` and ``submit``; and on their own,
  ``snapshot`` (the engine's part: counters, packs' states, random generators, where
  the data stands), and ``copy check``, the writer's check that the parameters of its copy
  are finite (both writers make it inside ``submit``, over the staged buffers, in place
  of the pack's own check of the live parameters: it is part of the ``writer`` row);
* the **GIL wait** after the writer's ``submit``: the longest pause of a Python loop on
  the training thread (its next statements) while the write runs (at most 0.25 s), and
  the same while a thread of this process writes the snapshot with ``torch.save`` (as
  the plain writer did before it had a process of its own; sharded: the writer's staged
  copy with DCP's ``save``, as ``ShardedWriter`` did before its writer processes), and
  with nothing written (what the machine's other jobs cause).

Before each measurement every background write has ended (it is waited for, untimed), so
none competes for the cores. The first save of a run allocates the buffers: it is left
out (its stall is shown apart). The ratios are per save (each measure over the floor of
the same save), their median and range over the saves.

Two states: ``large``, 8 x ``nn.Linear(2048, 2048)`` (33.6M parameters; with Adam's
moments 403 MB in 24 tensors); ``small``, 256 blocks of ``nn.Linear(256, 256)`` and
``nn.LayerNorm(256)`` (17.0M parameters, 204 MB in 4,096 tensors, the steps included),
where what a save does per tensor shows. ``--part sharded`` runs them under the ``fsdp``
backend in 2 gloo processes (torchrun, started by the script); each process copies its
shards.

    python benchmarks/async_stall.py                 # both parts, both states
    python benchmarks/async_stall.py --part plain --state small --saves 5
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import runmodel
from runmodel.models.torch_model import state_parts
from runmodel.packs import Checkpoint

EVERY = 2  # steps between saves
STATES = ("large", "small")


def module_of(state: str) -> nn.Module:
    torch.manual_seed(0)
    if state == "large":
        return nn.Sequential(*(nn.Linear(2048, 2048) for _ in range(8)))
    blocks: list[nn.Module] = []
    for _ in range(256):
        blocks += [nn.Linear(256, 256), nn.LayerNorm(256)]
    return nn.Sequential(*blocks)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's own shard; else the tensor."""
    to_local = getattr(tensor, "to_local", None)
    return (to_local() if callable(to_local) else tensor).detach()


def state_tensors(model: runmodel.TorchModel) -> list[torch.Tensor]:
    """Every tensor a checkpoint copies: the module's state and the optimizer's, this
    process's shards of them, each storage once."""
    assert model.module is not None and model.optimizer is not None
    tensors = [local(t) for t in model.module.state_dict().values()]
    tensors += [
        local(t)
        for per_param in model.optimizer.state.values()
        for t in per_param.values()
        if isinstance(t, torch.Tensor)
    ]
    seen: set[int] = set()
    unique = []
    for tensor in tensors:
        if tensor.untyped_storage().data_ptr() not in seen:
            seen.add(tensor.untyped_storage().data_ptr())
            unique.append(tensor)
    return unique


class Floor:
    """A bare copy of the state's tensors into buffers allocated (and touched) once."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.pairs = [(torch.empty_like(t, device="cpu"), t) for t in tensors]
        self.copy()  # every page of the buffers touched before the first measure
        self.nbytes = sum(t.untyped_storage().nbytes() for t in tensors)

    def copy(self) -> None:
        for buffer, tensor in self.pairs:
            buffer.copy_(tensor)


class Measure:
    """Hooks on ``runstep`` around the Checkpoint pack's save (priority -1000): at each
    save, the floor, the writer alone and the pack's parts are timed first (the order
    rotated from save to save), then the pack's save itself."""

    def __init__(self, pack: Checkpoint, folder: Path, plain: bool) -> None:
        self.pack, self.folder, self.plain = pack, folder, plain
        self.times: dict[str, list[float]] = {k: [] for k in MEASURES}  # wall clock
        self.cpu: dict[str, list[float]] = {k: [] for k in MEASURES}  # this process's CPU
        self.pauses: dict[str, list[float]] = {
            "idle": [],
            "writer": [],
            "thread": [],
            "dcp thread": [],
        }
        self.first_pack = float("nan")
        self.nbytes = self.tensors = 0
        self._floor: Floor | None = None
        self._writer: Any = None
        self._snapshot: dict[str, Any] = {}
        self._parts: dict[str, Any] = {}
        self._started = self._started_cpu = 0.0
        self._saves = 0
        self.module: nn.Module | None = None

    def attach(self, engine: runmodel.Engine) -> None:
        engine.on("runstep", self.before, priority=-999, every=f"{EVERY}st")
        engine.on("runstep", self.after, priority=-1001, every=f"{EVERY}st")

    def before(self, engine: runmodel.Engine) -> None:
        self.pack.wait()  # the pack's previous write: ended, untimed
        if self._floor is None:  # at the first save: the floor's buffers, and the writer's
            tensors = state_tensors(engine.model)
            self._floor = Floor(tensors)
            self.nbytes, self.tensors = self._floor.nbytes, len(tensors)
            storage: Any = engine.storage  # the plain or the sharded one: both have a writer
            self._writer = storage.writer()
            self.module = engine.model.module
            # plain: the writer takes the model's state from the live module and optimizer
            self._parts = {"model_parts": state_parts(engine.model)} if self.plain else {}
            self._snapshot = engine.snapshot(model_state=False)
            self._submit()
            self._writer.wait()
            self._clear(engine)
        else:
            floor = self._floor
            measures: list[tuple[str, Callable[[], Any]]] = [
                ("floor", floor.copy),
                ("writer", self._submit),
                ("snapshot", lambda: engine.snapshot(model_state=False)),
                ("copy check", self._check_copy),
            ]
            turn = self._saves % len(measures)
            for name, fn in measures[turn:] + measures[:turn]:
                if name == "writer":  # taken before, untimed (as the pack takes it)
                    self._snapshot = engine.snapshot(model_state=False)
                gc.collect()
                started, started_cpu = time.perf_counter(), time.process_time()
                fn()
                self.times[name].append(time.perf_counter() - started)
                self.cpu[name].append(time.process_time() - started_cpu)
                if name == "writer":
                    self.pauses["writer"].append(longest_pause(lambda: self._writer.busy))
                self._writer.wait()  # its write (if any) ends before the next measure
                self._clear(engine)
            self.pauses["idle"].append(longest_pause(lambda: True))  # the machine's own
            if self.plain:
                self.pauses["thread"].append(self._thread_pause(engine))
            else:
                self.pauses["dcp thread"].append(self._dcp_thread_pause(engine))
        gc.collect()
        self._started, self._started_cpu = time.perf_counter(), time.process_time()

    def _thread_pause(self, engine: runmodel.Engine) -> float:
        """The GIL wait while a thread of this process writes the snapshot."""
        from runmodel.checkpoint.format import write

        thread = threading.Thread(target=write, args=(self.folder / "alone", engine.snapshot()))
        thread.start()
        pause = longest_pause(thread.is_alive)
        thread.join()
        self._clear(engine)
        return pause

    def _dcp_thread_pause(self, engine: runmodel.Engine) -> float:
        """The GIL wait while a thread of this process writes the sharded writer's staged
        copy with DCP's ``save`` on the checkpoint group (as ``ShardedWriter`` did before it
        had writer processes; every process at once: collective)."""
        import torch.distributed.checkpoint as dcp

        storage: Any = engine.storage
        folder = self.folder / "dcp-thread"
        thread = threading.Thread(
            target=dcp.save,
            args=(self._writer._plan.staged,),
            kwargs={
                "storage_writer": dcp.FileSystemWriter(folder, sync_files=True, overwrite=True),
                "process_group": storage.sharded.group,
            },
        )
        thread.start()
        pause = longest_pause(thread.is_alive)
        thread.join()
        if engine.state.rank == 0:
            shutil.rmtree(folder, ignore_errors=True)
        return pause

    def _submit(self) -> None:
        self._writer.submit(
            self.folder / "alone", self._snapshot, module=self.module, **self._parts
        )

    def _check_copy(self) -> None:
        """The writer's check of its copy's parameters alone (as ``submit`` makes it)."""
        plan = self._writer._plan
        if self.plain:
            plan.check.finite()
        else:  # the sharded plan: one flat buffer a dtype
            from runmodel.checkpoint.writer import all_finite

            all_finite(plan._flat)

    def _clear(self, engine: runmodel.Engine) -> None:
        """The writer's checkpoint goes (rank 0's job, as the sharded folder is one)."""
        alone = self.folder / "alone"
        if engine.state.rank == 0:
            if alone.is_dir():
                shutil.rmtree(alone, ignore_errors=True)
            alone.unlink(missing_ok=True)

    def after(self, engine: runmodel.Engine) -> None:
        took = time.perf_counter() - self._started
        if self._saves == 0:
            self.first_pack = took
        else:
            self.times["pack"].append(took)
            self.cpu["pack"].append(time.process_time() - self._started_cpu)
        self._saves += 1


MEASURES = ("floor", "pack", "writer", "snapshot", "copy check")


def longest_pause(busy: Callable[[], bool], limit: float = 0.25) -> float:
    """The longest time between two turns of a Python loop while ``busy()`` (at most
    ``limit`` seconds): how long the thread waited for the GIL at worst."""
    start = last = time.perf_counter()
    longest = 0.0
    while busy() and last - start < limit:
        now = time.perf_counter()
        longest = max(longest, now - last)
        last = now
    return longest


def measure(state: str, saves: int, folder: Path, backend: str | None) -> dict[str, Any]:
    """One training run of ``state``'s model with Adam, a save every ``EVERY`` steps
    (``saves`` measured, after the first); this process's times."""
    module = module_of(state)
    width = 2048 if state == "large" else 256
    g = torch.Generator().manual_seed(1)
    data = [  # one step past the last save: not the epoch's last step, saved at its end
        (torch.randn(4, width, generator=g), torch.randn(4, width, generator=g))
        for _ in range(EVERY * (saves + 1) + 1)
    ]
    model = runmodel.TorchModel.from_parts(
        module, optimizer=torch.optim.Adam, loss_fn=nn.MSELoss(), train_data=data
    )
    pack = Checkpoint(folder / "ckpt", every=f"{EVERY}st", keep=1, async_save=True)
    engine = runmodel.Engine()
    engine.attach(pack)
    probe = Measure(pack, folder, plain=backend is None)
    probe.attach(engine)
    kwargs: dict[str, Any] = {} if backend is None else {"backend": backend}
    engine.run(model, steps=len(data), **kwargs)
    return {
        "times": probe.times,
        "cpu": probe.cpu,
        "first_pack": probe.first_pack,
        "pauses": probe.pauses,
        "nbytes": probe.nbytes,
        "tensors": probe.tensors,
    }


# ---- the sharded part: 2 processes under torchrun ----


def worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    folder = Path(args.folder)
    results = {}
    for state in args.states:
        rank_folder = folder / state
        results[state] = measure(state, args.saves, rank_folder, "fsdp")
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, results)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(everyone), flush=True)
    runmodel.end_distributed()


def launch(states: list[str], saves: int, folder: Path) -> list[dict[str, Any]]:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        __file__,
        "--worker",
        "--folder",
        str(folder),
        "--saves",
        str(saves),
        "--state",
        *states,
    ]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        sys.exit(f"the sharded part failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    result: list[dict[str, Any]] = json.loads(lines[-1][len("RESULT ") :])
    return result


# ---- the report ----


def machine() -> str:
    name = platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{name} ({os.cpu_count()} cores), {platform.system()}, Python "
        f"{platform.python_version()}, torch {torch.__version__}"
    )


def spread(values: list[float], digits: int = 4, unit: str = "") -> str:
    return (
        f"{statistics.median(values):.{digits}f}{unit} [{min(values):.{digits}f}, "
        f"{max(values):.{digits}f}]"
    )


def table(title: str, result: dict[str, Any]) -> list[str]:
    """Per measure: wall-clock seconds and the ratio to the same save's floor, then the
    same in this process's CPU seconds (steadier on a loaded machine: time spent waiting
    for a core is not in it)."""
    times, cpu = result["times"], result["cpu"]
    gb = result["nbytes"] / 1e9
    rows = [
        f"\n{title}: {gb * 1e3:.0f} MB in {result['tensors']:,} tensors, "
        f"{len(times['floor'])} saves; floor {gb / statistics.median(times['floor']):.2f}"
        f" GB/s; the first save of the run (buffers allocated): "
        f"{result['first_pack']:.3f} s\n",
        "| measure | wall (s): median [min, max] | / floor, per save | "
        "CPU (s): median [min, max] | / floor, per save |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in MEASURES:
        cells = []
        for clock in (times, cpu):
            ratios = [t / f for t, f in zip(clock[name], clock["floor"], strict=True)]
            cells += [spread(clock[name]), spread(ratios, 2, "x")]
        rows.append(f"| {LABELS[name]} | " + " | ".join(cells) + " |")
    for name, pauses in result["pauses"].items():
        if pauses:
            rows.append(f"\nGIL wait, {PAUSES[name]}: {spread(pauses, 4, ' s')}")
    return rows


PAUSES = {
    "idle": "the training thread's longest pause in 0.25 s with nothing written (the load)",
    "writer": "the training thread's longest pause while the writer writes",
    "thread": "the same while a thread writes the snapshot with torch.save (the former way)",
    "dcp thread": "the same while a thread writes the staged copy with DCP's save (the former way)",
}


LABELS = {
    "floor": "floor: bare copy into preallocated buffers",
    "pack": "**stall**: the Checkpoint pack's save hook",
    "writer": "the writer's `submit` alone",
    "snapshot": "`engine.snapshot(model_state=False)` alone (the engine's part)",
    "copy check": "the writer's finite check of its copy alone (in `submit`)",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("plain", "sharded", "all"), default="all")
    parser.add_argument("--state", nargs="+", choices=STATES, default=list(STATES), dest="states")
    parser.add_argument("--saves", type=int, default=9, help="saves measured per run")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads of the plain part (1: steadier on a shared "
        "machine; a copy's threads stall on the slowest one)",
    )
    parser.add_argument("--dir", default=None, help="where files are written (a temp folder)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    torch.set_num_threads(args.threads)
    print(
        f"{time.strftime('%Y-%m-%d')}, {machine()}, {torch.get_num_threads()} threads "
        f"(sharded: 2 processes, 1 thread each); load average before: "
        f"{os.getloadavg()[0]:.1f}"
    )
    folder = Path(tempfile.mkdtemp(prefix="async-stall-", dir=args.dir))
    try:
        if args.part in ("plain", "all"):
            for state in args.states:
                result = measure(state, args.saves, folder / state, None)
                print("\n".join(table(f"plain, {state}", result)), flush=True)
        if args.part in ("sharded", "all"):
            ranks = launch(args.states, args.saves, folder / "sharded")
            for state in args.states:
                for rank, results in enumerate(ranks):
                    print(
                        "\n".join(
                            table(
                                f"sharded (fsdp, 2 processes), {state}, rank {rank}", results[state]
                            )
                        ),
                        flush=True,
                    )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"\nload average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

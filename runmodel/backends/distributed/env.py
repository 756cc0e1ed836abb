"""This process's place among the processes of a distributed run, answered in one place:
whether torchrun started it (and others with it), its rank, the world's size, its local
rank, the store the launched processes meet at, rank 0's value sent to all, and the
default process group that runmodel makes (kept until the process exits, or until
``runmodel.end_distributed()``).

Everything above the core asks here. The core itself (which imports nothing else of
runmodel, and runs without any backend, in a script that made its own process group
too) asks torch.distributed for its run's rank and world size (``core/state.py``
``current_rank``, ``core/continuing.py`` ``world_size``); ``rank()`` and ``world_size()``
here are those same functions, so that one rule answers everywhere.

Nothing here imports torch until a question needs it: the command line asks
``launched()`` before torch is imported.
"""

from __future__ import annotations

import atexit
import datetime
import functools
import importlib
import os
import sys
from typing import Any, TypeVar

from ...core.continuing import world_size as _world_size
from ...core.state import current_rank

__all__ = [
    "GROUP_CAPTURING_MODULES",
    "STORE_WAIT",
    "TORCHRUN_VARIABLES",
    "broadcast_from_0",
    "end_distributed",
    "gloo_group",
    "group_store",
    "has_group",
    "launch_world",
    "launched",
    "local_rank",
    "make_group",
    "missing_variables",
    "rank",
    "restart_count",
    "restarted",
    "several",
    "store",
    "sync_ignite",
    "world_size",
]

T = TypeVar("T")

#: What torchrun sets in each process it starts (``init_method="env://"`` reads them).
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")

#: torch modules whose functions take the default process group as a default argument,
#: evaluated on import: imported before the group exists, they hold None instead of it
#: (``make_group``).
GROUP_CAPTURING_MODULES = ("torch.distributed.nn.functional", "torch.distributed.optim")

#: How long a process waits in ``store()`` for what another one sets (rank 0 may build a
#: model first, which may fetch a data set).
STORE_WAIT = datetime.timedelta(minutes=30)


# -- the launch ----------------------------------------------------------------------------


def launched() -> bool:
    """Whether torchrun started this process (one of one, or of several)."""
    return "TORCHELASTIC_RUN_ID" in os.environ


def several() -> bool:
    """Whether torchrun started this process and others with it."""
    return launched() and int(os.environ.get("WORLD_SIZE", "1")) > 1


def restart_count() -> int:
    """How many times torchrun restarted this launch's processes (``--max-restarts``:
    ``$TORCHELASTIC_RESTART_COUNT``); 0 outside torchrun."""
    if not launched():
        return 0
    try:
        return max(0, int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
    except ValueError:
        return 0


def restarted() -> bool:
    """Whether this process belongs to a group that torchrun started again after a
    process failed: it continues the run, as ``runmodel resume`` would."""
    return restart_count() > 0


def rank() -> int:
    """This process's rank: the default process group's once it exists, else the
    launcher's (``$RANK``), else 0."""
    return current_rank()


def world_size() -> int:
    """The number of processes of the run under way: the default process group's size
    (a distributed backend made it by then), else 1."""
    return _world_size()


def local_rank() -> int:
    """This process's rank on its machine (``$LOCAL_RANK``; 0 outside a launch): the GPU it
    takes."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def launch_world() -> dict[str, int]:
    """The processes torchrun started, as a run's status records them (what ``runmodel
    resume`` starts again)."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(size)))
    return {"world_size": size, "nproc_per_node": local, "nnodes": max(1, size // local)}


def missing_variables() -> list[str]:
    """Those of torchrun's variables that this process's environment lacks: a process
    group cannot be made from it without them."""
    return [name for name in TORCHRUN_VARIABLES if name not in os.environ]


# -- the stores ----------------------------------------------------------------------------


@functools.cache
def store() -> Any:
    """The store of torchrun's rendezvous (env://: ``MASTER_ADDR``, ``MASTER_PORT``), under
    a prefix of this launch's restart, where the processes meet before any process group
    exists. Made once, and kept for the process's life: rank 0 may host its server. A
    ``get`` waits up to ``STORE_WAIT``."""
    import torch.distributed as dist

    made, _, _ = next(dist.rendezvous("env://", timeout=STORE_WAIT))
    return dist.PrefixStore(f"runmodel/{restart_count()}/", made)


def group_store() -> Any:
    """The default process group's own store (torchrun's, or the one a script's group was
    made with), which every process of the group reaches without a collective."""
    import torch.distributed as dist

    # private in name, in torch for years; the one place runmodel reaches for it
    return dist.distributed_c10d._get_default_store()


# -- the process group ---------------------------------------------------------------------


def has_group() -> bool:
    """Whether torch.distributed's default process group exists (made by a backend, or by
    the script). torch is not imported for it: without it, no group exists."""
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()


def broadcast_from_0(value: T) -> T:
    """Rank 0's ``value`` (anything picklable), on every process of the default process
    group; ``value`` itself in a run of one process. A collective: every process calls
    it, at the same point."""
    if world_size() == 1:
        return value
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class _MadeGroup:
    """The default process group that runmodel made (``group`` None: none, or one the
    script made, which the script ends), and the gloo groups made beside the default
    group, by what they are for (``gloo_group``), with the default group they belong to."""

    __slots__ = ("ends_at_exit", "group", "side", "side_of")

    def __init__(self) -> None:
        self.group: Any = None
        self.ends_at_exit = False
        self.side: dict[tuple[str, float | None], Any] = {}
        self.side_of: Any = None


_made = _MadeGroup()


def gloo_group(purpose: str, timeout: float | None = None) -> Any:
    """A gloo process group over every process of the default group, for collectives that
    must wait on no device (a check of the CPU) or must not interleave with training's (a
    checkpoint's, run in the background): None (the default group, as torch.distributed's
    functions take it) where that is gloo and no ``timeout`` (seconds) of its own is
    asked, else a group of its own for ``purpose``.
    Made at the first ask (a collective: every process asks at the same point, as every
    process makes the same runs) and kept for the process's later runs while the default
    group lives, so a script's runs do not each leave one behind; it ends with the default
    group (``end_distributed``)."""
    import torch.distributed as dist

    if timeout is None and dist.get_backend() == "gloo":
        return None  # (no reference to it: one held after its end keeps its threads alive)
    world = dist.group.WORLD
    if _made.side_of is not world:  # another default group: the old ones ended with theirs
        _made.side, _made.side_of = {}, world
    key = (purpose, timeout)
    if key not in _made.side:
        _made.side[key] = dist.new_group(
            backend="gloo", timeout=None if timeout is None else datetime.timedelta(seconds=timeout)
        )
    return _made.side[key]


def make_group(backend: str, timeout: float | None, device: Any = None) -> None:
    """Make torch.distributed's default process group from torchrun's environment, for
    every run of this process from now on: it lives until the process exits or
    ``end_distributed()`` ends it. The modules that capture the group in default arguments
    are imported first (``GROUP_CAPTURING_MODULES``): imported while a group exists, they
    keep it alive past its end, its gloo threads live on into the interpreter's exit, and
    one that releases its last collective's tensors there aborts the process
    (``terminate called without an active exception``, docs/distributed.md).

    Under torchrun the group meets in ``store()``, under the prefix of this launch's
    restart: torchrun's agent keeps one store for every restart of its processes, and a
    group made there without a prefix of its own reads the addresses the previous
    attempt's processes left (torch's issue 135712: a restarted group then fails to
    connect, or connects to nothing and waits)."""
    import torch.distributed as dist

    for name in GROUP_CAPTURING_MODULES:
        importlib.import_module(name)
    where: dict[str, Any] = {}
    if launched():
        where = {
            "store": store(),
            "rank": int(os.environ["RANK"]),
            "world_size": int(os.environ["WORLD_SIZE"]),
        }
    dist.init_process_group(
        backend,
        timeout=None if timeout is None else datetime.timedelta(seconds=timeout),
        device_id=device if backend == "nccl" else None,
        **where,
    )
    _made.group = dist.group.WORLD
    if not _made.ends_at_exit:
        # ended by an exit handler, while the interpreter is whole: its worker threads
        # end before Python finalises (threading's own shutdown, and the handlers
        # registered before this one, as multiprocessing's, run around it)
        atexit.register(end_distributed)
        _made.ends_at_exit = True
    sync_ignite()


def end_distributed() -> None:
    """End the process group that a ``ddp`` or ``fsdp`` run made in this process, after
    its last use (a group a script made itself is the script's to end). Runs at the
    process's exit anyway; call it to end the group earlier. Nothing to end: nothing done.
    Local: no collective, so a process may call it after the others are gone."""
    group, _made.group = _made.group, None
    _made.side, _made.side_of = {}, None
    if group is None or not has_group():
        return
    import torch.distributed as dist

    if dist.group.WORLD is group:  # not one the script made since
        dist.destroy_process_group()
    sync_ignite()


def sync_ignite() -> None:
    """ignite keeps its own view of the distributed context: bring it up to date. Not
    imported yet, it reads the context when first asked (importing it costs seconds)."""
    idist = sys.modules.get("ignite.distributed")
    if idist is not None:
        idist.sync()

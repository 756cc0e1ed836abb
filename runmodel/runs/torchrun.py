"""Config runs under torchrun (``runmodel run CONFIG --nproc-per-node N``): every process
builds the run, process rank 0 alone decides where it goes (claims the run folder, picks
the checkpoint to continue from) and tells the others through the store torchrun's
processes meet at, before the backend makes its process group. Only rank 0 writes the run
folder's files (under ``fsdp`` every rank writes its checkpoint shards)."""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import os
from collections.abc import Callable
from typing import Any

from ..config.registry import Spec
from ..config.runconfig import RunConfig

__all__ = ["BACKENDS", "DecisionFailed", "decided", "distributed", "launched", "rank",
           "with_backend", "world"]

#: The backends a config run takes in several processes.
BACKENDS = ("ddp", "fsdp")

#: How long the other processes wait for rank 0's decision (it builds the model first,
#: which may fetch a data set).
WAIT = datetime.timedelta(minutes=30)

_store: Any = None  # kept for the process's life: rank 0 may host the store's server
_decisions = itertools.count()


class DecisionFailed(ValueError):
    """Rank 0 could not start the run (its error is in the message)."""


def launched() -> bool:
    """Whether torchrun started this process (one of one, or of several)."""
    return "TORCHELASTIC_RUN_ID" in os.environ


def distributed() -> bool:
    """Whether this process is one of several that torchrun started."""
    return "TORCHELASTIC_RUN_ID" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1


def rank() -> int:
    return int(os.environ.get("RANK", "0")) if distributed() else 0


def world() -> dict[str, Any]:
    """The processes the run runs in, as its status records them."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(size)))
    return {"world_size": size, "nproc_per_node": local, "nnodes": max(1, size // local)}


def with_backend(config: RunConfig, asked: str | None) -> RunConfig:
    """The config with the backend it runs in several processes with: its own ``ddp`` or
    ``fsdp`` (with its args), or ``asked`` (``--backend``, default ``ddp``) where it names
    none; the backend is part of the config (and so of the run folder's name)."""
    kind = None if config.backend is None else config.backend.type_
    if kind in BACKENDS:
        if asked is not None and asked != kind:
            raise ValueError(f"--backend {asked}: the config names backend {kind!r}; drop "
                             f"--backend, or set the config's backend = {{type = \"{asked}\"}}")
        return config
    if kind not in (None, "plain"):
        raise ValueError(f"the config's backend {kind!r} runs in one process; in several "
                         f"(--nproc-per-node) a config run takes backend "
                         f"{' or '.join(map(repr, BACKENDS))}: remove the config's backend "
                         f"or set backend = {{type = \"ddp\"}}")
    return dataclasses.replace(config, backend=Spec(asked or "ddp"))


def decided(decide: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``decide()`` run on rank 0 alone; its result (JSON data) on every rank. An error on
    rank 0 is raised there and, as ``DecisionFailed``, on the others. Every process calls
    it at the same point (the decisions are numbered)."""
    if not distributed():
        return decide()
    key = f"decision-{next(_decisions)}"
    store = _the_store()
    if rank() == 0:
        try:
            value = decide()
        except Exception as error:
            store.set(key, json.dumps({"error": str(error).strip("'\"")}))
            raise
        store.set(key, json.dumps({"value": value}))
        return value
    answer = json.loads(store.get(key))
    if "error" in answer:
        raise DecisionFailed(f"process rank 0 could not start the run: {answer['error']}")
    told: dict[str, Any] = answer["value"]
    return told


def _the_store() -> Any:
    """The store of torchrun's rendezvous (env://: MASTER_ADDR, MASTER_PORT), under a
    prefix of this launch's restart."""
    global _store
    if _store is None:
        import torch.distributed as dist

        store, _, _ = next(dist.rendezvous("env://", timeout=WAIT))
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        _store = dist.PrefixStore(f"runmodel.config_run/{restart}/", store)
    return _store

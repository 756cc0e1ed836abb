"""Config runs under torchrun (``runmodel run CONFIG --nproc-per-node N``): every process
builds the run, process rank 0 alone decides where it goes (claims the run folder, picks
the checkpoint to continue from) and tells the others through the store torchrun's
processes meet at (``backends/distributed/env.py``), before the backend makes its
process group. Only rank 0 writes the run folder's files (under ``fsdp`` every rank
writes its checkpoint shards)."""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable
from typing import Any

from ..backends.distributed import env
from ..backends.distributed.failures import record_failure
from ..config.registry import Spec
from ..config.runconfig import RunConfig

__all__ = ["BACKENDS", "DecisionFailed", "decided", "with_backend"]

#: The backends a config run takes in several processes.
BACKENDS = ("ddp", "fsdp")

#: Decisions made in this process: each has a key of its own in the store (every process
#: asks for the same decisions, in the same order).
_decisions = itertools.count()


class DecisionFailed(ValueError):
    """Rank 0 could not start the run (its error is in the message)."""


def with_backend(config: RunConfig, asked: str | None) -> RunConfig:
    """The config with the backend it runs in several processes with: its own ``ddp`` or
    ``fsdp`` (with its args), or ``asked`` (``--backend``, default ``ddp``) where it names
    none; the backend is part of the config (and so of the run folder's name)."""
    kind = None if config.backend is None else config.backend.type_
    if kind in BACKENDS:
        if asked is not None and asked != kind:
            raise ValueError(
                f"--backend {asked}: the config names backend {kind!r}; drop "
                f'--backend, or set the config\'s backend = {{type = "{asked}"}}'
            )
        return config
    if kind not in (None, "plain"):
        raise ValueError(
            f"the config's backend {kind!r} runs in one process; in several "
            f"(--nproc-per-node) a config run takes backend "
            f"{' or '.join(map(repr, BACKENDS))}: remove the config's backend "
            f'or set backend = {{type = "ddp"}}'
        )
    return dataclasses.replace(config, backend=Spec(asked or "ddp"))


def decided(decide: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``decide()`` run on rank 0 alone; its result (JSON data) on every rank. An error on
    rank 0 is raised there and, as ``DecisionFailed``, on the others; rank 0 records it
    for the launcher before the others learn of it, so the launcher names rank 0's
    failure as the first (the others' follows from it). Every process calls it at the
    same point (the decisions are numbered)."""
    if not env.several():
        return decide()
    key = f"decision-{next(_decisions)}"
    store = env.store()
    if env.rank() == 0:
        try:
            value = decide()
        except Exception as error:
            record_failure(error)
            store.set(key, json.dumps({"error": str(error).strip("'\"")}))
            raise
        store.set(key, json.dumps({"value": value}))
        return value
    answer = json.loads(store.get(key))
    if "error" in answer:
        raise DecisionFailed(f"process rank 0 could not start the run: {answer['error']}")
    told: dict[str, Any] = answer["value"]
    return told

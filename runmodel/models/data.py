"""Where a model's training data stands, for an exact resume (``core/position.py``).

``track(data)`` gives the ``DataTracker`` of a run's data:

* a ``torch.utils.data.DataLoader`` over a map-style dataset: for the run, its index
  sampler (``batch_sampler``, or ``sampler`` without batching) is wrapped. At each
  epoch's first request the wrapper draws the whole epoch's index batches at once, as a
  ``RandomSampler`` does anyway, and keeps them: a checkpoint holds that order and the
  states of the loader's and its samplers' generators. A resumed run's first epoch then
  yields the saved order from the position on (the indices before it are never loaded),
  and the generators are set back at the moment the loader asks for its first indices:
  after its own draws (its workers' base seed), before it reads any sample. Works with
  ``num_workers > 0`` and persistent workers. A ``SequentialSampler`` or a
  ``DistributedSampler`` (whose order is a function of its ``set_epoch``) is not saved
  but drawn again, so that every process of a distributed run resumes its own shard from
  the checkpoint process 0 wrote;
* a torchdata ``StatefulDataLoader``: saved and restored through its own ``state_dict()``,
  and its generators set back before the first step;
* a list or tuple of batches: replayed (its batches are in memory: nothing is loaded);
* anything else (an iterable-style dataset, a generator): no tracker; the engine replays
  the epoch and warns once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, SequentialSampler

__all__ = ["track"]

#: An epoch's indices are drawn at once only below this many batches (an endless sampler
#: would never end): past it, the epoch is replayed.
MAX_RECORDED = 50_000_000


def track(data: Any) -> Any:
    """The ``DataTracker`` for ``data``, or ``None`` when the engine must replay it."""
    if callable(getattr(data, "state_dict", None)) and callable(
        getattr(data, "load_state_dict", None)
    ):
        return _Stateful(data)
    if isinstance(data, DataLoader) and not isinstance(data.dataset, IterableDataset):
        try:
            if len(data) > MAX_RECORDED:
                return None
        except TypeError:  # a sampler without a length: maybe endless
            return None
        return _LoaderTracker(data)
    if isinstance(data, (list, tuple)):
        return _InMemory()
    return None


class _RecordedIndices:
    """Stands in for a DataLoader's index sampler during a run."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.epoch: list[Any] = []  # the current epoch's index batches, as drawn
        self._resume: tuple[list[Any] | None, int, Callable[[], None]] | None = None

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self) -> Iterator[Any]:
        # A generator: this runs at the loader's first request for indices, as the
        # wrapped sampler's own draws would (after the loader's base-seed draw); a
        # multiprocessing iterator makes (and drops) one before it, unstarted.
        if self._resume is not None:  # the resumed epoch: from the position
            batches, start, restore = self._resume
            self._resume = None
            restore()  # the loader drew what it draws at its start; nothing is read yet
            self.epoch = list(self.inner) if batches is None else batches
        else:
            self.epoch, start = list(self.inner), 0
        yield from self.epoch[start:]

    def resume(self, batches: list[Any] | None, start: int, restore: Callable[[], None]) -> None:
        """The next epoch starts at ``start``: of ``batches``, or of the order drawn again
        (``None``: a sampler whose order is a function of its epoch)."""
        self._resume = (batches, start, restore)


class _LoaderTracker:
    def __init__(self, loader: DataLoader[Any]) -> None:
        self.loader = loader
        self.attribute = "batch_sampler" if loader.batch_sampler is not None else "sampler"
        self.original = getattr(loader, self.attribute)
        self.indices = _RecordedIndices(self.original)
        self._install(self.indices)
        self.generators = _generators(loader)
        sampler = getattr(self.original, "sampler", self.original)
        # its order comes from set_epoch, the same in every process: draw it again
        self.recompute = isinstance(sampler, (SequentialSampler, DistributedSampler))

    def _install(self, sampler: Any) -> None:
        # DataLoader refuses to set these after it is made; an exact resume needs to see
        # and replay the indices, and the original is put back when the run ends
        object.__setattr__(self.loader, self.attribute, sampler)
        iterator = getattr(self.loader, "_iterator", None)  # persistent workers' iterator
        if iterator is not None:
            iterator._index_sampler = sampler

    def state(self) -> dict[str, Any]:
        return {
            "batches": None if self.recompute else _pack(self.indices.epoch),
            "generators": [g.get_state() for g in self.generators],
        }

    def resume(
        self, state: Any, batches: int, restore: Callable[[], None]
    ) -> Callable[[], None] | None:
        if not isinstance(state, dict) or "batches" not in state:
            return None  # a checkpoint of other data
        restore_all = _restoring(self.generators, state["generators"], restore)
        order = None if state["batches"] is None else _unpack(state["batches"])
        self.indices.resume(order, batches, restore_all)
        return restore_all

    def boundary_state(self) -> dict[str, Any]:
        """At an epoch's end: the generators the next epoch's order is drawn from."""
        return {"generators": [g.get_state() for g in self.generators]}

    def resume_boundary(self, state: Any, undo_iterator_draw: Callable[[], None]) -> None:
        """The next epoch starts as it would after the saved epoch's end."""
        if not isinstance(state, dict) or not isinstance(state.get("generators"), list):
            return
        restore = _restoring(self.generators, state["generators"], lambda: None)
        if self.loader.persistent_workers and self.loader.num_workers > 0:
            # A straight run goes on with its workers' iterator; this run makes one, which
            # draws a base seed first: undo that draw as the loader asks for its indices.
            # (The workers' own generators are seeded anew: see docs/config.md.)
            def undo_then_restore() -> None:
                undo_iterator_draw()
                restore()

            self.indices.resume(None, 0, undo_then_restore)
        else:
            restore()

    def close(self) -> None:
        self._install(self.original)


class _Stateful:
    """A loader that knows where it is (torchdata's ``StatefulDataLoader``)."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def state(self) -> Any:
        generators = _generators(self.loader)
        return {
            "loader": self.loader.state_dict(),
            "generators": [g.get_state() for g in generators],
        }

    def resume(
        self, state: Any, batches: int, restore: Callable[[], None]
    ) -> Callable[[], None] | None:
        if not isinstance(state, dict) or "loader" not in state:
            return None
        self.loader.load_state_dict(state["loader"])
        # its next iterator draws a base seed again: set the generators back after that,
        # before the first step
        return _restoring(_generators(self.loader), state["generators"], restore)

    def boundary_state(self) -> Any:
        return {"generators": [g.get_state() for g in _generators(self.loader)]}

    def resume_boundary(self, state: Any, undo_iterator_draw: Callable[[], None]) -> None:
        # its epoch ended: the next one starts afresh from its sampler's generator (loading
        # the finished epoch's state_dict would make the next iterator draw once more)
        if isinstance(state, dict) and isinstance(state.get("generators"), list):
            _restoring(_generators(self.loader), state["generators"], lambda: None)()

    def close(self) -> None:
        pass


class _InMemory:
    """Batches in a list: replaying them loads nothing, so the engine does, quietly."""

    quiet = True

    def state(self) -> None:
        return None

    def resume(self, state: Any, batches: int, restore: Callable[[], None]) -> None:
        return None

    def close(self) -> None:
        pass


def _restoring(
    generators: list[torch.Generator], states: list[Any], restore: Callable[[], None]
) -> Callable[[], None]:
    """Set ``generators`` to ``states``, then ``restore()`` the rest; once."""
    done = [False]

    def restore_all() -> None:
        if not done[0]:
            done[0] = True
            for generator, state in zip(generators, states, strict=False):
                generator.set_state(state)
            restore()

    return restore_all


def _generators(loader: DataLoader[Any]) -> list[torch.Generator]:
    """The distinct generators a loader and its samplers draw from."""
    found: dict[int, torch.Generator] = {}
    batch_sampler = loader.batch_sampler
    for owner in (loader, loader.sampler, batch_sampler, getattr(batch_sampler, "sampler", None)):
        generator = getattr(owner, "generator", None)
        if isinstance(generator, torch.Generator):
            found.setdefault(id(generator), generator)
    return list(found.values())


def _pack(batches: Sequence[Any]) -> Any:
    """Index batches as plain values: two tensors when they are integers."""
    flat: list[Any] = []
    sizes: list[int] = []
    for batch in batches:
        items = list(batch) if isinstance(batch, (list, tuple)) else [batch]
        flat.extend(items)
        sizes.append(len(items) if isinstance(batch, (list, tuple)) else -1)
    if all(isinstance(i, int) and not isinstance(i, bool) for i in flat):
        return {
            "indices": torch.tensor(flat, dtype=torch.int64),
            "sizes": torch.tensor(sizes, dtype=torch.int64),
        }
    return {"list": [list(b) if isinstance(b, (list, tuple)) else b for b in batches]}


def _unpack(packed: dict[str, Any]) -> list[Any]:
    if "list" in packed:
        return list(packed["list"])
    flat, out, at = packed["indices"].tolist(), [], 0
    for size in packed["sizes"].tolist():
        if size < 0:  # an index alone: no batching
            out.append(flat[at])
            at += 1
        else:
            out.append(flat[at : at + size])
            at += size
    return out

"""Writing checkpoints in the background (``Checkpoint(async_save=True)``).

``Writer`` writes plain checkpoint files. At a save the snapshot's tensors are copied
into one shared-memory buffer kept from one save to the next (the training goes on
changing the originals): which storage goes where is a ``_Plan`` made at the first save
and kept while the state's layout stays the same, so a save is one batched copy. A
writer process of its own (``serve``) rebuilds the tensors over that buffer and writes
them as ``format.save`` does, to the same bytes: pickling thousands of tensors in a
thread of the training's process would hold the GIL that the training waits for.

``Stager`` copies a state into CPU buffers kept from one call to the next, tensor by
tensor; the sharded writer (``sharded.saving.ShardedWriter``) stages its shards with
it, then ``torch.distributed.checkpoint`` writes them. An error a background write met
is raised by the next ``wait``: ``raise_background_error``.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import gc
import operator
import os
import pickle
import queue
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
import weakref
from collections.abc import Callable, Iterator
from itertools import chain
from pathlib import Path
from typing import IO, Any, TypeVar

import torch

from .._io import DiskFullError, raise_if_disk_full
from .format import check_loadable, torch_state, trainable_parameters, write

__all__ = [
    "Stager",
    "Writer",
    "all_finite",
    "become_writer_process",
    "fresh_interpreter_env",
    "nonfinite_error",
    "raise_background_error",
    "serve",
    "start_in_a_lasting_thread",
]

_Started = TypeVar("_Started")


def raise_background_error(error: BaseException, what: str, path: Path | None) -> None:
    """Raise, on the training thread, the error a background write of the ``what``
    ``path`` met: a full disk as the one ``DiskFullError`` naming it (found through what
    wrapped it), anything else as a ``RuntimeError`` naming it, the error chained."""
    if isinstance(error, DiskFullError):  # it names the file already
        raise error from None
    raise_if_disk_full(error, str(path))
    raise RuntimeError(
        f"writing {what} {str(path)!r} in the background failed: {type(error).__name__}: {error}"
    ) from error


#: the dtypes whose minimum and maximum, in one pass, say whether a tensor is finite
_MIN_MAX = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def all_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether no tensor of ``tensors`` holds NaN or inf, in one pass over each and one
    sync: a single or double tensor whose sum is finite holds none (a NaN or an inf makes
    any sum NaN or inf; summing is faster than a minimum and maximum), the other dtypes'
    minimum and maximum settle theirs (NaN propagates to both, an inf is one of them),
    with no temporary as large as the tensor (``isfinite().all()`` writes one and reads
    it again). Where a sum is not finite (a NaN, an inf, or an overflow of finite
    values), the summed tensors' minimum and maximum then settle it."""
    tensors = [torch.view_as_real(t) if t.is_complex() else t for t in tensors if t.numel()]
    summed = [t for t in tensors if t.dtype in _SUMMED]
    others = _verdicts([t for t in tensors if t.dtype not in _SUMMED], summed=False)
    if _verdict(others + _verdicts(summed, summed=True)):
        return True
    return _verdict(others) and _verdict(_verdicts(summed, summed=False))


def _verdicts(tensors: list[torch.Tensor], summed: bool) -> list[torch.Tensor]:
    """Whether each device's and dtype's ``tensors`` are finite, as boolean scalars (not
    read): by their sums (``summed``), else by their minimum and maximum where the dtype
    has them, else by ``isfinite``."""
    values: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    verdicts = []
    for tensor in tensors:
        if summed:
            values.setdefault((tensor.device, tensor.dtype), []).append(tensor.sum())
        elif tensor.dtype in _MIN_MAX:
            values.setdefault((tensor.device, tensor.dtype), []).extend(torch.aminmax(tensor))
        else:
            verdicts.append(tensor.isfinite().all())
    return verdicts + [torch.stack(group).isfinite().all() for group in values.values()]


def _verdict(verdicts: list[torch.Tensor]) -> bool:
    """Whether every one of ``verdicts`` (boolean scalars, on any devices) holds: one sync."""
    if not verdicts:
        return True
    device = verdicts[0].device
    return bool(torch.stack([verdict.to(device) for verdict in verdicts]).all())


def nonfinite_error(what: str, names: list[str]) -> FloatingPointError:
    """The error of a save refused because the parameters ``names`` hold NaN or inf
    (``what``: the checkpoint, as "of epoch 1, step 7"; no names: another process's)."""
    more = f" and {len(names) - 5} more" if len(names) > 5 else ""
    shown = (
        f"parameters {', '.join(names[:5])}{more}"
        if names
        else "parameters of another process's shards"
    )
    return FloatingPointError(
        f"not saving the checkpoint {what}: {shown} hold NaN or inf (the training "
        f"diverged), and the checkpoints before it are kept. Attach "
        f"runmodel.packs.NaNGuard() to skip (or stop at) the steps whose loss or gradients "
        f"are not finite, or lower the learning rate, and resume from the last good "
        f"checkpoint"
    )


class Writer:
    """Write checkpoints in the background, one at a time.

    ``submit`` copies the snapshot's tensors (on the caller's thread: the copy is the
    state at that moment, whatever the training changes next) into a shared-memory
    buffer reused from the previous save, and hands the rest of the snapshot to a
    writer process (started at the first save, one per ``Writer``), which writes the
    file that ``save`` writes, byte for byte; then ``then`` is called in a thread of this
    process. A ``submit`` while a write is under way waits for it first; ``wait`` waits
    for it and raises the error it met, naming the file. The buffer holds one more copy
    of the state in memory. The writer process dies with this one (Linux), so a process
    killed mid-save leaves at most a temporary file, which the next run removes.

    ``submit`` refuses a state whose ``module``'s parameters hold NaN or inf
    (``FloatingPointError`` naming them; nothing written, the checkpoints before it
    kept), from the copy: the parameters are laid out back to back per dtype in the
    buffer, so the check reads each of their bytes once, one pass a dtype
    (``checks_finite``; from a GPU it waits for the copy to read it).

    ``floor_s`` is what the last save's copy would take at the best copy bandwidth this
    writer measured (the state's bytes over it): the least a save can stall.
    """

    __slots__ = (
        "__weakref__",
        "_error",
        "_model",
        "_path",
        "_plan",
        "_process",
        "_thread",
        "floor_s",
    )

    #: ``submit`` checks the parameters of the ``module`` it is given: the ``Checkpoint``
    #: pack need not check them first
    checks_finite = True
    #: ``submit`` takes the model's part of the snapshot from the live module and
    #: optimizer it is given (``model_parts``), planned once: the ``Checkpoint`` pack's
    #: snapshot leaves it out (``engine.snapshot(model_state=False)``)
    writes_model_state = True

    def __init__(self) -> None:
        self._plan: _Plan | None = None
        self._model: _ModelPlan | None = None
        self._process: _Process | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._path: Path | None = None
        self.floor_s: float | None = None

    @property
    def busy(self) -> bool:
        """Whether a checkpoint is being written now."""
        return self._thread is not None and self._thread.is_alive()

    def submit(
        self,
        path: str | os.PathLike[str],
        snapshot: dict[str, Any],
        then: Callable[[], None] | None = None,
        module: torch.nn.Module | None = None,
        model_parts: tuple[torch.nn.Module | None, torch.optim.Optimizer | None] | None = None,
    ) -> None:
        """Write ``snapshot`` to ``path`` in the background, then call ``then`` there;
        waits for the write before, and raises its error. ``module``: the model's
        network, whose parameters the copy must hold finite (``checks_finite``).
        ``model_parts``: the module and optimizer whose ``format.torch_state`` is the
        model's part of the snapshot (its ``"model"``, None in ``snapshot``): taken from
        them live (``writes_model_state``), the same state a synchronous save holds."""
        self.wait()
        check_loadable(snapshot)
        tensors: list[torch.Tensor] = []
        model_state = None if model_parts is None else self._model_state(*model_parts, tensors)
        model = None if model_parts is None else self._model  # its tensors come first
        skeleton = _flatten(snapshot, tensors)
        plan = self._plan
        if plan is None or not plan.fits(tensors, module, model):
            plan = self._plan = _Plan(tensors, module, self._plan, model)
        inline = plan.copy(tensors)
        self.floor_s = plan.floor_s
        if plan.check.parameters:
            for event in plan.events:  # the copy from a GPU is read here: done first
                event.synchronize()
            if not plan.check.finite():  # nothing sent: the checkpoints before it stay
                raise nonfinite_error(_named(snapshot, Path(path)), plan.check.nonfinite())
        if self._process is None or not self._process.alive:
            self._process = _Process(self)
            plan.sent = False
        message = {"path": str(path), "skeleton": skeleton, "model": model_state, "inline": inline}
        if not plan.sent:
            message["layout"] = plan.layout()
            plan.sent = True
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        self._path = Path(path)
        self._thread = threading.Thread(
            target=self._run,
            args=(self._process, data, plan.events, then),
            name=f"runmodel checkpoint writer {self._path.name}",
            daemon=True,
        )
        self._thread.start()

    def _model_state(
        self,
        module: torch.nn.Module | None,
        optimizer: torch.optim.Optimizer | None,
        tensors: list[torch.Tensor],
    ) -> Any:
        """The model's part of the snapshot, ``torch_state(module, optimizer)``, as a
        skeleton (``_flatten``'s), its tensors appended to ``tensors``: from the plan of
        an earlier save while the state is the planned one, else built (and planned)."""
        planned = self._model
        if planned is not None and planned.module is module and planned.optimizer is optimizer:
            skeleton = planned.current()
            if skeleton is not None:
                tensors += planned.tensors
                return skeleton
        state = torch_state(module, optimizer)
        planned = _ModelPlan(module, optimizer, state)
        self._model = planned if planned.reusable else None
        if planned.reusable:
            tensors += planned.tensors
            return planned.skeleton
        return _flatten(state, tensors)

    def _run(
        self, process: _Process, data: bytes, events: list[Any], then: Callable[[], None] | None
    ) -> None:
        try:
            for event in events:  # the copies from a GPU are done
                event.synchronize()
            process.write(data)
            if then is not None:
                then()
        except BaseException as error:  # raised on the training thread by wait()
            self._error = error
            if not process.alive:
                self._plan = None  # a new process maps a new buffer

    def wait(self) -> None:
        """Block until the checkpoint being written is on disk; raise the error that
        writing it met (once), naming the file."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        try:
            thread.join()
        except BaseException:  # interrupted: still under way, wait again next time
            self._thread = thread
            raise
        error, self._error = self._error, None
        if error is not None:
            raise_background_error(error, "checkpoint", self._path)


def _named(snapshot: dict[str, Any], path: Path) -> str:
    """The checkpoint, in words: where a run resumed from it starts (its counters)."""
    counters = snapshot.get("engine", {}).get("counters", {})
    if "epoch" in counters and "step" in counters:
        return f"of epoch {counters['epoch']}, step {counters['step']}"
    return path.name


class _Slot:
    """Where the snapshot had a tensor, in what the writer process is sent (pickled by
    name: one global, then a reference to it)."""

    def __reduce__(self) -> str:
        return "_SLOT"


_SLOT = _Slot()


def _flatten(value: Any, tensors: list[torch.Tensor]) -> Any:
    """``value`` with its containers rebuilt and every tensor replaced by ``_SLOT``, the
    tensors appended to ``tensors`` in order (``_fill`` puts them back in that order).
    (A dict's plain tensors are taken in place: thousands of calls fewer a save.)"""
    if type(value) is dict:
        return {
            key: (tensors.append(item) or _SLOT)  # type: ignore[func-returns-value]
            if type(item) is torch.Tensor
            else item
            if type(item) in _ATOMS
            else _flatten(item, tensors)
            for key, item in value.items()
        }
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return _SLOT
    if isinstance(value, dict):
        rebuilt = copy.copy(value)  # keeps an OrderedDict's _metadata (module versions)
        for key, item in value.items():
            rebuilt[key] = (
                (tensors.append(item) or _SLOT)  # type: ignore[func-returns-value]
                if type(item) is torch.Tensor
                else _flatten(item, tensors)
            )
        return rebuilt
    if isinstance(value, list):
        return [item if type(item) in _ATOMS else _flatten(item, tensors) for item in value]
    if isinstance(value, tuple):
        return _tuple(value, [_flatten(item, tensors) for item in value])
    if isinstance(value, (str, int, float, bool, type(None), bytes)):
        return value
    return copy.deepcopy(value)


def _tuple(value: tuple[Any, ...], items: list[Any]) -> tuple[Any, ...]:
    """``value`` itself where ``items`` are its own items (no tensor in it: a tuple held
    in two places, as Adam's ``betas`` in each group, stays one object, which pickle
    writes once), else a tuple of its type holding ``items``."""
    if all(map(operator.is_, items, value)):
        return value
    return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)


#: values a snapshot holds as they are (its dicts' flags and counters: no call each)
_ATOMS = frozenset((str, int, float, bool, type(None), bytes))


def _fill(value: Any, tensors: Iterator[torch.Tensor]) -> Any:
    """``_flatten`` undone: each ``_SLOT`` of ``value`` replaced by the next tensor."""
    if value is _SLOT:
        return next(tensors)
    if isinstance(value, dict):
        for key, item in value.items():
            value[key] = _fill(item, tensors)
        return value
    if isinstance(value, list):
        value[:] = [_fill(item, tensors) for item in value]
        return value
    if isinstance(value, tuple):
        return _tuple(value, [_fill(item, tensors) for item in value])
    return value


_ALIGN = 64  # bytes: each storage's place in the buffer starts at a multiple of it


def _is_rare(tensor: torch.Tensor) -> bool:
    """A tensor that is not a plain strided one over a storage of its own values (sparse,
    quantized, meta, conjugate or negative views, other classes): copied whole at every
    save and sent with the snapshot."""
    return (
        type(tensor) not in _PLAIN_TENSORS
        or tensor.layout is not _STRIDED
        or tensor.is_quantized
        or tensor.is_meta
        or tensor.is_conj()
        or tensor.is_neg()
    )


_dtype = operator.attrgetter("dtype")
_grad = operator.attrgetter("requires_grad")


_SUMMED = (torch.float32, torch.float64)  # summed faster than their minimum and maximum


def _aligned(offset: int) -> int:
    return -(-offset // _ALIGN) * _ALIGN


def _laid_out(sizes: list[int], groups: list[list[int]]) -> tuple[list[tuple[int, int]], int]:
    """Each storage's (byte offset, bytes) in the buffer, and the buffer's bytes: the
    storages of each group back to back (no gap a check would read), then every other
    storage at a multiple of ``_ALIGN``."""
    places: list[tuple[int, int] | None] = [None] * len(sizes)
    offset = 0
    for group in groups:
        offset = _aligned(offset)
        for index in group:
            places[index] = (offset, sizes[index])
            offset += sizes[index]
    for index, size in enumerate(sizes):
        if places[index] is None:
            offset = _aligned(offset)
            places[index] = (offset, size)
            offset += size
    return [place for place in places if place is not None], _aligned(offset)


class _Checked:
    """The parameters of ``module`` whose staged copy a save checks finite (floating-point
    and complex ones; not buffers, not optimizer state: AMP's scaler and masks hold inf
    on purpose), found among the state's storages (``places``: by device, address and
    bytes). A parameter that is its whole storage joins its dtype's ``group`` (laid out
    back to back in the buffer: one pass a dtype); one that views part of a storage is
    checked over its view of the copy; one the state does not hold (a model's own
    ``state_dict``), live at each save."""

    def __init__(
        self, module: torch.nn.Module | None, places: dict[tuple[Any, ...], int], sizes: list[int]
    ) -> None:
        self.module = module
        by_dtype: dict[torch.dtype, dict[int, None]] = {}  # per dtype, its storages
        grouped: dict[int, torch.dtype] = {}
        #: per checked parameter: its name, and its storage's index and its view (None: loose)
        self.parameters: list[tuple[str, int | None, tuple[Any, ...]]] = []
        named = () if module is None else module.named_parameters()
        for name, parameter in named:
            if not (parameter.is_floating_point() or parameter.is_complex()):
                continue
            storage = parameter.untyped_storage()
            index = None
            if not _is_rare(parameter):
                index = places.get((parameter.device, storage.data_ptr(), storage.nbytes()))
            view = (
                parameter.dtype,
                parameter.storage_offset(),
                tuple(parameter.size()),
                tuple(parameter.stride()),
            )
            self.parameters.append((name, index, view))
            if (
                index is not None
                and parameter.storage_offset() == 0
                and parameter.nbytes == sizes[index]
                and parameter.is_contiguous()
                and grouped.setdefault(index, parameter.dtype) is parameter.dtype
            ):
                by_dtype.setdefault(parameter.dtype, {})[index] = None  # (tied: once)
        self.dtypes = list(by_dtype)
        self.groups = [list(group) for group in by_dtype.values()]
        self._grouped = grouped
        self.regions: list[torch.Tensor] = []  # what a save reads: one tensor a dtype, ...
        self.views: list[torch.Tensor] = []  # ... the parameters viewing part of a storage
        self.staged: list[tuple[str, torch.Tensor | None]] = []  # each one's copy, by name

    def over(self, buffer: torch.Tensor, storages: list[tuple[int, int]]) -> _Checked:
        """Point the check at the copy in ``buffer``, laid out as ``storages``."""
        whole = buffer.untyped_storage()
        for dtype, group in zip(self.dtypes, self.groups, strict=True):
            start = storages[group[0]][0]
            end = start + sum(storages[index][1] for index in group)
            self.regions.append(buffer[start:end].view(dtype))
        for name, index, (dtype, offset, size, stride) in self.parameters:
            if index is None:
                self.staged.append((name, None))
                continue
            itemsize = torch.empty(0, dtype=dtype).element_size()
            start = storages[index][0] // itemsize + offset
            staged = torch.empty(0, dtype=dtype).set_(whole, start, size, stride)
            self.staged.append((name, staged))
            if self._grouped.get(index) is not dtype:
                self.views.append(staged)
        return self

    def finite(self) -> bool:
        """Whether the copy's parameters hold no NaN or inf (and the loose ones): one
        pass over each dtype's region (``all_finite``)."""
        loose = [self._live(name) for name, staged in self.staged if staged is None]
        return all_finite([*self.regions, *self.views, *loose])

    def nonfinite(self) -> list[str]:
        """The names of the parameters that hold NaN or inf: read one by one (only after
        ``finite`` found some)."""
        return [
            name
            for name, staged in self.staged
            if not all_finite([self._live(name) if staged is None else staged])
        ]

    def _live(self, name: str) -> torch.Tensor:
        assert self.module is not None
        return self.module.get_parameter(name).detach()


class _Plan:
    """Where each storage of a state goes in the shared buffer, and the tensors over it:
    made at a save whose layout the previous plan does not fit, then one batched copy a
    save. A tensor whose storage is new at each save (a random generator's state) but
    has the same layout and is the only tensor over it takes its place. The state's
    first tensors may be a ``_ModelPlan``'s (``model``), which checks them itself."""

    def __init__(
        self,
        tensors: list[torch.Tensor],
        module: torch.nn.Module | None,
        previous: _Plan | None,
        model: _ModelPlan | None = None,
    ) -> None:
        self.sent = False  # the writer process has its layout
        self.module = module
        self.model = model
        #: the tensors that ``model`` checks (the first ones): ``fits`` checks the others
        self.fixed = 0 if model is None else len(model.tensors)
        self.floor_s: float | None = None
        #: bytes a second: the fastest copy of a state measured (a plan goes on from the last's)
        self.bandwidth: float = 0.0 if previous is None else previous.bandwidth
        #: each tensor of the state as the plan was made for it (their storages kept)
        self.tensors = list(tensors)
        self.rare = [i for i, t in enumerate(tensors) if _is_rare(t)]
        #: per storage, its (byte offset in the buffer, bytes); per tensor, None (a rare
        #: one) or (storage index, dtype, offset, size, stride, grad flag, Parameter,
        #: index of the first tensor that is the same object)
        self.leaves: list[tuple[Any, ...] | None] = []
        sizes: list[int] = []  # per storage, its bytes
        places: dict[tuple[Any, ...], int] = {}  # (device, address, bytes) -> storage
        firsts: dict[int, int] = {}
        owners: list[list[int]] = []  # per storage, the tensors over it
        for i, tensor in enumerate(tensors):
            same = firsts.setdefault(id(tensor), i)
            if _is_rare(tensor):
                self.leaves.append(None)
                continue
            storage = tensor.untyped_storage()
            size = storage.nbytes()
            key = (tensor.device, storage.data_ptr(), size)
            index = places.get(key)
            if index is None:
                index = places[key] = len(sizes)
                sizes.append(size)
                owners.append([])
            owners[index].append(i)
            self.leaves.append(
                (
                    index,
                    tensor.dtype,
                    tensor.storage_offset(),
                    tuple(tensor.size()),
                    tuple(tensor.stride()),
                    tensor.requires_grad,
                    type(tensor) is torch.nn.Parameter,
                    same,
                )
            )
        # what ``fits`` compares, for the tensors after the fixed ones
        rest = tensors[self.fixed :]
        self.same = [leaf[7] if leaf else i for i, leaf in enumerate(self.leaves)][self.fixed :]
        self.dtypes = list(map(_dtype, rest))
        self.grads = list(map(_grad, rest))
        self.types = list(map(type, rest))
        self.distinct = self.same == list(range(self.fixed, len(tensors)))
        checked = _Checked(module, places, sizes)
        #: per storage, its (byte offset in the buffer, bytes): the parameters' storages
        #: first, back to back per dtype, so that the finite check is one pass a dtype
        self.storages, self.nbytes = _laid_out(sizes, checked.groups)
        self.copied = sum(sizes)
        self.buffer, self.file = _shared_buffer(self.nbytes, previous)
        #: the check that the copy's parameters are finite
        self.check = checked.over(self.buffer, self.storages)
        # the copies: a tensor that is its whole storage as itself, else the storage's
        # bytes; `whole`: the tensors alone over their storage, which a new storage of the
        # same layout may replace (their source's index)
        self.targets: list[torch.Tensor] = []
        self.sources: list[torch.Tensor] = []
        self.whole: dict[int, int] = {}
        for (offset, size), over in zip(self.storages, owners, strict=True):
            if size == 0:
                continue
            source = tensors[over[0]]
            target = self.buffer[offset : offset + size]
            if source.storage_offset() == 0 and source.nbytes == size and source.is_contiguous():
                if len(over) == 1:
                    self.whole[over[0]] = len(self.sources)
                self.targets.append(target.view(source.dtype).view(source.shape))
                self.sources.append(source)
            else:  # its bytes, whatever views of it the state holds
                self.targets.append(target)
                self.sources.append(
                    torch.empty(0, dtype=torch.uint8, device=source.device).set_(
                        source.untyped_storage()
                    )
                )
        self.addresses = {t.untyped_storage().data_ptr() for t in self.sources}
        self.cuda = any(t.is_cuda for t in self.sources)
        self.events: list[Any] = []

    def fits(
        self,
        tensors: list[torch.Tensor],
        module: torch.nn.Module | None,
        model: _ModelPlan | None = None,
    ) -> bool:
        """Whether ``tensors`` have this plan's layout: each the same view of the same
        storage as the plan's (or a new storage of the same layout where the plan's
        tensor was its whole storage, which then takes its place), none the same object
        as another where the plan's were not, and ``module`` is the plan's (its
        parameters, where the state holds them, are then where the plan found them).
        The first tensors are ``model``'s, which found them unchanged: the plan's
        ``model`` is it. Checked at every save: a few calls a tensor, no copy of a size
        or stride."""
        if (
            self.rare
            or len(tensors) != len(self.tensors)
            or module is not self.module
            or model is not self.model
        ):
            return False
        fixed = self.fixed
        rest = tensors[fixed:] if fixed else tensors
        if self.distinct:
            if len(set(map(id, rest))) != len(rest):
                return False
        else:
            firsts: dict[int, int] = {}
            if [firsts.setdefault(id(t), i) for i, t in enumerate(rest, fixed)] != self.same:
                return False
        # each test one C-level pass over the state (map with the tensor methods: no
        # Python frame a tensor)
        if (
            list(map(_dtype, rest)) != self.dtypes
            or list(map(_grad, rest)) != self.grads
            or list(map(type, rest)) != self.types
        ):
            return False
        # the tensors that are the plan's own objects (an optimizer's state, the same at
        # every save) are their own view; the others (a module's state_dict(), detached
        # anew at every save) are compared with the plan's
        same = list(map(operator.is_, rest, self.tensors[fixed:]))
        if all(same):
            return True
        others = [i for i, kept in enumerate(same, fixed) if not kept]
        new = [tensors[i] for i in others]
        if any(map(torch.Tensor.is_conj, new)) or any(map(torch.Tensor.is_neg, new)):
            return False
        views = map(torch.Tensor.is_set_to, new, [self.tensors[i] for i in others])
        moved = [i for i, kept in zip(others, views, strict=True) if not kept]
        return not moved or self._move(tensors, moved)

    def _move(self, tensors: list[torch.Tensor], moved: list[int]) -> bool:
        """The tensors ``moved`` take their plan's places, if each has a new storage of
        its own, laid out as the plan's whole storage was."""
        addresses = set()
        for i in moved:
            new, old = tensors[i], self.tensors[i]
            if (
                i not in self.whole
                or _is_rare(new)
                or type(new) is not type(old)
                or new.dtype is not old.dtype
                or new.shape != old.shape
                or new.device != old.device
                or new.requires_grad is not old.requires_grad
                or new.storage_offset() != 0
                or not new.is_contiguous()
                or new.untyped_storage().nbytes() != new.nbytes
            ):
                return False
            addresses.add(new.untyped_storage().data_ptr())
        if len(addresses) != len(moved) or addresses & self.addresses:
            return False  # shared with another tensor of the state
        for i in moved:  # (the storage it replaces may be freed, its address reused)
            self.addresses.discard(self.tensors[i].untyped_storage().data_ptr())
            self.tensors[i] = tensors[i]
            self.sources[self.whole[i]] = tensors[i]
        self.addresses |= addresses
        return True

    def copy(self, tensors: list[torch.Tensor]) -> dict[int, torch.Tensor]:
        """Copy the state's tensors into the buffer (from a GPU: queued, ``events`` to
        wait for); the rare tensors' copies, by their index, to send whole."""
        started = time.perf_counter()
        with torch.no_grad():
            if self.targets:
                torch._foreach_copy_(self.targets, self.sources, non_blocking=self.cuda)
            inline = {i: tensors[i].detach().to("cpu", copy=True) for i in self.rare}
        self.events = []
        if self.cuda:  # the copies are queued on the device's stream
            for device in {t.device for t in self.sources if t.is_cuda}:
                event = torch.cuda.Event()
                event.record(torch.cuda.current_stream(device))
                self.events.append(event)
        else:
            took = time.perf_counter() - started
            if took > 0 and self.copied:
                self.bandwidth = max(self.bandwidth, self.copied / took)
        if self.bandwidth:
            self.floor_s = self.copied / self.bandwidth
        return inline

    def layout(self) -> dict[str, Any]:
        """What the writer process needs to rebuild the tensors over the buffer."""
        return {
            "file": self.file.name,
            "nbytes": max(self.nbytes, 1),
            "storages": self.storages,
            "leaves": self.leaves,
        }


#: what a module's part of ``state_dict()`` depends on: its tables (parameters, buffers,
#: children), the buffers it leaves out, its hooks
_TABLES = operator.attrgetter(
    "_parameters",
    "_buffers",
    "_modules",
    "_non_persistent_buffers_set",
    "_state_dict_pre_hooks",
    "_state_dict_hooks",
)
_MODULE = torch.nn.Module


class _Unfollowed(Exception):
    """A model's state that ``_ModelPlan`` does not follow from save to save."""


class _ModelPlan:
    """The model's part of a snapshot, ``torch_state(module, optimizer)``, planned from
    ``state``, the one built at a save: its skeleton (``_flatten``'s: each tensor a
    ``_SLOT``), its ``tensors`` (each module entry's detached view, each optimizer state
    itself, in the skeleton's order) and the live tensor each one is (the parameter or
    buffer in its module's table, the state where the optimizer keeps it).

    ``current()``, at the next saves, finds them again by identity, in C-level passes
    over the module's tables and the optimizer's state, no ``state_dict()`` built; checks
    each is still the view the plan copies (its storage, offset, size, stride, dtype);
    and refreshes what is not a tensor: which parameters train, the optimizer's
    hyperparameters (``param_groups``) and the states that are numbers. It returns None
    where anything changed (a module, parameter, buffer or state replaced, added or
    removed, a tensor's data swapped, a hook registered): planned again. ``reusable`` is
    False for a state the plan does not follow (a module's own ``state_dict`` or extra
    state, hooks, rare tensors, tensors among the hyperparameters): built at each save.
    """

    def __init__(
        self,
        module: torch.nn.Module | None,
        optimizer: torch.optim.Optimizer | None,
        state: dict[str, Any],
    ) -> None:
        self.module, self.optimizer = module, optimizer
        self.tensors: list[torch.Tensor] = []
        self.skeleton: dict[str, Any] = dict(state)
        self._live: list[torch.Tensor] = []  # what each of ``tensors`` is in the model
        self._views: list[torch.Tensor] = []  # ... the view of it the plan copies
        self._owners: list[torch.nn.Module] = []
        self._optimizer_live: list[torch.Tensor] = []
        self.reusable = True
        try:
            if module is not None:
                self.skeleton["module"] = self._plan_module(module, state["module"])
                # the parameters whose requires_grad the state records, by name
                self._names = list(state["requires_grad"])
                self._trained = [p for _, p in trainable_parameters(module)]
                if len(self._names) != len(self._trained):
                    raise _Unfollowed
            if optimizer is not None:
                self.skeleton["optimizer"] = self._plan_optimizer(optimizer, state["optimizer"])
            if any(map(_is_rare, self.tensors)):
                raise _Unfollowed
        except _Unfollowed:
            self.reusable = False
            return
        self._dtypes = list(map(_dtype, self._live))
        self._grads = list(map(_grad, self._optimizer_live))

    # -- the plan --------------------------------------------------------------------

    def _plan_module(self, module: torch.nn.Module, state: dict[str, Any]) -> dict[str, Any]:
        """The module's ``state_dict()`` as a skeleton; its entries' live tensors found
        in its modules' tables, in the order ``state_dict`` visits them."""
        owners, live = self._owners, self._live

        def visit(owner: torch.nn.Module) -> None:
            owners.append(owner)
            live.extend(p for p in owner._parameters.values() if p is not None)
            left_out = owner._non_persistent_buffers_set
            live.extend(
                b for name, b in owner._buffers.items() if b is not None and name not in left_out
            )
            for child in owner._modules.values():
                if child is not None:
                    visit(child)

        visit(module)
        values = list(state.values())
        if (
            type(state) is not collections.OrderedDict
            or len(values) != len(live)
            or not all(isinstance(value, torch.Tensor) for value in values)
            or not all(map(torch.Tensor.is_set_to, values, live))
            or any(_own_state_dict(kind) for kind in set(map(type, owners)))
        ):
            raise _Unfollowed
        tables = list(map(_TABLES, owners))
        if any(hooks for table in tables for hooks in table[4:]):
            raise _Unfollowed
        self._table_ids = list(map(id, chain.from_iterable(tables)))
        self._dicts = [table[i] for table in tables for i in (0, 1, 2)]
        self._keys = list(chain.from_iterable(self._dicts))
        self._value_ids = list(map(id, chain.from_iterable(map(dict.values, self._dicts))))
        self._left_out = [table[3] for table in tables]
        self._left_out_then = [set(names) for names in self._left_out]
        self._hooks = [hooks for table in tables for hooks in table[4:]]
        self.tensors += values
        self._views += values
        skeleton = collections.OrderedDict.fromkeys(state, _SLOT)
        skeleton.__dict__.update(vars(state))  # its _metadata (module versions)
        return skeleton

    def _plan_optimizer(
        self, optimizer: torch.optim.Optimizer, state: dict[str, Any]
    ) -> dict[str, Any]:
        """The optimizer's ``state_dict()`` as a skeleton: its per-parameter states are
        the optimizer's own dicts (their tensors the objects it keeps); its groups are
        built anew at each save, with the indices of this one."""
        if (
            optimizer._optimizer_state_dict_pre_hooks
            or optimizer._optimizer_state_dict_post_hooks
            or set(state) != {"state", "param_groups"}
            or _holds_tensor(state["param_groups"])
        ):
            raise _Unfollowed
        live = optimizer.state
        pers = list(state["state"].values())
        if list(map(id, pers)) != list(map(id, live.values())) or not all(
            isinstance(key, torch.Tensor) for key in live
        ):
            raise _Unfollowed
        self._state = live
        self._parameter_ids = list(map(id, live))
        self._per_ids = list(map(id, pers))
        self._plain: list[dict[str, Any]] = []  # the states of tensors alone
        self._mixed: list[tuple[dict[str, Any], dict[str, Any], dict[str, torch.Tensor]]] = []
        states: dict[Any, Any] = {}
        for index, per in state["state"].items():
            staged: dict[str, Any] = {}
            planned: dict[str, torch.Tensor] = {}
            for key, value in per.items():
                if isinstance(value, torch.Tensor):
                    staged[key] = _SLOT
                    planned[key] = value
                    self.tensors.append(value)
                    self._live.append(value)
                    self._optimizer_live.append(value)
                    self._views.append(value.detach())
                elif type(value) in _ATOMS:
                    staged[key] = value
                else:  # (a list of tensors, as L-BFGS keeps)
                    raise _Unfollowed
            if len(planned) == len(per):
                self._plain.append(per)
            else:
                self._mixed.append((per, staged, planned))
            states[index] = staged
        self._plain_keys = list(chain.from_iterable(self._plain))
        self._plain_ids = list(map(id, chain.from_iterable(map(dict.values, self._plain))))
        self._indices = [group["params"] for group in state["param_groups"]]
        self._group_ids = _group_ids(optimizer)
        return {"state": states, "param_groups": state["param_groups"]}

    # -- a save ----------------------------------------------------------------------

    def current(self) -> dict[str, Any] | None:
        """The skeleton with this moment's values that are not tensors, or None where
        the state is not the planned one any more."""
        if not (self._module_unchanged() and self._optimizer_unchanged()):
            return None
        live = self._live
        if (
            not all(map(torch.Tensor.is_set_to, live, self._views))
            or list(map(_dtype, live)) != self._dtypes
            or list(map(_grad, self._optimizer_live)) != self._grads
        ):
            return None
        skeleton = self.skeleton
        if self.module is not None:
            skeleton["requires_grad"] = dict(
                zip(self._names, map(_grad, self._trained), strict=True)
            )
        if self.optimizer is not None:
            groups = _packed_groups(self.optimizer, self._indices)
            if groups is None:
                return None
            skeleton["optimizer"]["param_groups"] = groups
        return skeleton

    def _module_unchanged(self) -> bool:
        """Whether the module's tables are the planned ones, holding the same keys and
        objects (parameters, buffers, children), the same buffers left out, no hooks."""
        if self.module is None:
            return True
        return (
            list(map(id, chain.from_iterable(map(_TABLES, self._owners)))) == self._table_ids
            and list(chain.from_iterable(self._dicts)) == self._keys
            and list(map(id, chain.from_iterable(map(dict.values, self._dicts)))) == self._value_ids
            and self._left_out == self._left_out_then
            and not any(self._hooks)
        )

    def _optimizer_unchanged(self) -> bool:
        """Whether the optimizer keeps the planned states (the same dicts, holding the
        same tensors; the numbers refreshed) for the same parameters, no hooks."""
        optimizer = self.optimizer
        if optimizer is None:
            return True
        live = optimizer.state
        if (
            optimizer._optimizer_state_dict_pre_hooks
            or optimizer._optimizer_state_dict_post_hooks
            or live is not self._state
            or list(map(id, live)) != self._parameter_ids
            or list(map(id, live.values())) != self._per_ids
            or list(chain.from_iterable(self._plain)) != self._plain_keys
            or list(map(id, chain.from_iterable(map(dict.values, self._plain)))) != self._plain_ids
            or _group_ids(optimizer) != self._group_ids
        ):
            return False
        for per, staged, planned in self._mixed:
            if list(per) != list(staged):
                return False
            for key, value in per.items():
                tensor = planned.get(key)
                if tensor is not None:
                    if value is not tensor:
                        return False
                elif type(value) in _ATOMS:
                    staged[key] = value
                else:
                    return False
        return True


def _own_state_dict(kind: type[torch.nn.Module]) -> bool:
    """Whether modules of class ``kind`` make their part of ``state_dict()`` their own way."""
    return (
        kind.state_dict is not _MODULE.state_dict
        or kind._save_to_state_dict is not _MODULE._save_to_state_dict
        or kind.get_extra_state is not _MODULE.get_extra_state
    )


def _group_ids(optimizer: torch.optim.Optimizer) -> tuple[list[int], list[int]]:
    """The sizes of the optimizer's groups, and their parameters by identity."""
    params = list(map(_PARAMS, optimizer.param_groups))
    return list(map(len, params)), list(map(id, chain.from_iterable(params)))


_PARAMS = operator.itemgetter("params")


def _packed_groups(
    optimizer: torch.optim.Optimizer, indices: list[list[int]]
) -> list[dict[str, Any]] | None:
    """The optimizer's ``param_groups`` as its ``state_dict()`` has them (the
    hyperparameters as they are now, ``params`` the indices), or None where one holds a
    tensor."""
    groups = []
    for group, params in zip(optimizer.param_groups, indices, strict=True):
        packed = {key: value for key, value in group.items() if key != "params"}
        if _holds_tensor(packed):
            return None
        packed["params"] = params  # (the plan's indices: ints)
        groups.append(packed)
    return groups


def _holds_tensor(value: Any) -> bool:
    """Whether ``value`` is or holds (in dicts, lists, tuples) a tensor."""
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, dict):
        return any(_holds_tensor(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return any(type(item) not in _ATOMS and _holds_tensor(item) for item in value)
    return False


class _SharedFile:
    """A file of ``nbytes`` in memory that another process can map: a memfd on Linux
    (gone with this process, however it ends), else a temporary file that the writer
    process removes once mapped."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
            self.fd: int | None = os.memfd_create("runmodel-checkpoint")
            self.name = f"/proc/{os.getpid()}/fd/{self.fd}"
        else:
            self.fd = None
            handle, self.name = tempfile.mkstemp(prefix="runmodel-checkpoint-")
            os.close(handle)
        try:
            os.truncate(self.fd if self.fd is not None else self.name, nbytes)
        except BaseException:
            self.close()
            raise
        self._closing = weakref.finalize(self, _close_shared, self.fd)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _close_shared(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


def _shared_buffer(nbytes: int, previous: _Plan | None) -> tuple[torch.Tensor, _SharedFile]:
    """A buffer of at least ``nbytes`` that the writer process can map: the previous
    plan's where it is large enough (a state that changed a little), else a new one."""
    if previous is not None and previous.file.nbytes >= nbytes and previous.file.fd is not None:
        return previous.buffer, previous.file
    shared = _SharedFile(max(nbytes, 1))
    buffer = torch.from_file(shared.name, shared=True, size=shared.nbytes, dtype=torch.uint8)
    return buffer, shared


class _Process:
    """The writer process of a ``Writer``, sent one pickled message a save and answering
    each with the error it met or None. On Linux it is forked from this process (as a
    DataLoader's workers are: no interpreter to start, no torch to import, nothing of
    the training's memory copied unless written); elsewhere it is a fresh interpreter
    (``_SERVE``). It runs in a session of its own (a Ctrl-C or a signal to the training's
    process group does not stop a write the run waits for) and dies with this process."""

    def __init__(self, owner: Writer) -> None:
        self._popen: subprocess.Popen[bytes] | None = None
        self._code: int | None = None
        if sys.platform == "linux":
            (self.pid, self._input, self._output), self._reaper = start_in_a_lasting_thread(
                _fork, self._reap
            )
        else:
            popen = self._popen = subprocess.Popen(
                [sys.executable, "-c", _SERVE, str(os.getpid())],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=fresh_interpreter_env(),
                start_new_session=True,
            )
            assert popen.stdin is not None and popen.stdout is not None
            self.pid, self._input, self._output = popen.pid, popen.stdin, popen.stdout
        # its input closed with the Writer: it ends
        weakref.finalize(owner, _stop, self._input)

    def _reap(self, forked: tuple[int, IO[bytes], IO[bytes]]) -> None:
        with contextlib.suppress(ChildProcessError):  # (reaped by someone else: no code)
            self._code = os.waitstatus_to_exitcode(os.waitpid(forked[0], 0)[1])

    @property
    def alive(self) -> bool:
        if self._popen is not None:
            return self._popen.poll() is None
        return self._reaper.is_alive()

    def _exit_code(self) -> int | None:
        if self._popen is not None:
            return self._popen.wait()
        self._reaper.join()
        return self._code

    def write(self, data: bytes) -> None:
        """Send one save; return once it is written, or raise the error it met."""
        reply = _exchange(self._input, self._output, data)
        if reply is None:
            raise RuntimeError(
                f"the checkpoint writer process ended (exit code {self._exit_code()}) "
                f"before the write was done"
            )
        _raise_reply(reply)


def start_in_a_lasting_thread(
    start: Callable[[], _Started], wait: Callable[[_Started], object]
) -> tuple[_Started, threading.Thread]:
    """``start()`` (it starts a process that dies with this one, PR_SET_PDEATHSIG) in a
    thread of its own that then runs ``wait`` on what it returned; what ``start``
    returned (or raised), and that thread. Linux sends that signal at the end of the
    *thread* that started the process, and the thread that asks for a save (a run
    trained in a notebook's or a server's thread) may end long before its writer."""
    started: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def run() -> None:
        try:
            process = start()
        except BaseException as error:
            started.put(error)
            return
        started.put(process)
        wait(process)

    thread = threading.Thread(target=run, daemon=True, name="runmodel-checkpoint-writer")
    thread.start()
    process = started.get()
    if isinstance(process, BaseException):
        raise process
    return process, thread


def _fork() -> tuple[int, IO[bytes], IO[bytes]]:
    """A writer process forked from this one: its id, and the streams to and from it.
    The child keeps only its two pipes (another writer's pipe held open would hide that
    writer's end of input), serves, and leaves with ``os._exit``: nothing of this
    process's (its exit handlers, its buffered output) runs twice."""
    to_child, from_parent = os.pipe()[::-1]
    from_child, to_parent = os.pipe()
    parent = os.getpid()
    with warnings.catch_warnings():  # Python 3.12+: "multi-threaded, fork() may deadlock":
        warnings.simplefilter("ignore", DeprecationWarning)  # the child takes no lock
        pid = os.fork()  # of another thread's; it only serves
    if pid == 0:  # the writer process
        code = 1
        try:
            gc.freeze()  # this process's objects: never finalized here (their files closed)
            keep = sorted((from_parent, to_parent))
            os.closerange(3, keep[0])
            os.closerange(keep[0] + 1, keep[1])
            os.closerange(keep[1] + 1, os.sysconf("SC_OPEN_MAX"))
            os.setsid()
            # a signal the training's process handles is that process's: blocked here
            handled = [n for n in signal.valid_signals() if callable(signal.getsignal(n))]
            signal.pthread_sigmask(signal.SIG_BLOCK, handled)
            serve(parent, os.fdopen(from_parent, "rb"), os.fdopen(to_parent, "wb"))
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(from_parent)
    os.close(to_parent)
    return pid, os.fdopen(to_child, "wb"), os.fdopen(from_child, "rb")


def fresh_interpreter_env() -> dict[str, str]:
    """The environment of a writer process started as a new interpreter: this one's,
    with the runmodel this process imported first on its path, and one thread."""
    here = str(Path(__file__).resolve().parents[2])
    paths = [here, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "OMP_NUM_THREADS": "1"}


#: what a fresh writer process runs (``python -c``; its argument: this process's id)
_SERVE = (
    "import sys; from runmodel.checkpoint.writer import serve; "
    "serve(int(sys.argv[1]), sys.stdin.buffer, sys.stdout.buffer)"
)


def _stop(stream: IO[bytes]) -> None:
    with contextlib.suppress(OSError):
        stream.close()


_LENGTH = struct.Struct("<Q")


def _send(stream: IO[bytes], data: bytes) -> None:
    stream.write(_LENGTH.pack(len(data)))
    stream.write(data)
    stream.flush()


def _exchange(to: IO[bytes], back: IO[bytes], data: bytes) -> bytes | None:
    """Send a writer process one message and read its reply; None where it ended first."""
    try:
        _send(to, data)
        return _receive(back)
    except (OSError, EOFError):
        return None


def _receive(stream: IO[bytes]) -> bytes | None:
    """One message, or None at the end of the stream."""
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        return None
    size = _LENGTH.unpack(head)[0]
    data = stream.read(size)
    if len(data) < size:
        return None
    return data


def _reply(answer: Exception | None) -> bytes:
    """A writer process's answer to one save: None once written, else the error it met
    (a full disk as its errno and file: a ``DiskFullError``'s arguments are not its
    args; an error that does not pickle as its words)."""
    sent: Any = answer
    if isinstance(answer, DiskFullError):
        sent = (answer.errno, answer.filename)
    try:
        reply = pickle.dumps(sent)
        pickle.loads(reply)
    except Exception:
        reply = pickle.dumps(RuntimeError(f"{type(answer).__name__}: {answer}"))
    return reply


def _raise_reply(reply: bytes) -> None:
    """Raise the error a writer process's ``_reply`` carries, if any."""
    error = pickle.loads(reply)
    if isinstance(error, tuple):  # a full disk: (errno, the file)
        raise DiskFullError(*error)
    if error is not None:
        raise error


def become_writer_process(parent: int) -> bool:
    """Make this process a writer process of the training process ``parent`` (both
    writers': the plain and the sharded one); False where ``parent`` is gone already. It
    dies with ``parent`` (Linux); a write past the file-size limit fails with EFBIG
    instead of ending it; Ctrl-C and a preemption's SIGTERM (a scheduler signals every
    process of a job) are blocked, not handled: the training process acts on them, waits
    for the write, saves and ends, and this process with it; one thread; what anything
    prints goes to stderr, apart from the answers on stdout."""
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        return False
    if hasattr(signal, "pthread_sigmask"):  # POSIX
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM})
    torch.set_num_threads(1)
    sys.stdout = sys.stderr
    return True


def serve(parent: int, source: IO[bytes], answers: IO[bytes]) -> None:
    """The writer process (``Writer``): for each message of ``source``, write the
    checkpoint it describes, its tensors rebuilt over the shared buffer, and answer the
    error it met on ``answers`` (None once written); end with its input. It dies with
    its ``parent`` (Linux), and a file past the file-size limit is an error, not its
    death."""
    if not become_writer_process(parent):
        return
    tensors: list[torch.Tensor] = []
    while True:
        data = _receive(source)
        if data is None:
            return
        try:
            message = pickle.loads(data)
            if "layout" in message:
                tensors = _rebuild(message["layout"])
            inline = message["inline"]
            leaves = (inline.get(i, tensor) for i, tensor in enumerate(tensors))
            model = message["model"]  # (taken from the live model: its tensors come first)
            if model is not None:
                model = _fill(model, leaves)
            snapshot = _fill(message["skeleton"], leaves)
            if model is not None:
                snapshot["model"] = model
            write(Path(message["path"]), snapshot)
            answer: Any = None
        except Exception as error:
            answer = error
        _send(answers, _reply(answer))


def _rebuild(layout: dict[str, Any]) -> list[torch.Tensor]:
    """The state's tensors over the shared buffer, as ``_Plan`` laid them out: each
    storage its own (so the file is the one ``save`` writes), the same object where the
    state had it twice. A temporary file goes once mapped."""
    name = layout["file"]
    buffer = torch.from_file(name, shared=True, size=layout["nbytes"], dtype=torch.uint8)
    if not name.startswith("/proc/"):
        os.unlink(name)
    whole = buffer.untyped_storage()
    storages = [whole[offset : offset + size] for offset, size in layout["storages"]]
    tensors: list[torch.Tensor] = []
    for i, leaf in enumerate(layout["leaves"]):
        if leaf is None:  # a rare tensor: sent with each save
            tensors.append(torch.empty(0))
            continue
        index, dtype, offset, size, stride, grad, parameter, same = leaf
        if same != i:
            tensors.append(tensors[same])
            continue
        tensor = torch.empty(0, dtype=dtype).set_(storages[index], offset, size, stride)
        tensors.append(
            torch.nn.Parameter(tensor, grad) if parameter else tensor.requires_grad_(grad)
        )
    return tensors


class _Copy:
    """The CPU copy of one storage: its buffer, and the tensors over it that saves staged,
    by dtype, offset, size, stride, grad flag and class: the same state saved again finds
    its tensors ready, so a save costs the copy, not the making of views."""

    __slots__ = ("buffer", "views")

    def __init__(self, buffer: torch.UntypedStorage) -> None:
        self.buffer = buffer
        self.views: dict[tuple[Any, ...], torch.Tensor] = {}

    def new_view(self, key: tuple[Any, ...]) -> torch.Tensor:
        """A staged tensor over this copy with the dtype, offset, size, stride, grad flag
        and class in ``key``, kept for the next saves."""
        dtype, offset, size, stride, grad, kind = key
        staged = torch.empty(0, dtype=dtype).set_(self.buffer, offset, size, stride)
        # a Parameter stays one (a synchronous save pickles it so), over the copy
        staged = staged.requires_grad_(grad) if kind is torch.Tensor else kind(staged, grad)
        if len(self.views) >= _MOST_VIEWS:  # a state whose views keep changing: start over
            self.views.clear()
        self.views[key] = staged
        return staged


_MOST_VIEWS = 64  # kept per storage
_Copies = dict[tuple[torch.device, int, int], _Copy]
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
_STRIDED = torch.strided


class Stager:
    """Copies of states into CPU buffers kept from one call to the next: ``stage(value)``
    is ``value`` with every container rebuilt and every tensor copied to the CPU, into a
    buffer of the previous call's where one fits (the buffers it did not use are freed).
    Tensors that shared a storage share the copy, so the file is the one ``save``
    writes. ``other(tensor, stage_tensor)``, for tensors of another class than
    ``torch.Tensor`` and ``Parameter``, stages them (the sharded writer's DTensors:
    their local shard through ``stage_tensor``); by default they are copied plainly."""

    def __init__(
        self,
        other: Callable[[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]], torch.Tensor | None]
        | None = None,
    ) -> None:
        self._buffers: _Copies = {}
        self._fresh: _Copies = {}
        self._devices: set[torch.device] = set()
        # this call's copies, (targets, sources), made together at its end: one call of
        # torch._foreach_copy_ costs a third of a Python copy_ per tensor; from a GPU apart
        # (into pinned buffers, without waiting)
        self._copies: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])
        self._gpu_copies: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])
        self._other = other

    def stage(self, value: Any) -> tuple[Any, list[Any]]:
        """``value`` staged, and the CUDA events its copies are queued before (to be
        synchronized with before the copy is read: pinned buffers, copied without
        waiting)."""
        self._fresh, self._devices = {}, set()
        try:
            with torch.no_grad():  # staged copies of parameters are leaves keeping their flag
                staged = self._stage_value(value)
                for (targets, sources), gpu in ((self._copies, False), (self._gpu_copies, True)):
                    if targets:
                        torch._foreach_copy_(targets, sources, non_blocking=gpu)
        finally:
            self._buffers, self._fresh = self._fresh, {}  # the unused buffers are freed
            for targets, sources in (self._copies, self._gpu_copies):
                targets.clear()
                sources.clear()
        events = []
        for device in self._devices:  # the copies are queued on the device's stream
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(device))
            events.append(event)
        return staged, events

    def _stage_value(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return self.stage_tensor(value)
        if type(value) is dict:
            return {key: self._stage_value(item) for key, item in value.items()}
        if isinstance(value, dict):
            staged = copy.copy(value)  # keeps an OrderedDict's _metadata (module versions)
            for key, item in value.items():
                staged[key] = self._stage_value(item)
            return staged
        if isinstance(value, list):
            return [self._stage_value(item) for item in value]
        if isinstance(value, tuple):
            items = [self._stage_value(item) for item in value]
            return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
        if isinstance(value, (str, int, float, bool, type(None), bytes)):
            return value
        return copy.deepcopy(value)

    def stage_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor``'s staged copy (during ``stage``; its values are copied at the end of
        ``stage``)."""
        kind = type(tensor)
        if kind not in _PLAIN_TENSORS and self._other is not None:
            staged_other = self._other(tensor, self.stage_tensor)
            if staged_other is not None:
                return staged_other
        # (the tensor's flags, not its device's .type: a string made at every call)
        if (
            kind not in _PLAIN_TENSORS
            or tensor.layout is not _STRIDED
            or tensor.is_quantized
            or tensor.is_meta
            or tensor.is_conj()
            or tensor.is_neg()
        ):
            return tensor.detach().to("cpu", copy=True)  # rare kinds: a plain blocking copy
        storage = tensor.untyped_storage()
        nbytes = storage.nbytes()
        if nbytes == 0:
            return torch.empty_strided(tensor.size(), tensor.stride(), dtype=tensor.dtype)
        device = tensor.device
        key = (device, storage.data_ptr(), nbytes)
        target = self._fresh.get(key)
        copied = target is not None  # by an earlier tensor of this storage in this call
        if target is None:
            target = self._buffers.pop(key, None)
            if target is None:
                target = _Copy(
                    torch.empty(
                        nbytes, dtype=torch.uint8, pin_memory=tensor.is_cuda
                    ).untyped_storage()
                )
            self._fresh[key] = target
        offset = tensor.storage_offset()
        view_key = (
            tensor.dtype,
            offset,
            tensor.size(),
            tensor.stride(),
            tensor.requires_grad,
            kind,
        )
        staged = target.views.get(view_key)
        if staged is None:
            staged = target.new_view(view_key)
        if not copied:  # the whole storage, once: its other tensors (views, ties) share it
            targets, sources = self._gpu_copies if tensor.is_cuda else self._copies
            if offset == 0 and tensor.nbytes == nbytes and tensor.is_contiguous():
                targets.append(staged)  # the tensor is the storage: copied as itself
                sources.append(tensor)
            else:
                targets.append(torch.empty(0, dtype=torch.uint8).set_(target.buffer))
                sources.append(torch.empty(0, dtype=torch.uint8, device=device).set_(storage))
            if tensor.is_cuda:
                self._devices.add(device)
        return staged

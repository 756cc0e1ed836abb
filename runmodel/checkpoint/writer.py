"""Writing checkpoints in the background (``Checkpoint(async_save=True)``).

``Writer`` writes plain checkpoint files: the snapshot's tensors are copied into CPU
buffers kept from one save to the next (the training goes on changing the originals),
and a thread writes the copy as ``format.save`` does. ``Stager`` is that copy; the
sharded writer (``sharded.saving.ShardedWriter``) stages its shards with it too, then
``torch.distributed.checkpoint`` writes them. An error a background write met is raised
by the next ``wait``: ``raise_background_error``.
"""

from __future__ import annotations

import copy
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .._io import DiskFullError, raise_if_disk_full
from .format import check_loadable, write

__all__ = ["Stager", "Writer", "raise_background_error"]


def raise_background_error(error: BaseException, what: str, path: Path | None) -> None:
    """Raise, on the training thread, the error a background write of the ``what``
    ``path`` met: a full disk as the one ``DiskFullError`` naming it (found through what
    wrapped it), anything else as a ``RuntimeError`` naming it, the error chained."""
    if isinstance(error, DiskFullError):  # it names the file already
        raise error
    raise_if_disk_full(error, str(path))
    raise RuntimeError(
        f"writing {what} {str(path)!r} in the background failed: {type(error).__name__}: {error}"
    ) from error


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


class Writer:
    """Write checkpoints in a background thread, one at a time.

    ``submit`` copies the snapshot's tensors (on the caller's thread: the copy is the
    state at that moment, whatever the training changes next) into CPU buffers reused
    from the previous save (pinned, and copied without waiting, for CUDA tensors), and
    starts a thread that writes the copy as ``save`` does, then calls ``then``. A
    ``submit`` while a write is under way waits for it first; ``wait`` waits for it and
    raises the error it met, naming the file. The buffers hold one more copy of the
    state in CPU memory.
    """

    __slots__ = ("_error", "_path", "_stager", "_thread")

    def __init__(self) -> None:
        self._stager = Stager()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._path: Path | None = None

    @property
    def busy(self) -> bool:
        """Whether a checkpoint is being written now."""
        return self._thread is not None and self._thread.is_alive()

    def submit(
        self,
        path: str | os.PathLike[str],
        snapshot: dict[str, Any],
        then: Callable[[], None] | None = None,
    ) -> None:
        """Write ``snapshot`` to ``path`` in the background, then call ``then`` there;
        waits for the write before, and raises its error."""
        self.wait()
        check_loadable(snapshot)
        staged, events = self._stager.stage(snapshot)
        self._path = Path(path)
        self._thread = threading.Thread(
            target=self._run,
            args=(self._path, staged, events, then),
            name=f"runmodel checkpoint writer {self._path.name}",
            daemon=True,
        )
        self._thread.start()

    def _run(
        self, path: Path, staged: dict[str, Any], events: list[Any], then: Callable[[], None] | None
    ) -> None:
        try:
            for event in events:
                event.synchronize()
            write(path, staged)
            if then is not None:
                then()
        except BaseException as error:  # raised on the training thread by wait()
            self._error = error

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

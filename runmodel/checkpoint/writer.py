"""Writing checkpoints in the background (``Checkpoint(async_save=True)``).

``Writer`` writes plain checkpoint files: the snapshot's tensors are copied into CPU
buffers kept from one save to the next (the training goes on changing the originals),
and a thread writes the copy as ``format.save`` does. (Sharded checkpoints have their
own, ``sharded.saving.ShardedWriter``, over ``torch.distributed.checkpoint``'s async
save.) An error a background write met is raised by the next ``wait``:
``raise_background_error``.
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

__all__ = ["Writer", "raise_background_error"]


def raise_background_error(error: BaseException, what: str, path: Path | None) -> None:
    """Raise, on the training thread, the error a background write of the ``what``
    ``path`` met: a full disk as the one ``DiskFullError`` naming it (found through what
    wrapped it), anything else as a ``RuntimeError`` naming it, the error chained."""
    if isinstance(error, DiskFullError):  # it names the file already
        raise error
    raise_if_disk_full(error, str(path))
    raise RuntimeError(f"writing {what} {str(path)!r} in the background failed: "
                       f"{type(error).__name__}: {error}") from error


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

    __slots__ = ("_buffers", "_error", "_path", "_thread")

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, int, int], torch.UntypedStorage] = {}
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._path: Path | None = None

    @property
    def busy(self) -> bool:
        """Whether a checkpoint is being written now."""
        return self._thread is not None and self._thread.is_alive()

    def submit(self, path: str | os.PathLike[str], snapshot: dict[str, Any],
               then: Callable[[], None] | None = None) -> None:
        """Write ``snapshot`` to ``path`` in the background, then call ``then`` there;
        waits for the write before, and raises its error."""
        self.wait()
        check_loadable(snapshot)
        fresh: dict[tuple[str, int, int], torch.UntypedStorage] = {}
        devices: set[torch.device] = set()
        staged = _stage(snapshot, self._buffers, fresh, devices)
        self._buffers = fresh  # buffers this snapshot did not use are freed
        events = []
        for device in devices:  # the copies are queued on the device's stream
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(device))
            events.append(event)
        self._path = Path(path)
        self._thread = threading.Thread(target=self._run, args=(self._path, staged, events, then),
                                        name=f"runmodel checkpoint writer {self._path.name}",
                                        daemon=True)
        self._thread.start()

    def _run(self, path: Path, staged: dict[str, Any], events: list[Any],
             then: Callable[[], None] | None) -> None:
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


def _stage(value: Any, buffers: dict[tuple[str, int, int], torch.UntypedStorage],
           fresh: dict[tuple[str, int, int], torch.UntypedStorage],
           devices: set[torch.device]) -> Any:
    """``value`` with every container rebuilt and every tensor copied to the CPU, into
    ``buffers`` where one fits (moved to ``fresh``). Tensors that shared a storage share
    the copy, so the file is the one ``save`` writes."""
    if isinstance(value, torch.Tensor):
        return _stage_tensor(value, buffers, fresh, devices)
    if isinstance(value, dict):
        staged = copy.copy(value)  # keeps an OrderedDict's _metadata (module versions)
        for key, item in value.items():
            staged[key] = _stage(item, buffers, fresh, devices)
        return staged
    if isinstance(value, list):
        return [_stage(item, buffers, fresh, devices) for item in value]
    if isinstance(value, tuple):
        items = [_stage(item, buffers, fresh, devices) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, (str, int, float, bool, type(None), bytes)):
        return value
    return copy.deepcopy(value)


def _stage_tensor(tensor: torch.Tensor,
                  buffers: dict[tuple[str, int, int], torch.UntypedStorage],
                  fresh: dict[tuple[str, int, int], torch.UntypedStorage],
                  devices: set[torch.device]) -> torch.Tensor:
    if (type(tensor) not in (torch.Tensor, torch.nn.Parameter) or tensor.layout != torch.strided
            or tensor.is_quantized or tensor.is_conj() or tensor.is_neg()
            or tensor.device.type == "meta"):
        return tensor.detach().to("cpu", copy=True)  # rare kinds: a plain blocking copy
    storage = tensor.untyped_storage()
    nbytes = storage.nbytes()
    if nbytes == 0:
        return torch.empty_strided(tensor.size(), tensor.stride(), dtype=tensor.dtype)
    key = (str(tensor.device), storage.data_ptr(), nbytes)
    buffer = fresh.get(key)
    if buffer is None:  # the first tensor of this storage: copy the whole storage
        buffer = buffers.pop(key, None)
        cuda = tensor.device.type == "cuda"
        if buffer is None:
            buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda).untyped_storage()
        source = torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(storage)
        torch.empty(0, dtype=torch.uint8).set_(buffer).copy_(source, non_blocking=cuda)
        if cuda:
            devices.add(tensor.device)
        fresh[key] = buffer
    staged = torch.empty(0, dtype=tensor.dtype).set_(buffer, tensor.storage_offset(),
                                                     tensor.size(), tensor.stride())
    return staged.requires_grad_() if tensor.requires_grad else staged

"""The writer processes of async sharded saves (``saving.ShardedWriter``).

Every process of the run starts one writer process (a fresh interpreter, ``serve``),
and the writer processes form a gloo process group of their own, rank for rank. The
training process stages its shards into buffers laid out in one shared-memory file
(``Arena``); the writer process maps that file and rebuilds the staged state over it
once (``describe`` and ``rebuild``: DTensors over its views, on a mesh of its own group),
then each save is one small message: where to write, the run state, and the optimizer's
values that are not tensors. The writer process runs DCP's planning and ``torch.save`` of
every item, so none of it holds the training's GIL; it holds the staging folder's shared
lock while it writes, and dies with the training process (Linux).
"""

from __future__ import annotations

import contextlib
import datetime
import io
import os
import pickle
import socket
import subprocess
import sys
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch

from ..writer import (
    _ALIGN,
    _aligned,
    _exchange,
    _raise_reply,
    _receive,
    _reply,
    _send,
    _SharedFile,
    _stop,
    become_writer_process,
    fresh_interpreter_env,
    start_in_a_lasting_thread,
)

__all__ = ["Arena", "WriterProcess", "describe", "free_port", "rebuild", "refresh", "room", "serve"]


def room(tensor: torch.Tensor) -> int:
    """The bytes a CPU buffer like ``tensor`` (``empty_like``'s layout) takes in an
    ``Arena``, its alignment included; 0 for the kinds not staged there."""
    if tensor.layout is not torch.strided or tensor.is_quantized or tensor.is_meta:
        return 0
    if tensor.is_contiguous():
        return _aligned(tensor.numel() * tensor.element_size()) + _ALIGN
    probe = torch.empty_like(tensor, device="meta")
    return _aligned(probe.untyped_storage().nbytes()) + _ALIGN


class Arena:
    """Room for a save's staged buffers in one shared-memory file that the writer process
    maps: each buffer taken in turn, at a multiple of 64 bytes. ``previous``'s file is
    kept where it is large enough (a state planned again)."""

    def __init__(self, nbytes: int, previous: Arena | None = None) -> None:
        self.file: _SharedFile
        self.buffer: torch.Tensor
        if previous is not None and previous.file.nbytes >= nbytes and previous.file.fd is not None:
            self.file, self.buffer = previous.file, previous.buffer
        else:
            self.file = _SharedFile(max(nbytes, 1))
            self.buffer = torch.from_file(
                self.file.name, shared=True, size=self.file.nbytes, dtype=torch.uint8
            )
        self._whole = self.buffer.untyped_storage()
        self._taken = 0

    def take(self, dtype: torch.dtype, numel: int) -> torch.Tensor:
        """A flat buffer of ``numel`` elements."""
        return self._view(torch.empty(numel, dtype=dtype, device="meta"))

    def like(self, tensor: torch.Tensor) -> torch.Tensor:
        """A buffer like ``tensor`` (its shape, dtype and ``empty_like``'s strides)."""
        return self._view(torch.empty_like(tensor, device="meta"))

    def _view(self, probe: torch.Tensor) -> torch.Tensor:
        start = _aligned(self._taken)
        end = start + probe.untyped_storage().nbytes()
        if end > self.file.nbytes:  # (the room was counted before: a bug)
            raise RuntimeError(f"the staging file holds {self.file.nbytes} bytes, not {end}")
        self._taken = end
        return torch.empty(0, dtype=probe.dtype).set_(
            self._whole, start // probe.element_size(), probe.shape, probe.stride()
        )

    def holds(self, tensor: torch.Tensor) -> bool:
        return tensor.untyped_storage().data_ptr() == self._whole.data_ptr()


class Leaf(NamedTuple):
    """A staged tensor, as the writer process rebuilds it: where its local tensor is in
    the shared file (byte offset, dtype, shape, stride), or the tensor itself (a rare
    kind, sent whole); for a DTensor, its mesh (an index in the layout's meshes), its
    placements, global shape and stride."""

    local: tuple[int, torch.dtype, tuple[int, ...], tuple[int, ...]] | torch.Tensor
    mesh: int | None = None
    placements: tuple[Any, ...] = ()
    shape: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()


def describe(staged: Any, arena: Arena) -> dict[str, Any]:
    """What the writer process needs to rebuild ``staged`` over ``arena``'s file: the
    structure with each tensor a ``Leaf``, and each DTensor mesh's ranks and names."""
    from torch.distributed.tensor import DTensor

    meshes: dict[int, int] = {}
    described: list[tuple[list[list[int]] | list[int], Any]] = []

    def local(tensor: torch.Tensor) -> Leaf:
        if not arena.holds(tensor):
            return Leaf(tensor)
        offset = int(tensor.storage_offset()) * tensor.element_size()
        return Leaf((offset, tensor.dtype, tuple(tensor.shape), tuple(tensor.stride())))

    def walk(value: Any) -> Any:
        if isinstance(value, DTensor):
            mesh = value.device_mesh
            if id(mesh) not in meshes:
                meshes[id(mesh)] = len(described)
                described.append((mesh.mesh.tolist(), mesh.mesh_dim_names))
            return local(value._local_tensor)._replace(
                mesh=meshes[id(mesh)],
                placements=tuple(value.placements),
                shape=tuple(value.shape),
                stride=tuple(value.stride()),
            )
        if isinstance(value, torch.Tensor):
            return local(value)
        if isinstance(value, dict):
            return {key: walk(item) for key, item in value.items()}
        if isinstance(value, list):
            return [walk(item) for item in value]
        return value

    state = walk(staged)
    return {
        "file": arena.file.name,
        "nbytes": arena.file.nbytes,
        "meshes": described,
        "state": state,
    }


def rebuild(layout: dict[str, Any], kept: dict[Any, Any]) -> Any:
    """``describe`` undone in the writer process: the staged state over the shared file,
    its DTensors on CPU meshes of this process's group. ``kept``: the meshes made (once
    each), and a temporary file mapped (removed once mapped, so kept for a later layout
    over it; a memfd, under ``/proc``, is mapped anew: its name may be another's later)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor

    name, nbytes = layout["file"], layout["nbytes"]
    buffer = kept.get(("file", name, nbytes))
    if buffer is None:
        buffer = torch.from_file(name, shared=True, size=nbytes, dtype=torch.uint8)
        if not name.startswith("/proc/"):
            os.unlink(name)
            kept[("file", name, nbytes)] = buffer
    whole = buffer.untyped_storage()
    made = []
    for ranks, names in layout["meshes"]:
        key = ("mesh", repr(ranks), names)
        if key not in kept:
            kept[key] = DeviceMesh("cpu", torch.tensor(ranks), mesh_dim_names=names)
        made.append(kept[key])

    def walk(value: Any) -> Any:
        if isinstance(value, Leaf):
            if isinstance(value.local, torch.Tensor):
                tensor = value.local
            else:
                offset, dtype, shape, stride = value.local
                itemsize = torch.empty(0, dtype=dtype).element_size()
                tensor = torch.empty(0, dtype=dtype).set_(whole, offset // itemsize, shape, stride)
            if value.mesh is None:
                return tensor
            return DTensor.from_local(
                tensor,
                made[value.mesh],
                value.placements,
                run_check=False,
                shape=torch.Size(value.shape),
                stride=value.stride,
            )
        if isinstance(value, dict):
            return {key: walk(item) for key, item in value.items()}
        if isinstance(value, list):
            return [walk(item) for item in value]
        return value

    return walk(layout["state"])


def refresh(staged: dict[str, Any], values: dict[str, Any]) -> None:
    """Put a save's optimizer values that are not tensors (``StagingPlan.values``) into
    the rebuilt state."""
    optimizer = staged.get("optimizer")
    if optimizer is None or not values:
        return
    optimizer["param_groups"] = values["param_groups"]
    for name, per in values["state"].items():
        optimizer["state"][name].update(per)


def free_port() -> tuple[str, int]:
    """An address of this host the other processes reach (``MASTER_ADDR``, else the
    loopback) and a port free on it now, for the writer processes' store."""
    address = os.environ.get("MASTER_ADDR", "127.0.0.1")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1" if address == "127.0.0.1" else "", 0))
        return address, int(probe.getsockname()[1])


class WriterProcess:
    """The training side of one writer process: started with this interpreter
    (``serve``) in a session of its own (a Ctrl-C or a signal to the training's process
    group does not stop a write the run waits for), sent one pickled message a save and
    answering each with the error it met or None. It joins the writer processes' group
    at ``address``:``port`` as ``rank`` of ``world`` (rank 0 holds the store), its
    collectives bounded by ``timeout`` seconds."""

    def __init__(self, address: str, port: int, rank: int, world: int, timeout: float) -> None:
        arguments = (os.getpid(), address, port, rank, world, timeout)
        self._popen, _ = start_in_a_lasting_thread(
            lambda: subprocess.Popen(
                [sys.executable, "-c", _SERVE, *map(str, arguments)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=fresh_interpreter_env(),
                start_new_session=True,
            ),
            subprocess.Popen.wait,
        )
        assert self._popen.stdin is not None and self._popen.stdout is not None
        self._input, self._output = self._popen.stdin, self._popen.stdout
        weakref.finalize(self, _stop, self._input)  # its input closed: it ends

    @property
    def alive(self) -> bool:
        return self._popen.poll() is None

    @property
    def pid(self) -> int:
        return self._popen.pid

    def write(self, data: bytes) -> None:
        """Send one save; return once it is written, or raise the error it met."""
        reply = _exchange(self._input, self._output, data)
        if reply is None:
            code = self._popen.wait()
            raise RuntimeError(
                f"the sharded checkpoint's writer process ended (exit code {code}) before "
                f"the write was done"
            )
        _raise_reply(reply)

    def stop(self) -> None:
        """End it now (a new group of writer processes replaces this one's)."""
        _stop(self._input)
        with contextlib.suppress(OSError):
            self._popen.kill()
        self._popen.wait()


#: what the writer process runs (``python -c``); its arguments: this process's id, the
#: store's address and port, its rank, the world size, the collectives' timeout
_SERVE = "from runmodel.checkpoint.sharded.saving import serve; serve()"


def serve(write: Callable[[Any, Path, Path, dict[str, Any], int, int], None]) -> None:
    """The writer process: join the writer processes' group, then for each message of
    its input write the save it describes, ``write(state, staging, path, run_state,
    rank, world)`` (``saving.serve``'s: the run state, DCP's save of the staged state,
    the processes' agreement, rank 0's rename), and answer the error it met (None once
    written); end with its input. It dies with its parent (Linux),
    and a file past the file-size limit is an error, not its death."""
    parent, address, port, rank, world, timeout = sys.argv[1:7]
    source, answers = sys.stdin.buffer, sys.stdout.buffer
    if not become_writer_process(int(parent)):
        return
    import torch.distributed as dist

    span = datetime.timedelta(seconds=float(timeout))
    store = dist.TCPStore(address, int(port), int(world), is_master=rank == "0", timeout=span)
    dist.init_process_group(
        "gloo", store=store, rank=int(rank), world_size=int(world), timeout=span
    )
    kept: dict[Any, Any] = {}
    staged: Any = None
    while (data := _receive(source)) is not None:
        try:
            message = pickle.loads(data)
            if "layout" in message:
                staged = rebuild(message["layout"], kept)
            refresh(staged, message["values"])
            path, staging = Path(message["path"]), Path(message["staging"])
            run_state = torch.load(io.BytesIO(message["run_state"]), weights_only=False)
            write(staged, staging, path, run_state, int(rank), int(world))
            answer: Any = None
        except Exception as error:
            answer = error
        _send(answers, _reply(answer))
    dist.destroy_process_group()

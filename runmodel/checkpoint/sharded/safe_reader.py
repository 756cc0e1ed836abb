"""Reading a sharded checkpoint without running code.

DCP (``torch.distributed.checkpoint``) reads its metadata with plain ``pickle`` and its
non-tensor items (the optimizer's hyperparameters) with ``torch.load(weights_only=False)``:
either would run whatever a planted file names. ``SafeReader`` reads the metadata
through an allow-list of DCP's own record classes and every item with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import functools
import io
import os
import pickle
from typing import Any

import torch

__all__ = ["SafeReader", "UnsafeCheckpointError", "checked_reader"]


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A sharded checkpoint's metadata names something outside the allow-list."""


_ALLOWED = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath", "Path"},
    "collections": {"OrderedDict"},
}


class _AllowListUnpickler(pickle.Unpickler):
    """Unpickles DCP's metadata records and nothing else, as ``torch.load``'s
    ``weights_only`` does for checkpoints: any other global is refused before it is
    looked up, so no function a file names is ever called."""

    def find_class(self, module: str, name: str) -> Any:
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnsafeCheckpointError(
            f"the checkpoint's metadata names {module}.{name}, which is not among the "
            f"records a torch.distributed.checkpoint index holds; it was not loaded (a "
            f"checkpoint from an untrusted source, or one written by another library)"
        )


@functools.cache
def _safe_reader_class() -> type:
    """DCP's ``FileSystemReader`` made safe: a class made on first use (importing
    torch.distributed.checkpoint costs time), once."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class _SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            path = self._get_metadata_path(kwargs.get("rank"))
            with self.fs.create_stream(path, "rb") as stream:
                metadata = _AllowListUnpickler(stream).load()
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

        def read_data(self, plan: Any, planner: Any) -> Any:
            return super().read_data(plan, _SafeBytes(planner))  # type: ignore[arg-type]

    return _SafeReader


def SafeReader(path: str | os.PathLike[str]) -> Any:  # a class, made on first use
    """DCP's ``FileSystemReader`` of ``path``, reading the metadata through an allow-list
    and every non-tensor item with ``torch.load(weights_only=True)``."""
    return _safe_reader_class()(path)


def checked_reader(path: str | os.PathLike[str]) -> Any:
    """``SafeReader(path)``, its metadata read once first: DCP's loader would take an
    unsafe metadata file's error for a missing file and report that instead."""
    reader = SafeReader(path)
    reader.read_metadata()
    return reader


class _SafeBytes:
    """A planner seen through: bytes items are loaded with ``weights_only=True``, then
    handed on as the plain values they are."""

    def __init__(self, planner: Any) -> None:
        self._planner = planner

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        plain = torch.load(value, weights_only=True)
        again = io.BytesIO()
        torch.save(plain, again)  # plain values only: loading them back runs nothing
        again.seek(0)
        self._planner.load_bytes(read_item, again)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._planner, name)

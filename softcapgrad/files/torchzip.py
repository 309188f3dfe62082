"""A ``.pt`` file as torch.save writes it, read without running anything from it and without a memory map.

The file is a zip archive: ``<name>/data.pkl`` (the saved object, pickled) and one member
``<name>/data/<key>`` per storage. ``data.pkl`` is read by torch's weights-only unpickler, the one
``torch.load(weights_only=True)`` uses, which builds only tensors, containers and plain values and
runs no code from the file; every storage it asks for is made on the meta device, so the object comes
back with each tensor's shape, strides, offset and format and no data. :func:`tensors` turns that
into where each tensor's values lie in the file (its member's data, at the offset the member's local
header gives), for ``tensorfiles`` to read by plain reads: the member must be stored uncompressed (as
torch.save writes it), since compressed bytes are not the values, and a compressed one is refused in
one line. A sparse tensor is its values; one saved uncoalesced (repeated indices mean a sum) has its
indices and values read into memory here and coalesced as torch does.
"""

from __future__ import annotations

import math
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from softcapgrad.core.checks import InputError
from softcapgrad.laws import formats

# read(path, byte offset of the storage, storage offset, shape, strides, format) -> the view's values, flat
Read = Callable[[Path, int, int, tuple, tuple, np.dtype], np.ndarray]


@dataclass(frozen=True)
class Stored:
    """One tensor of the archive: where its values are, or (``held``) the values themselves."""

    name: str
    dtype: str  # torch's name of its format, e.g. "bfloat16", "int64"
    fmt: np.dtype | None  # the floating-point format; None: not floating-point (listed, never read)
    numel: int  # its values, a sparse tensor's implicit zeros included
    implicit: int  # a sparse tensor's values that are not stored
    data: int = 0  # byte offset in the file of its storage
    start: int = 0  # offset, shape and strides of its values in the storage, in values
    shape: tuple = ()
    strides: tuple = ()
    held: np.ndarray | None = None  # values already read (an uncoalesced sparse tensor's, coalesced)


def extent(shape: tuple[int, ...], strides: tuple[int, ...]) -> int:
    """How many storage values a view of ``shape`` and (non-negative) ``strides`` spans, first to last."""
    return 1 + sum((n - 1) * st for n, st in zip(shape, strides))


def _torch_format(t) -> np.dtype | None:
    name = str(t.dtype).removeprefix("torch.")
    return formats.resolve(name) if t.is_floating_point() and name in formats.FORMAT_NAMES else None


def _flatten(obj, prefix: str = "") -> Iterator[tuple[str, object]]:
    import torch

    if isinstance(obj, torch.Tensor):
        yield prefix or "tensor", obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _flatten(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _flatten(v, f"{prefix}.{i}" if prefix else str(i))


PICKLE_LIMIT = 64 << 20  # bytes of a .pt's data.pkl (its structure, not its tensors): more is refused
_METHODS = {zipfile.ZIP_DEFLATED: "deflate", zipfile.ZIP_BZIP2: "bzip2", zipfile.ZIP_LZMA: "lzma"}


@dataclass(frozen=True)
class _Archive:
    """A torch.save zip: where each storage's bytes begin in the file, by storage key."""

    path: Path
    prefix: str
    members: dict[str, zipfile.ZipInfo]

    def data_at(self, key: str, name: str, nbytes: int) -> int:
        """Byte offset in the file of storage ``key``, which must be stored uncompressed and hold ``nbytes``."""
        info = self.members.get(f"{self.prefix}data/{key}")
        if info is None:
            raise InputError(f"{self.path}: tensor {name!r} names storage {key!r}, which the archive does not hold")
        if info.compress_type != zipfile.ZIP_STORED:
            method = _METHODS.get(info.compress_type, f"method {info.compress_type}")
            raise InputError(f"{self.path}: tensor {name!r} is compressed in the archive ({method}); torch.save stores "
                             "tensors uncompressed, so save it again with torch.save (or zip it with -0)")
        if info.file_size < nbytes:
            raise InputError(f"{self.path}: tensor {name!r} needs {nbytes:,} bytes of its storage, which holds "
                             f"{info.file_size:,}")
        with open(self.path, "rb") as f:  # the local header: 30 bytes, then the name and an extra field
            f.seek(info.header_offset)
            local = f.read(30)
        if len(local) < 30 or local[:4] != b"PK\x03\x04":
            raise InputError(f"{self.path}: the archive's entry for tensor {name!r} is damaged")
        return info.header_offset + 30 + int.from_bytes(local[26:28], "little") + int.from_bytes(local[28:30], "little")


def _torch_structure(path: Path):
    """The saved object with every tensor on the meta device (shape, strides, format; no data), the archive,
    and each meta storage's key. data.pkl is read by torch's weights-only unpickler, which runs no code from
    the file; its storages are made on the meta device, so nothing of the tensors' data is read here."""
    import io

    import torch
    from torch import _weights_only_unpickler as safe

    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        raise InputError(f"{path}: not a zip archive, the format torch.save writes (since torch 1.6)") from None
    with archive:
        members = {info.filename: info for info in archive.infolist()}
        pickles = [n for n in members if n.endswith("data.pkl") and n.count("/") <= 1]
        if len(pickles) != 1:
            raise InputError(f"{path}: not a torch.save archive (no single data.pkl)")
        prefix = pickles[0][:-len("data.pkl")]
        if members[pickles[0]].file_size > PICKLE_LIMIT:
            raise InputError(f"{path}: its data.pkl would be {members[pickles[0]].file_size:,} bytes, more than the "
                             f"{PICKLE_LIMIT:,} a torch.save structure takes")
        order = archive.read(f"{prefix}byteorder").strip() if f"{prefix}byteorder" in members else b"little"
        if order != b"little":
            raise InputError(f"{path}: tensors saved {order.decode('ascii', 'replace')}-endian; only little-endian is read")
        text = archive.read(pickles[0])
    keys: dict[int, str] = {}

    def persistent_load(pid):
        _, kind, key, _, numel = pid
        dtype = torch.uint8 if kind is torch.UntypedStorage else kind.dtype
        storage = torch.UntypedStorage(numel * torch._utils._element_size(dtype), device="meta")
        keys[storage._cdata] = str(key)
        return torch.storage.TypedStorage(wrap_storage=storage, dtype=dtype, _internal=True)

    unpickler = safe.Unpickler(io.BytesIO(text), encoding="utf-8")
    unpickler.persistent_load = persistent_load
    return unpickler.load(), _Archive(path, prefix, members), keys


def _key(t, keys: dict[int, str], archive: _Archive, name: str) -> str:
    """The archive key of the storage behind a meta tensor."""
    key = keys.get(t.untyped_storage()._cdata)
    if key is None:
        raise InputError(f"{archive.path}: tensor {name!r} is not backed by a storage of the archive")
    return key


def _placed(name: str, t, archive: _Archive, keys: dict[int, str]) -> tuple[np.dtype, int, int, tuple, tuple]:
    """A meta strided tensor's format (a floating one, or its integer format), storage's byte offset, offset,
    shape and strides, its extent checked against the storage the archive holds."""
    fmt = _torch_format(t) or np.dtype(str(t.dtype).removeprefix("torch."))
    shape, strides, start = tuple(t.shape), tuple(t.stride()), t.storage_offset()
    nbytes = (start + extent(shape, strides)) * fmt.itemsize if t.numel() else 0
    return fmt, archive.data_at(_key(t, keys, archive, name), name, nbytes), start, shape, strides


def _stored(name: str, t, archive: _Archive, keys: dict[int, str], read: Read) -> Stored:
    import torch

    implicit, numel = 0, t.numel()
    if t.layout != torch.strided:
        if t.layout == torch.sparse_coo and not t.is_coalesced() and _torch_format(t) is not None:
            return _coalesced(name, t, archive, keys, read)
        values = t._values() if t.layout == torch.sparse_coo else t.values()
        implicit, t = numel - values.numel(), values
    kind = str(t.dtype).removeprefix("torch.")
    if _torch_format(t) is None:
        return Stored(name, kind, None, numel, implicit)
    fmt, data, start, shape, strides = _placed(name, t, archive, keys)
    return Stored(name, kind, fmt, numel, implicit, data, start, shape, strides)


def _loaded(name: str, t, archive: _Archive, keys: dict[int, str], read: Read):
    """A meta strided tensor's values read from the archive into a real CPU tensor of the same shape."""
    import torch

    fmt, data, start, shape, strides = _placed(name, t, archive, keys)
    flat = read(archive.path, data, start, shape, strides, fmt) if math.prod(shape) else np.empty(0, fmt)
    if fmt.type.__module__ != "numpy":  # an ml_dtypes format: torch takes it by its bits
        return torch.from_numpy(flat.view(f"u{fmt.itemsize}")).view(t.dtype).reshape(shape)
    return torch.from_numpy(flat).reshape(shape)


def _coalesced(name: str, t, archive: _Archive, keys: dict[int, str], read: Read) -> Stored:
    """A sparse tensor saved uncoalesced: repeated indices mean the sum of their values, so its indices and values
    are read into memory (their size, not the dense tensor's) and coalesced as torch does, bounds checked."""
    import torch

    indices, values = _loaded(name, t._indices(), archive, keys, read), _loaded(name, t._values(), archive, keys, read)
    merged = torch.sparse_coo_tensor(indices, values, t.shape, check_invariants=True).coalesce()._values()
    fmt = _torch_format(merged)
    held = merged.view({1: torch.uint8, 2: torch.uint16}[fmt.itemsize]).numpy().view(fmt) \
        if fmt.type.__module__ != "numpy" else merged.numpy()
    return Stored(name, str(merged.dtype).removeprefix("torch."), fmt, t.numel(), t.numel() - merged.numel(),
                  held=held.reshape(-1))


def tensors(path: Path, read: Read) -> list[Stored]:
    """Every tensor of a torch.save archive, in the order of the saved object (``read``: how a view's values are
    read, for the few tensors that must be read here)."""
    obj, archive, keys = _torch_structure(path)
    found = list(_flatten(obj))
    if not found:
        raise InputError(f"{path}: holds no tensors")
    return [_stored(name, t, archive, keys, read) for name, t in found]

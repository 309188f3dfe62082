"""Reading saved tensors for the scan: ``.npy``, ``.safetensors`` and ``.pt``, chunk by chunk, any layout.

``.npy`` and ``.safetensors`` are read by plain reads at the byte offsets their headers record
(numpy's header reader; the safetensors library opens and validates the file first), so a file cut
short while it is read is a short read and one line, never a SIGBUS; ``.pt`` through
``torch.load(weights_only=True, mmap=True)``, the file's size checked again before every chunk. A
transposed or strided tensor is read through contiguous copies of at most ``CHUNK`` values, a saved
``nn.Parameter`` detached. Nothing is unpickled.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import ml_dtypes
import numpy as np

from softcapgrad.laws import formats
from softcapgrad.core.checks import InputError
from softcapgrad.core.files import readable_file

KINDS = (".npy", ".pt", ".safetensors")
CHUNK = 1 << 18  # values per read


# safetensors dtype names -> numpy formats (packed 4- and 6-bit types are refused)
_SAFETENSORS = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
                "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
                "F8_E8M0": ml_dtypes.float8_e8m0fnu}


@dataclass(frozen=True)
class Source:
    """One named tensor of a file: its stored format, size, and its values chunk by chunk."""

    name: str
    dtype: str  # the stored format, e.g. "bfloat16", "float32", "int64"
    numel: int
    nbytes: int
    reader: Callable[[], list[Callable[[], np.ndarray]]]  # one loader per chunk of CHUNK values (native byte order)
    implicit_zeros: int = 0  # a sparse tensor's values that are not stored

    @property
    def fmt(self) -> np.dtype | None:
        """The floating-point format of the values, None when they are not floating-point."""
        if self.dtype in formats.FORMAT_NAMES:
            return formats.resolve(self.dtype)
        try:
            fmt = np.dtype(self.dtype)
        except TypeError:  # a torch-only type (qint8...)
            return None
        return fmt if fmt.kind == "f" else None

    def chunks(self) -> list[Callable[[], np.ndarray]]:
        """A loader per chunk of at most CHUNK values, in the tensor's order; any order of loading works."""
        return self.reader()


def _numpy_format(dtype: np.dtype, stored_as: str | None, name: str) -> np.dtype:
    """The format of stored data; ml_dtypes arrays saved with np.save lose theirs ('V2', 'V1')."""
    if dtype.fields is not None:
        raise InputError(f"{name}: a structured array ({dtype}), not one tensor of numbers")
    if dtype.kind != "V":
        return dtype.newbyteorder("=") if dtype.byteorder not in "=|" else dtype
    if stored_as:
        fmt = formats.resolve(stored_as)
        if fmt.itemsize != dtype.itemsize:
            raise InputError(f"--stored-as {stored_as}: {fmt.name} has {fmt.itemsize}-byte values, {name} holds {dtype.itemsize}-byte ones")
        return fmt
    if dtype.itemsize == 2:  # bfloat16 is the only 2-byte format numpy does not know
        return np.dtype(ml_dtypes.bfloat16)
    raise InputError(f"{name}: {dtype.itemsize}-byte values of an unnamed format (an ml_dtypes array saved by np.save); "
                     "name it with --stored-as, e.g. --stored-as fp8_e4m3fn")


def truncated(path: Path, expected: int, found: int) -> InputError:
    return InputError(f"{path}: the file was cut short while it was read ({found:,} of {expected:,} bytes); "
                      "scan it again once whatever writes it has finished")


def _mapped_chunks(path: Path, offset: int, count: int, stored: np.dtype, fmt: np.dtype) -> list[Callable[[], np.ndarray]]:
    """``count`` values of ``stored`` from byte ``offset``, read chunk by chunk, as chunks of ``fmt`` in native byte order.

    Plain reads rather than a memory map: a file that shrinks under a map kills the process with
    SIGBUS, a file that shrinks under a read gives a short read, which is reported."""
    if not count:
        return []

    def load(start: int) -> np.ndarray:
        part = np.empty(min(CHUNK, count - start), dtype=stored)
        raw = part.view(np.uint8)
        with open(path, "rb", buffering=0) as f:
            f.seek(offset + start * stored.itemsize)
            got = f.readinto(raw)
        if got != raw.nbytes:
            raise truncated(path, offset + (start + len(part)) * stored.itemsize, offset + start * stored.itemsize + got)
        return part.view(fmt) if stored.kind == "V" else part.astype(fmt, copy=False)

    return [functools.partial(load, start) for start in range(0, count, CHUNK)]


def _npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype, int]:
    """Shape, stored format and data offset of a .npy file, by numpy's header reader. A descriptor
    numpy cannot read back ('<f1': what np.save writes for some ml_dtypes formats) is read as raw
    bytes of that size: the header is the same Python literal numpy parses (ast.literal_eval)."""
    import ast

    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        try:
            shape, _, dtype = read(f)
            return shape, dtype, f.tell()
        except ValueError:
            f.seek(6 + 2)
            length = int.from_bytes(f.read(2 if version == (1, 0) else 4), "little")
            header = ast.literal_eval(f.read(length).decode("latin1"))
            descr = header["descr"]
            if not (isinstance(descr, str) and descr[-1:].isdigit()):
                raise
            return tuple(header["shape"]), np.dtype(f"V{int(descr.lstrip('<>|=')[1:])}"), f.tell()


def _npy_sources(path: Path, stored_as: str | None) -> list[Source]:
    shape, dtype, offset = _npy_header(path)
    if dtype.hasobject:
        raise InputError(f"{path}: holds Python objects, not numbers")
    fmt = _numpy_format(dtype, stored_as, str(path))
    numel = math.prod(shape)
    if path.stat().st_size < offset + numel * dtype.itemsize:
        raise InputError(f"{path}: the file ends before its data does")
    return [Source("array", fmt.name, numel, numel * dtype.itemsize,
                   lambda: _mapped_chunks(path, offset, numel, dtype, fmt))]


def _safetensors_sources(path: Path) -> list[Source]:
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:  # the library validates header and offsets
        names = list(f.keys())
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    out = []
    for name in names:
        entry = header[name]
        numel = math.prod(entry["shape"])
        begin, end = entry["data_offsets"]
        kind = entry["dtype"]
        if kind not in _SAFETENSORS:  # integers, booleans, packed 4- and 6-bit floats: listed, not read
            out.append(Source(name, kind, numel, 0, list))
            continue
        fmt = np.dtype(_SAFETENSORS[kind])
        offset = 8 + size + begin
        out.append(Source(name, fmt.name, numel, end - begin,
                          lambda offset=offset, numel=numel, fmt=fmt: _mapped_chunks(path, offset, numel, fmt, fmt)))
    return out


def _tensor_chunks(t) -> Iterator:
    """Chunks of at most CHUNK values of a tensor: flat views where it is contiguous; elsewhere
    (a transposed weight, a strided slice) contiguous copies of whole rows, or of the slices of a
    row too long for one chunk. The recursion goes one dimension down each time."""
    if t.is_contiguous():
        flat = t.reshape(-1)
        for start in range(0, flat.numel(), CHUNK):
            yield flat[start:start + CHUNK]
    elif t.numel() == 0:
        return
    elif t.dim() <= 1 or t[0].numel() <= CHUNK:
        rows = t.reshape(-1, 1) if t.dim() <= 1 else t  # a 1-D strided tensor: its values as rows of one
        step = max(1, CHUNK // max(1, rows[0].numel()))
        for start in range(0, rows.shape[0], step):
            yield rows[start:start + step].contiguous().reshape(-1)
    else:
        for i in range(t.shape[0]):
            yield from _tensor_chunks(t[i])


def _torch_format(t) -> np.dtype | None:
    name = str(t.dtype).removeprefix("torch.")
    return formats.resolve(name) if t.is_floating_point() and name in formats.FORMAT_NAMES else None


def _as_numpy(chunk, fmt: np.dtype) -> np.ndarray:
    """A torch chunk as a numpy array of the same values, without a copy (ml_dtypes formats by their bits)."""
    import torch

    if fmt.type.__module__ == "numpy":
        return chunk.numpy()
    return chunk.view({1: torch.uint8, 2: torch.uint16}[fmt.itemsize]).numpy().view(fmt)


def _torch_source(name: str, t, path: Path | None = None, size: int = 0) -> Source:
    import torch

    t = t.detach()  # a saved nn.Parameter comes back requiring grad
    implicit = 0
    if t.layout != torch.strided:
        values = t.coalesce().values() if t.is_sparse else t.values()
        implicit, t = t.numel() - values.numel(), values
    fmt = _torch_format(t)
    if fmt is None:  # not floating-point: listed, never read
        return Source(name, str(t.dtype).removeprefix("torch."), t.numel(), 0, list)
    return Source(name, fmt.name, t.numel() + implicit, t.numel() * t.element_size(),
                  lambda: [functools.partial(_checked, path, size, _as_numpy, c, fmt) for c in _tensor_chunks(t)],
                  implicit)


def _checked(path: Path | None, size: int, load: Callable, *args) -> np.ndarray:
    """``load(*args)`` once the memory-mapped file is still its whole size: the map of a file cut
    short gives SIGBUS where its end used to be."""
    if path is not None:
        now = path.stat().st_size
        if now < size:
            raise truncated(path, size, now)
    return load(*args)


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


def _torch_sources(path: Path) -> list[Source]:
    import torch

    obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    tensors = list(_flatten(obj))
    if not tensors:
        raise InputError(f"{path}: holds no tensors")
    size = path.stat().st_size
    return [_torch_source(name, t, path, size) for name, t in tensors]


def open_sources(path: Path, stored_as: str | None = None) -> list[Source]:
    kind = readable_file(path, KINDS)
    try:
        if kind == ".npy":
            return _npy_sources(path, stored_as)
        if kind == ".pt":
            return _torch_sources(path)
        return _safetensors_sources(path)
    except InputError:
        raise
    except Exception as err:  # any reader failure is the user's file, not our bug
        raise InputError(f"{path}: cannot read as {kind}: {str(err).splitlines()[0] if str(err) else type(err).__name__}") from None


def select(sources: list[Source], keys: list[str] | None, path: Path) -> list[Source]:
    """The tensors to scan: those named (which must be floating-point), else every floating-point one."""
    if not sources:
        raise InputError(f"{path}: holds no tensors")
    if keys:
        names = {s.name: s for s in sources}
        missing = [k for k in keys if k not in names]
        if missing:
            raise InputError(f"{path}: no tensor named {', '.join(map(repr, missing))}; it holds {', '.join(names)}")
        chosen = [names[k] for k in keys]
    else:
        chosen = [s for s in sources if s.fmt is not None]
    rejected = [s for s in (chosen if keys else sources) if s.fmt is None]
    if keys and rejected or not chosen:
        s = (rejected or sources)[0]
        raise InputError(f"tensor {s.name!r} holds {s.dtype}, not floating-point data")
    return chosen



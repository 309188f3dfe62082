"""Reading saved tensors for the scan: ``.npy``, ``.safetensors`` and ``.pt``, chunk by chunk, any layout.

Every format is read by plain reads (``readinto`` a numpy buffer) at the byte offsets its
header records, never through a memory map, so a file cut short while it is read is a short read
and one line, never a SIGBUS. ``.npy``: the header literal, checked field by field. ``.safetensors``:
the safetensors library opens and validates the file first. ``.pt``: the zip archive torch.save
writes (``files/torchzip``: its structure without its data, then each tensor's bytes from its zip
member, which must be stored uncompressed). A transposed or strided tensor is read
piece by piece, each piece at most ``CHUNK`` values from one read of the storage it spans.
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
from softcapgrad.files.torchzip import extent

KINDS = (".npy", ".pt", ".safetensors")
CHUNK = 1 << 18  # values per read
SPAN = 4 * CHUNK  # storage values one read of a strided tensor may span


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


def _read_chunks(path: Path, offset: int, count: int, stored: np.dtype, fmt: np.dtype) -> list[Callable[[], np.ndarray]]:
    """``count`` values of ``stored`` from byte ``offset``, read chunk by chunk, as chunks of ``fmt`` in native byte order.

    Plain reads rather than a memory map: a file that shrinks under a map kills the process with
    SIGBUS, a file that shrinks under a read gives a short read, which is reported."""

    def load(start: int) -> np.ndarray:
        part = _read(path, offset + start * stored.itemsize, min(CHUNK, count - start), stored)
        return part.view(fmt) if stored.kind == "V" else part.astype(fmt, copy=False)

    return [functools.partial(load, start) for start in range(0, count, CHUNK)]


NPY_HEADER_LIMIT = 10_000  # bytes: the header np.load reads without max_header_size (numpy's own limit)


def _npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype, int]:
    """Shape, stored format and data offset of a .npy file. The header is the Python literal numpy writes,
    read with ``ast.literal_eval`` (no code runs) and checked field by field, so a bad one is named: a
    header longer than numpy reads safely, a negative dimension, a ``fortran_order`` that is not a bool.
    A descriptor numpy cannot read back ('<f1': what np.save writes for some ml_dtypes formats) is read
    as raw bytes of that size. Column-major data (``fortran_order`` True) is read in its stored order: the
    scan's counts do not depend on the order of the values."""
    import ast

    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        if version not in ((1, 0), (2, 0), (3, 0)):
            raise InputError(f"{path}: .npy format version {version[0]}.{version[1]}, not 1.0, 2.0 or 3.0")
        length = int.from_bytes(f.read(2 if version == (1, 0) else 4), "little")
        if length > NPY_HEADER_LIMIT:
            raise InputError(f"{path}: a .npy header of {length:,} bytes, more than the {NPY_HEADER_LIMIT:,} that "
                             "numpy reads safely (one tensor's header takes about a hundred)")
        text = f.read(length)
        offset = f.tell()
    if len(text) < length:
        raise InputError(f"{path}: the file ends inside its .npy header")
    try:
        header = ast.literal_eval(text.decode("utf8" if version == (3, 0) else "latin1"))
    except (ValueError, SyntaxError, UnicodeDecodeError, MemoryError, RecursionError):
        raise InputError(f"{path}: the .npy header is not the literal numpy writes") from None
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        raise InputError(f"{path}: the .npy header must hold exactly descr, fortran_order and shape")
    shape, order = header["shape"], header["fortran_order"]
    if not isinstance(order, bool):
        raise InputError(f"{path}: the .npy header's fortran_order is {order!r}, not True or False")
    if not (isinstance(shape, tuple) and all(type(n) is int for n in shape)):
        raise InputError(f"{path}: the .npy header's shape {shape!r} is not a tuple of integers")
    if any(n < 0 for n in shape):
        raise InputError(f"{path}: the .npy header's shape {shape} has a negative dimension")
    descr = header["descr"]
    try:
        dtype = np.lib.format.descr_to_dtype(descr)
    except (TypeError, ValueError):
        if not (isinstance(descr, str) and descr[-1:].isdigit() and descr.lstrip("<>|=")[1:].isdigit()):
            raise InputError(f"{path}: the .npy header's descr {descr!r} is not a numpy format") from None
        dtype = np.dtype(f"V{int(descr.lstrip('<>|=')[1:])}")
    return shape, dtype, offset


def _npy_sources(path: Path, stored_as: str | None) -> list[Source]:
    shape, dtype, offset = _npy_header(path)
    if dtype.hasobject:
        raise InputError(f"{path}: holds Python objects, not numbers")
    fmt = _numpy_format(dtype, stored_as, str(path))
    numel = math.prod(shape)
    if path.stat().st_size < offset + numel * dtype.itemsize:
        raise InputError(f"{path}: the file ends before its data does")
    return [Source("array", fmt.name, numel, numel * dtype.itemsize,
                   lambda: _read_chunks(path, offset, numel, dtype, fmt))]


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
                          lambda offset=offset, numel=numel, fmt=fmt: _read_chunks(path, offset, numel, fmt, fmt)))
    return out


def _pieces(start: int, shape: tuple[int, ...], strides: tuple[int, ...]) -> Iterator[tuple[int, tuple, tuple]]:
    """A strided view as pieces (start, shape, strides) in its own (C) order, each of at most CHUNK values over
    at most SPAN storage values: whole rows where they fit, else the recursion goes one dimension down."""
    kept = [(n, st) for n, st in zip(shape, strides) if n != 1]
    if any(n == 0 for n, _ in kept):
        return
    shape, strides = tuple(n for n, _ in kept), tuple(st for _, st in kept)
    numel = math.prod(shape)
    if strides == tuple(math.prod(shape[i + 1:]) for i in range(len(shape))):  # contiguous: one flat run
        shape, strides = (numel,), (1,)
    if not shape:  # one value
        yield start, (1,), (1,)
        return
    row, row_strides = shape[1:], strides[1:]
    row_numel, row_extent = math.prod(row), extent(row, row_strides)
    if row_numel > CHUNK or row_extent > SPAN:
        for i in range(shape[0]):
            yield from _pieces(start + i * strides[0], row, row_strides)
        return
    rows = min(CHUNK // row_numel, shape[0] if strides[0] == 0 else (SPAN - row_extent) // strides[0] + 1)
    for i in range(0, shape[0], rows):
        yield start + i * strides[0], (min(rows, shape[0] - i), *row), strides


def _read(path: Path, byte_offset: int, count: int, fmt: np.dtype) -> np.ndarray:
    """``count`` values of ``fmt`` at ``byte_offset``, by plain reads into one buffer; reading 0 bytes before it
    is full means the file ends there: cut short."""
    part = np.empty(count, dtype=fmt)
    raw = memoryview(part.view(np.uint8))
    got = 0
    with open(path, "rb", buffering=0) as f:
        f.seek(byte_offset)
        while got < len(raw):
            step = f.readinto(raw[got:])
            if not step:
                raise truncated(path, byte_offset + len(raw), byte_offset + got)
            got += step
    return part


def strided_chunks(path: Path, data: int, start: int, shape: tuple, strides: tuple,
                    fmt: np.dtype) -> list[Callable[[], np.ndarray]]:
    """The values of a strided view of a storage at byte ``data`` of the file, piece by piece, each piece one
    read of the storage span it covers."""
    size = fmt.itemsize

    def load(piece: tuple[int, tuple, tuple]) -> np.ndarray:
        first, dims, steps = piece
        span = _read(path, data + first * size, extent(dims, steps), fmt)
        view = np.lib.stride_tricks.as_strided(span, dims, tuple(st * size for st in steps), writeable=False)
        return np.ascontiguousarray(view).reshape(-1)

    return [functools.partial(load, piece) for piece in _pieces(start, shape, strides)]


def _read_view(path: Path, data: int, start: int, shape: tuple, strides: tuple, fmt: np.dtype) -> np.ndarray:
    return np.concatenate([load() for load in strided_chunks(path, data, start, shape, strides, fmt)])


def _torch_sources(path: Path) -> list[Source]:
    """The tensors of a .pt (``files/torchzip``), each read from its storage piece by piece."""
    from softcapgrad.files.torchzip import tensors

    out = []
    for t in tensors(path, _read_view):
        if t.fmt is None:  # not floating-point: listed, never read
            out.append(Source(t.name, t.dtype, t.numel, 0, list))
        elif t.held is not None:
            held = t.held
            out.append(Source(t.name, t.fmt.name, t.numel, held.nbytes, lambda held=held: [
                functools.partial(held.__getitem__, slice(i, i + CHUNK)) for i in range(0, held.size, CHUNK)], t.implicit))
        else:
            out.append(Source(t.name, t.fmt.name, t.numel, (t.numel - t.implicit) * t.fmt.itemsize,
                              lambda t=t: strided_chunks(path, t.data, t.start, t.shape, t.strides, t.fmt), t.implicit))
    return out


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



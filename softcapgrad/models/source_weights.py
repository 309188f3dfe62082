"""A model directory's weights, checked before anything is built from them.

``audit-model DIR``, ``parity DIR`` and ``experiment --model DIR`` read a directory through
models/source.py, which calls :func:`checked_weights` once the configuration is built. Only
safetensors files are read, and only as data (the safetensors library parses the header and bounds
its size and offsets); a pickled ``.bin`` file, even one an index names, is never opened, and weights only in
a format not read here (GGUF, TensorFlow's or Flax's files) are refused rather than replaced by random ones. Each
refusal is one line: a weights file that is not a regular file (a link to ``/dev/zero``, a FIFO), a
header the library rejects, a tensor whose shape is not the one the configuration makes, a non-finite
value, or weights that are all zero. The values are read one tensor at a time, memory-mapped.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from softcapgrad.core.checks import InputError
from softcapgrad.core.files import node_kind

SAFETENSORS, INDEX = "model.safetensors", "model.safetensors.index.json"
PICKLED = ("pytorch_model.bin", "pytorch_model.bin.index.json")
INDEX_BYTES = 16 << 20  # an index is a name per tensor: kilobytes, a few megabytes for the largest models
NEVER_OPENED = "pickled .bin files are never opened; save the model as safetensors"
NOT_READ = ("*.gguf", "tf_model.h5", "flax_model.msgpack")  # weights in formats this reader does not read


def regular(path: Path, what: str = "weights") -> bool:
    """False where nothing is at ``path``; True for a regular file (a link to one is followed, as the model
    hub's cache links its blobs); anything else refused: a device, a FIFO, a folder, a dangling link. ``what``
    the file holds, in the refusal."""
    if not os.path.lexists(path):
        return False
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        raise InputError(f"{path}: cannot be read ({err.strerror}); {what} that cannot be read are refused") from None
    if not stat.S_ISREG(mode):
        raise InputError(f"{path}: is {node_kind(mode)}, not a regular file; {what} that cannot be read are refused")
    return True


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files holding the directory's weights ([] for a directory without weights)."""
    directory = Path(directory)
    present = {name: regular(directory / name) for name in (SAFETENSORS, INDEX, *PICKLED)}
    if present[INDEX]:
        return [directory / name for name in _index_names(directory / INDEX)]
    if present[SAFETENSORS]:
        return [directory / SAFETENSORS]
    if any(present[name] for name in PICKLED):
        raise InputError(f"{directory}: its only weights are pickled ({', '.join(n for n in PICKLED if present[n])}); "
                         f"{NEVER_OPENED}")
    unread = sorted({p.name for pattern in NOT_READ for p in directory.glob(pattern) if p.is_file()})
    if unread:
        raise InputError(f"{directory}: its only weights are in a format not read here ({', '.join(unread)}); "
                         "only safetensors weights are read: save the model as safetensors")
    return []


def _index_names(index: Path) -> list[str]:
    """The shard names an index maps tensors to: plain names in the directory, each a safetensors file."""
    if index.stat().st_size > INDEX_BYTES:
        raise InputError(f"{index}: {index.stat().st_size:,} bytes is not a weights index")
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
        raise InputError(f"{index}: not readable JSON: {' '.join(str(err).split())[:200]}") from None
    shards = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(shards, dict) or not shards or not all(isinstance(v, str) for v in shards.values()):
        raise InputError(f"{index}: no weight_map of tensor names to file names")
    names = sorted(set(shards.values()))
    for name in names:
        if name.endswith(".bin"):
            raise InputError(f"{index}: names the pickled shard {name!r}; {NEVER_OPENED}")
        if Path(name).name != name or name in (".", "..") or not name.endswith(".safetensors"):
            raise InputError(f"{index}: names {name!r}; a shard is a .safetensors file in the directory itself")
        if not regular(index.parent / name):
            raise InputError(f"{index}: names {name!r}, which is not there")
    return names


def expected_shapes(config) -> dict[str, tuple]:
    """The shape of every weight the audited class builds from ``config`` (on the meta device: no memory),
    under its own name and without (or with) the base model's prefix; {} where it cannot be built so."""
    import copy

    import torch

    from transformers.utils import logging

    from softcapgrad.models import runnable

    level = logging.get_verbosity()
    logging.set_verbosity_error()  # its warnings about the configuration are not the answer
    try:
        cls = runnable.model_class(config)
        with torch.device("meta"):
            model = cls._from_config(copy.deepcopy(config))
    except Exception:  # noqa: BLE001 -- the build itself reports it, in its own words, later
        return {}
    finally:
        logging.set_verbosity(level)
    prefix = getattr(model, "base_model_prefix", "") or ""
    shapes: dict[str, tuple] = {}
    for name, tensor in model.state_dict().items():
        shapes[name] = tuple(tensor.shape)
        if prefix and name.startswith(prefix + "."):
            shapes.setdefault(name[len(prefix) + 1:], tuple(tensor.shape))
        elif prefix:
            shapes.setdefault(f"{prefix}.{name}", tuple(tensor.shape))
    return shapes


def checked_weights(directory: Path, config) -> list[Path]:
    """Every check on the directory's weights, header first, values last; the safetensors files read."""
    import torch
    from safetensors import safe_open

    shards = weight_files(directory)
    expected = expected_shapes(config) if shards else {}
    handles = []
    for shard in shards:
        try:
            handles.append(safe_open(str(shard), framework="pt"))
        except Exception as err:  # noqa: BLE001 -- the library's own word on the header: too large, bad JSON
            raise InputError(f"{shard}: not a safetensors file ({' '.join(str(err).split())[:200]})") from None
    for shard, f in zip(shards, handles):
        for name in f.keys():
            shape = tuple(f.get_slice(name).get_shape())
            if name in expected and expected[name] != shape:
                raise InputError(f"{shard}: tensor {name} has shape {list(shape)}, while config.json makes it "
                                 f"{list(expected[name])}: the weights are not this configuration's")
    nonzero = floating = False
    for shard, f in zip(shards, handles):
        for name in f.keys():
            tensor = f.get_tensor(name)
            if not tensor.is_floating_point():
                continue
            floating = True
            bad = int((~torch.isfinite(tensor)).sum())
            if bad:
                raise InputError(f"{shard}: tensor {name} holds {bad:,} non-finite values (NaN or inf) of "
                                 f"{tensor.numel():,}; a model with them computes nothing that can be measured")
            nonzero = nonzero or bool(tensor.any())
    if floating and not nonzero:
        raise InputError(f"{directory}: every weight is zero; such a model's outputs are constant, its gradients "
                         "zero, and nothing about its caps can be measured")
    return shards

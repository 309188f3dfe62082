"""A model folder as ``parity DIR`` checks it: as saved, on text read by its own tokenizer.

Everything here runs before the reference is built and before any engine starts; each refusal is one
line. The folder's weights are measured from their safetensors headers (nothing else read) against the
memory the run would take, and every parameter the model class builds must be in them (``from_pretrained``
would otherwise draw the missing ones at random, and the model checked would not be the folder's). The
text is the prompts shipped with softcapgrad (``data/prompts.txt``, one a line), or the user's, joined
one a line into one sequence and tokenized by the folder's ``tokenizer.json``, which the ``tokenizers``
library reads as data (no code of the folder runs; no ``trust_remote_code``). A folder without
``tokenizer.json`` runs on seeded random token ids, with the stand-in tokenizer (vocabulary.py) written
for the engines, and the answer says so.

Each engine's folder holds the folder's own safetensors files, copied byte for byte (dtype as saved), its
tokenizer files, and a ``config.json`` that differs between the variants only in the cap fields.
"""

from __future__ import annotations

import copy
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from softcapgrad.core.checks import InputError, printable
from softcapgrad.engines.forward import modeltypes as types
from softcapgrad.engines.forward.vocabulary import write_tokenizer
from softcapgrad.models.source_weights import regular

PROMPTS = Path(__file__).resolve().parent / "data" / "prompts.txt"  # the shipped text: package data
PROMPTS_BYTES = 1 << 20  # a prompts file is text for a few hundred tokens; a mebibyte is far past that
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json")
RANDOM_TOKENS = 16  # the random ids' count, as for the built models, where the folder has no tokenizer.json
COPIES = 2  # fp32 copies of the weights each engine child holds at once: the model it loads and what it converts
ITEMSIZE = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
            "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "BOOL": 1}


@dataclass(frozen=True)
class Inputs:
    """What a folder's model runs on. ``ids`` None: random ids drawn and the weights rescaled (``bound``)."""

    ids: np.ndarray | None  # [tokens]
    how: str  # in words, for the answer
    tokenizer: bool  # the folder's tokenizer.json read the text (False: the stand-in is written for the engines)
    bound: bool = False  # --bind: the weights rescaled so that each cap reaches |a/c| = 4 (reference.bind)

    def as_dict(self) -> dict:
        return {"how": self.how, "tokenizer": "the folder's" if self.tokenizer else "a stand-in",
                "bound": self.bound, **({"tokens": int(self.ids.size)} if self.ids is not None else {})}


def read_prompts(path: Path, option: str = "--prompts") -> list[str]:
    """The non-blank lines of a UTF-8 text file, each a prompt; one line for a file that is none."""
    if not regular(path, "prompts"):
        raise InputError(f"{option} {path}: no such file")
    if path.stat().st_size > PROMPTS_BYTES:
        raise InputError(f"{option} {path}: {path.stat().st_size:,} bytes; a prompts file holds at most "
                         f"{PROMPTS_BYTES:,} (parity reads at most 512 tokens of it)")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(f"{option} {path}: not UTF-8 text (byte {err.start} cannot be decoded)") from None
    if "\x00" in text:
        raise InputError(f"{option} {path}: not text (it holds NUL bytes); give one prompt per line")
    prompts = [line.strip() for line in text.splitlines() if line.strip()]
    if not prompts:
        raise InputError(f"{option} {path}: holds no prompt (empty, or blank lines only); give one prompt per line")
    return prompts


def prompts_given(prompt: list[str] | None, file: Path | None) -> tuple[list[str], str, bool]:
    """The prompts, where they come from in words, and whether the user gave them: --prompt's, then --prompts's
    lines; else the shipped text."""
    given = []
    for p in prompt or []:
        if not p.strip():
            raise InputError("--prompt: an empty prompt; give text")
        given.append(p.strip())
    if file is not None:
        given += read_prompts(file)
    if given:
        where = " and ".join(w for w, on in (("--prompt", prompt), (f"--prompts {file}", file)) if on)
        return given, f"{len(given)} prompt{'s' * (len(given) != 1)} of {printable(where)}", True
    shipped = read_prompts(PROMPTS, "the shipped prompts")
    return shipped, f"the {len(shipped)} prompts shipped with softcapgrad", False


def header_size(directory: Path) -> tuple[int, int]:
    """(parameters, bytes) of every tensor the folder's safetensors headers declare; nothing else is read."""
    from safetensors import safe_open

    from softcapgrad.models.source_weights import weight_files

    count = size = 0
    for shard in weight_files(directory):
        try:
            with safe_open(str(shard), framework="np") as f:
                for name in f.keys():
                    part = f.get_slice(name)
                    n = int(np.prod(part.get_shape(), dtype=np.float64))
                    count, size = count + n, size + n * ITEMSIZE.get(part.get_dtype(), 8)
        except Exception as err:  # noqa: BLE001 -- the library's own word on the header
            raise InputError(f"{shard}: not a safetensors file ({' '.join(str(err).split())[:200]})") from None
    return count, size


def check_memory(directory: Path, jobs: int) -> None:
    """The run's memory against what is available: the reference holds the weights in fp32 and each of the
    ``jobs`` engine children running at once holds COPIES more (the model it loads, what it converts)."""
    from softcapgrad.engines.forward.reference import PARAMETER_LIMIT
    from softcapgrad.models.sizes import available_bytes

    n, saved = header_size(directory)
    if n > PARAMETER_LIMIT:
        raise InputError(f"{directory}: its weights hold {n:,} parameters; parity converts the model once per engine "
                         f"and runs small models only (at most {PARAMETER_LIMIT:.0e}): refused before loading")
    need, have = 4 * n * (1 + COPIES * jobs), available_bytes()
    if need > have:
        raise InputError(f"{directory}: its weights hold {n:,} parameters ({saved / 2**30:.3g} GiB as saved); the "
                         f"fp32 reference and {jobs} engine child(ren) at once need about {need / 2**30:.3g} GiB and "
                         f"{have / 2**30:.3g} GiB is available: refused before loading")


def check_complete(directory: Path, config, bind: bool = False) -> None:
    """Every parameter the model class builds from ``config`` is in the folder's weights (a tied one once, under
    any of its names, with or without the base model's prefix). A folder without weights is refused, but with
    ``bind``, which draws random ones as the built models do."""
    import torch
    from safetensors import safe_open

    from softcapgrad.models import runnable
    from softcapgrad.models.source import quiet
    from softcapgrad.models.source_weights import weight_files

    shards = weight_files(directory)
    if not shards and bind:
        return
    if not shards:
        raise InputError(f"{directory}: holds no safetensors weights; parity checks the folder's own weights (--bind "
                         "draws random ones)")
    held: set = set()
    for shard in shards:
        with safe_open(str(shard), framework="np") as f:
            held.update(f.keys())
    with quiet(), torch.device("meta"):
        model = runnable.model_class(config)._from_config(copy.deepcopy(config))
    prefix = getattr(model, "base_model_prefix", "") or ""
    groups: dict = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)

    def present(name: str) -> bool:
        bare = name[len(prefix) + 1:] if prefix and name.startswith(prefix + ".") else name
        return bool({name, bare, f"{prefix}.{bare}"} & held)

    missing = [names[0] for names in groups.values() if not any(present(n) for n in names)]
    if missing:
        raise InputError(f"{directory}: its weights lack {len(missing)} tensor(s) the {config.model_type} class "
                         f"builds ({', '.join(missing[:3])}{', …' if len(missing) > 3 else ''}); loading would draw "
                         "them at random, and the model checked would not be the folder's")


def inputs(src, prompts: list[str], said: str, given: bool, seq_len: int | None, seed: int) -> Inputs:
    """The folder's model's input: the prompts joined one a line, tokenized by its tokenizer.json (at most
    ``seq_len`` tokens, else reference.MAX_TOKENS); without one, random ids (the prompts unread, refused where
    the user ``given`` them)."""
    from softcapgrad.engines.forward.reference import MAX_TOKENS
    from softcapgrad.models.inputs import random_ids, vocabulary

    path = src.directory / "tokenizer.json"
    if not regular(path, "tokenizer files"):
        if given:
            raise InputError(f"{src.directory}: has no tokenizer.json to read the prompts with; give the folder's "
                             "tokenizer.json, or leave out --prompt and --prompts (random token ids are then used)")
        n = seq_len or RANDOM_TOKENS
        ids = random_ids(src.config, 1, n, seed).numpy().reshape(-1)
        return Inputs(ids, f"{n} random token ids (seed {seed}): the folder has no tokenizer.json, so the engines "
                           "get a stand-in tokenizer", tokenizer=False)
    from tokenizers import Tokenizer

    try:
        encoded = Tokenizer.from_file(str(path)).encode("\n".join(prompts)).ids
    except Exception as err:  # noqa: BLE001 -- the tokenizers library raises its own exception type
        raise InputError(f"{path}: cannot load the tokenizer: {printable(str(err).splitlines()[0][:200])}") from None
    limit = seq_len or MAX_TOKENS
    ids = np.asarray(encoded[:limit], dtype=np.int64)
    vocab = vocabulary(src.config)
    if ids.size < 2:
        raise InputError(f"{path}: tokenizes the prompts into {ids.size} token(s); parity needs at least 2")
    if int(ids.max()) >= vocab:
        raise InputError(f"{path}: gives token id {int(ids.max())}, beyond the model's vocabulary of {vocab}: the "
                         "tokenizer is not this model's")
    cut = f", the first {limit} of {len(encoded)} kept" if len(encoded) > limit else ""
    return Inputs(ids, f"{said}, one a line, tokenized by the folder's tokenizer.json ({ids.size} tokens{cut})",
                  tokenizer=True)


def write(src, folder: Path, off: tuple, tokenizer: bool) -> Path:
    """An engine's copy of the folder: its safetensors files as they are, its tokenizer files (or the stand-in),
    and its configuration with the caps named in ``off`` switched off."""
    from softcapgrad.models.source import quiet
    from softcapgrad.models.source_weights import INDEX, weight_files

    folder.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(src.config)
    for cap in off:
        name = types.field(config, cap)
        if name:
            setattr(config, name, types.off_value(config, cap))
    with quiet():
        config.to_json_file(folder / "config.json")
    for shard in weight_files(src.directory):
        shutil.copyfile(shard, folder / shard.name)
    if (src.directory / INDEX).is_file():
        shutil.copyfile(src.directory / INDEX, folder / INDEX)
    if not tokenizer:
        write_tokenizer(folder, config.to_dict())
        return folder
    for name in TOKENIZER_FILES:
        if regular(src.directory / name, "tokenizer files"):
            shutil.copyfile(src.directory / name, folder / name)
    return folder

"""The token ids an audit feeds: read from a file, or drawn at random below the vocabulary's text ids."""

from __future__ import annotations

import pickle
from pathlib import Path

from softcapgrad.core.checks import InputError

TOKEN_KINDS = (".npy", ".pt", ".txt")
DISCOVERY = (3, 7)  # batch and tokens of the discovery forward: apart from every tiny size, so shapes name axes


def read_token_ids(path: Path):
    """Token ids from ``.npy`` / ``.pt`` (an integer array, 1-D or 2-D) or ``.txt`` (integers, one sequence a line)."""
    import numpy as np
    import torch

    from softcapgrad.core.files import readable_file

    path = Path(path)
    kind = readable_file(path, TOKEN_KINDS, "--inputs")
    try:
        if kind == ".npy":
            ids = torch.from_numpy(np.load(path, allow_pickle=False))
        elif kind == ".pt":
            ids = torch.load(path, map_location="cpu", weights_only=True)
        else:
            lines = [line.split() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
            if len({len(line) for line in lines}) > 1:
                raise InputError(f"--inputs {path}: every line must hold the same number of token ids")
            ids = torch.tensor([[int(t) for t in line] for line in lines], dtype=torch.int64)
    except InputError:
        raise
    except pickle.UnpicklingError:  # torch's weights-only reader refused what is not a tensor: nothing ran
        raise InputError(f"--inputs {path}: refused: a pickle naming something other than tensors (code, a "
                         "class), which is never run; save the ids with np.save or torch.save of a tensor") from None
    except (ValueError, OSError, RuntimeError, EOFError) as err:
        raise InputError(f"--inputs {path}: cannot read token ids: {str(err).splitlines()[0]}") from None
    if not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise InputError(f"--inputs {path}: expected an integer array of token ids, got {getattr(ids, 'dtype', type(ids).__name__)}")
    if ids.dim() == 1:
        ids = ids[None]
    if ids.dim() != 2 or ids.numel() == 0:
        raise InputError(f"--inputs {path}: expected a non-empty 1-D or 2-D array of token ids, got shape {tuple(ids.shape)}")
    return ids.long()


MAX_TOKENS = 1 << 20  # one batch: the longest sequence --seq-len takes; its int64 ids alone are 8 MiB


def tokens_fit(batch: int, seq_len: int, where: str) -> None:
    """A batch of ``batch`` × ``seq_len`` ids within MAX_TOKENS, checked before anything is allocated."""
    if batch * seq_len > MAX_TOKENS:
        raise InputError(f"{where}: {batch:,} × {seq_len:,} = {batch * seq_len:,} token ids in one batch; at most "
                         f"{MAX_TOKENS:,}")


def logits_fit(config, tokens: int, where: str) -> None:
    """The float32 logits of ``tokens`` ids over the vocabulary (the monitor keeps the capped tanh's inputs in
    float32) fit in half the memory available: else one line, before the model is built."""
    from softcapgrad.models.tiny import available_bytes

    need, have = tokens * vocabulary(config) * 4, available_bytes()
    if need > have // 2:
        raise InputError(f"{where}: {tokens:,} tokens × a vocabulary of {vocabulary(config):,} are "
                         f"{need / 2**30:.3g} GiB of float32 logits and {have / 2**30:.3g} GiB are available")


def random_ids(config, batch: int, seq_len: int, seed: int):
    """Token ids drawn uniformly below the vocabulary size, from their own generator."""
    import torch

    return torch.randint(0, text_tokens(config), (batch, seq_len), generator=torch.Generator().manual_seed(seed))


def check_ids(ids, config, where: str) -> None:
    vocab = vocabulary(config)
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise InputError(f"{where}: token ids must lie in [0, {vocab}), got {int(ids.min())}..{int(ids.max())}")


def vocabulary(config) -> int:
    """The smallest ``vocab_size`` over the config and its sub-configurations: token ids must be below it."""
    sizes = [v for _, c in _configs(config) for name in ("vocab_size", "unpadded_vocab_size", "text_vocab_size")
             if isinstance(v := getattr(c, name, None), int) and v > 0]
    return min(sizes) if sizes else 1  # a model without tokens: the ids only give the batch its shape


def text_tokens(config) -> int:
    """Random text ids are drawn below this: the vocabulary less the special ids in its upper half (an image
    token drawn at random would ask for an image)."""
    from softcapgrad.models.tiny import _is_token

    vocab = vocabulary(config)
    if vocab <= 1:  # no vocabulary (a codec, a vocoder): the ids only give the batch its shape, a pad id 0 no limit
        return 1
    special = [v for _, c in _configs(config) for name, v in vars(c).items()
               if _is_token(name) and isinstance(v, int) and not isinstance(v, bool) and vocab // 2 <= v < vocab]
    return min([vocab, *special])


def _configs(config, prefix: str = ""):
    """(prefix, config) for the config and every nested sub-configuration."""
    from transformers import PreTrainedConfig

    yield prefix, config
    for name, value in vars(config).items():
        if isinstance(value, PreTrainedConfig):
            yield from _configs(value, f"{prefix}{name}.")


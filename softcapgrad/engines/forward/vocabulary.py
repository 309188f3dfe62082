"""The stand-in tokenizer written into every model folder an engine reads: token id i is the piece ``<t{i}>``.

Engines load a tokenizer beside the weights (llama.cpp's converter reads ``tokenizer.model``, vLLM and
transformers read ``tokenizer.json``), although parity feeds them token ids and never text. The
stand-in has one piece per id of the model's vocabulary, so that every id means itself in each
format: ``<t{i}>`` for id i, except the special ids, which take the names engines look for --
``<pad>``, ``<eos>``, ``<bos>`` and ``<unk>`` at the ids the config gives (``pad_token_id``,
``eos_token_id`` (its first id when a list), ``bos_token_id``, ``unk_token_id``; a config without
``unk_token_id`` gets ``<unk>`` at the smallest id no other special holds, 3 for Gemma's 0/1/2).
Where two roles share an id, the first of pad, eos, bos, unk names it.

Three files, each the same bytes on every run and machine:

- ``tokenizer.json``: a ``tokenizers`` word-level model whose pre-tokenizer splits text at whitespace
  and around each ``<...>``, the special pieces registered as special tokens, and a decoder that joins
  pieces without spaces: ``"<t5><t9>"`` (or ``"<t5> <t9>"``) encodes to [5, 9], [5, 9] decodes to
  ``"<t5><t9>"``;
- ``tokenizer_config.json``: the special pieces and the tokenizer class;
- ``tokenizer.model``: a sentencepiece ``ModelProto`` (unigram, identity normalizer, no dummy prefix;
  the specials CONTROL, ``<unk>`` UNKNOWN, every other piece NORMAL with score 0), serialized
  deterministically, so ``"<t5><t9>"`` encodes to [5, 9].

``tokenizer_config.json``'s ``added_tokens_decoder`` lists every piece (the specials as special), so
that llama.cpp's converter, which reads it, marks the ordinary pieces user-defined; llama.cpp matches
user-defined pieces in text whole, so a llama.cpp server given the text ``"<t5><t9>"`` reads ids 5
and 9 (its own tokenizer would otherwise find no piece in it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from softcapgrad.core.files import write_atomic

ROLES = ("pad", "eos", "bos", "unk")
PIECE = r"<[^<>]*>"  # one piece: what the pre-tokenizer splits text into
FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


@dataclass(frozen=True)
class Vocabulary:
    size: int
    special: dict  # role -> id, for the roles present
    pieces: tuple[str, ...]  # pieces[i] is token i

    def piece(self, role: str) -> str | None:
        return self.pieces[self.special[role]] if role in self.special else None


def _text_config(config: dict) -> dict:
    """The keys that describe the vocabulary: the config itself, or its ``text_config`` (multimodal types)."""
    if "vocab_size" not in config and isinstance(config.get("text_config"), dict):
        return config["text_config"]
    return config


def vocabulary(config: dict) -> Vocabulary:
    text = _text_config(config)
    size = int(text["vocab_size"])
    ids = {}
    for role in ROLES:
        value = text.get(f"{role}_token_id", config.get(f"{role}_token_id"))
        if isinstance(value, (list, tuple)):
            value = value[0] if value else None
        if isinstance(value, int) and 0 <= value < size:
            ids[role] = value
    if "unk" not in ids:
        taken = set(ids.values())
        ids["unk"] = next(i for i in range(size) if i not in taken)
    pieces = [f"<t{i}>" for i in range(size)]
    named = {}
    for role in ROLES:  # the first role at an id names it
        if role in ids and ids[role] not in named:
            named[ids[role]] = f"<{role}>"
            pieces[ids[role]] = f"<{role}>"
    return Vocabulary(size, ids, tuple(pieces))


def tokenizer_json(vocab: Vocabulary) -> str:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({p: i for i, p in enumerate(vocab.pieces)}, unk_token=vocab.piece("unk")))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                       pre_tokenizers.Split(Regex(PIECE), behavior="isolated")])
    tokenizer.decoder = decoders.Fuse()
    specials = sorted(set(vocab.special.values()))
    tokenizer.add_special_tokens([AddedToken(vocab.pieces[i], special=True, normalized=False) for i in specials])
    return tokenizer.to_str(pretty=True) + "\n"


def tokenizer_config(vocab: Vocabulary) -> str:
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 20,
              "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False}
    for role in ROLES:
        if role in vocab.special:
            config[f"{role}_token"] = vocab.piece(role)
    specials = set(vocab.special.values())
    config["added_tokens_decoder"] = {
        str(i): {"content": piece, "special": i in specials, "normalized": False, "lstrip": False,
                 "rstrip": False, "single_word": False}
        for i, piece in enumerate(vocab.pieces)}
    return json.dumps(config, indent=1, sort_keys=True) + "\n"


def sentencepiece_model(vocab: Vocabulary) -> bytes:
    from sentencepiece import sentencepiece_model_pb2 as spm

    proto = spm.ModelProto()
    types = {i: spm.ModelProto.SentencePiece.CONTROL for i in vocab.special.values()}
    types[vocab.special["unk"]] = spm.ModelProto.SentencePiece.UNKNOWN
    for i, text in enumerate(vocab.pieces):
        piece = proto.pieces.add()
        piece.piece, piece.score = text, 0.0
        piece.type = types.get(i, spm.ModelProto.SentencePiece.NORMAL)
    trainer = proto.trainer_spec
    trainer.model_type = spm.TrainerSpec.UNIGRAM
    trainer.vocab_size = vocab.size
    trainer.byte_fallback = False
    for role in ROLES:
        setattr(trainer, f"{role}_id", vocab.special.get(role, -1))
        if role in vocab.special:
            setattr(trainer, f"{role}_piece", vocab.piece(role))
    normalizer = proto.normalizer_spec
    normalizer.name = "identity"
    normalizer.add_dummy_prefix = False
    normalizer.remove_extra_whitespaces = False
    normalizer.escape_whitespaces = False
    return proto.SerializeToString(deterministic=True)


def write_tokenizer(folder: Path, config: dict) -> list[Path]:
    """Write the stand-in tokenizer for ``config`` (a config.json's dict) into ``folder``; return the paths."""
    vocab = vocabulary(config)
    contents = {"tokenizer.json": tokenizer_json(vocab), "tokenizer_config.json": tokenizer_config(vocab),
                "tokenizer.model": sentencepiece_model(vocab)}
    paths = []
    for name in FILES:
        write_atomic(folder / name, contents[name])
        paths.append(folder / name)
    return paths

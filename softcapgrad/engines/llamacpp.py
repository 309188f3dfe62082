"""llama.cpp through llama-cpp-python, on a GGUF written here from the transformers weights.

The conversion follows llama.cpp's own for Gemma 2 (its converter script's Gemma 2 class, read for
the facts): architecture ``gemma2``, every size under ``gemma2.*``, the caps as
``gemma2.attn_logit_softcapping`` and ``gemma2.final_logit_softcapping``, the window as
``gemma2.attention.sliding_window``; each norm's weight stored plus one (transformers' Gemma norms
multiply by 1 + w, llama.cpp's by w); no ``output.weight`` (the head is the token embedding); q and k
unpermuted (Gemma's rotary embedding is already the half-split form llama.cpp's NEOX rope uses).
Tensors stay f32.

llama.cpp's Gemma 2 graph caps unconditionally, with 50 and 30 when the keys are absent: a cap that
is off in transformers is written as ``OFF`` (2^100: a/c is a/2^100 exactly, tanh of it returns its
argument in f32, times 2^100 gives a back), so that the uncapped model converts exactly. It derives
the query scale from the head size (1/√head_dim, 1/√(hidden/heads) at 46 layers) and ignores
``query_pre_attn_scalar``: a model whose scalar differs is refused rather than compared wrongly.

The vocabulary is a stand-in (llama.cpp needs one to load): control tokens for pad, eos, bos and
unk, byte tokens for the rest, scores zero. Token ids go in as ids; nothing is tokenized.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

OFF = 2.0 ** 100
ARCH = "gemma2"


def _config(folder: Path) -> dict:
    import json

    return json.loads((folder / "config.json").read_text(encoding="utf-8"))


def _vocabulary(writer, size: int, config: dict) -> None:
    import gguf

    special = {config.get("pad_token_id", 0): "<pad>", config.get("eos_token_id", 1): "<eos>",
               config.get("bos_token_id", 2): "<bos>", 3: "<unk>"}
    tokens, types, byte = [], [], 0
    for i in range(size):
        if i in special and isinstance(i, int):
            tokens.append(special[i])
            types.append(int(gguf.TokenType.CONTROL))
        else:
            tokens.append(f"<0x{byte:02X}>" if byte < 256 else f"<extra{i}>")
            types.append(int(gguf.TokenType.BYTE if byte < 256 else gguf.TokenType.NORMAL))
            byte += 1
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * size)
    writer.add_token_types(types)
    writer.add_pad_token_id(config.get("pad_token_id", 0))
    writer.add_eos_token_id(config.get("eos_token_id", 1) if isinstance(config.get("eos_token_id", 1), int) else 1)
    writer.add_bos_token_id(config.get("bos_token_id", 2))
    writer.add_unk_token_id(3)
    writer.add_add_bos_token(False)


def convert(folder: Path, path: Path, keys: bool = True) -> Path:
    """The transformers Gemma 2 directory ``folder`` as a GGUF file at ``path``; ``keys`` False leaves the cap
    keys out (llama.cpp's defaults then apply)."""
    import gguf
    from safetensors.numpy import load_file

    config = _config(folder)
    if config.get("model_type") != ARCH:
        raise ValueError(f"the GGUF conversion here is for Gemma 2, not {config.get('model_type')}")
    head_dim, layers = config["head_dim"], config["num_hidden_layers"]
    expected = config["hidden_size"] / config["num_attention_heads"] if layers == 46 else head_dim
    if float(config.get("query_pre_attn_scalar", head_dim)) != float(expected):
        raise ValueError(f"query_pre_attn_scalar {config.get('query_pre_attn_scalar')}: llama.cpp scales queries by "
                         f"1/sqrt({expected:g}) whatever the config says; set it to {expected:g}")
    weights = load_file(str(folder / "model.safetensors"))
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA2, layers)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), ARCH)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(layers)
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config.get("num_key_value_heads", config["num_attention_heads"]))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    rope = config.get("rope_parameters") or {}
    writer.add_rope_freq_base(float(rope.get("rope_theta", config.get("rope_theta", 10000.0))))
    if keys:
        writer.add_attn_logit_softcapping(float(config.get("attn_logit_softcapping") or OFF))
        writer.add_final_logit_softcapping(float(config.get("final_logit_softcapping") or OFF))
    writer.add_sliding_window(config["sliding_window"])
    _vocabulary(writer, config["vocab_size"], config)
    for name in sorted(weights):
        if name == "lm_head.weight":
            continue
        data = weights[name].astype(np.float32)
        if name.endswith("norm.weight"):
            data = data + np.float32(1)
        target = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if target is None:
            raise ValueError(f"no GGUF name for the tensor {name}")
        writer.add_tensor(target, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def run_gguf(path: Path, ids: np.ndarray) -> np.ndarray:
    """llama.cpp's logits at every token, one thread, f32 KV cache (its default f16 cache would add its own
    rounding to every score)."""
    import llama_cpp

    tokens = [int(t) for t in np.asarray(ids).reshape(-1)]
    n = len(tokens)
    model = llama_cpp.Llama(model_path=str(path), n_ctx=max(32, n), n_batch=max(32, n), n_ubatch=max(32, n),
                            n_threads=1, n_threads_batch=1, logits_all=True, verbose=False, seed=0,
                            type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)
    try:
        model.eval(tokens)
        return np.array(model.scores[:n], dtype=np.float64)
    finally:
        model.close()


def logits(folder: Path, ids: np.ndarray, work: Path, name: str = "llamacpp") -> np.ndarray:
    return run_gguf(convert(folder, work / "model.gguf"), ids)

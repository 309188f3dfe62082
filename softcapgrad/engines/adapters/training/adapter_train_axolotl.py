"""axolotl as its users fine-tune with it: a YAML config, read by axolotl's own loader (validation, dtype
resolution, its model loader and trainer builder), then ``axolotl.train.train`` for one step.

The config is the smallest a user writes: ``base_model`` (the folder), one dataset (a JSON file of one
pre-tokenised row: input_ids, attention_mask and labels, which axolotl passes through untouched),
``sequence_len``, ``micro_batch_size: 1``, ``max_steps: 1``, ``output_dir``, and ``trust_remote_code: false`` (its
default already: nothing from the folder runs); the rest at axolotl's defaults.
Route ``default`` sets nothing else: axolotl 0.19.0's ``resolve_dtype`` (utils/config/__init__.py lines 163–205)
turns ``bf16: auto`` into ``fp16: true`` where no GPU offers bf16, so on a CPU the model loads in float16.
``fp32`` sets ``bf16: false`` and ``fp16: false`` (float32 weights); ``fp32-eager`` also ``attn_implementation:
eager`` (axolotl's default, None, leaves the choice to transformers); ``bf16`` sets ``bf16: true``; ``lora`` is
``fp32`` with ``adapter: lora``, ``lora_target_linear: true``, ``lora_r: 32``, ``lora_alpha: 16`` (axolotl has no
default rank) and ``lora_dropout: 0`` (a dropout mask would make the step random); axolotl then switches its own
LoRA kernels on (``check_auto_enable_lora_kernels``, utils/schemas/config.py lines 1974–2080), which allocate on
CUDA (kernels/geglu.py line 60): ``lora-no-kernels`` sets the four ``lora_*_kernel`` options false.

On a CPU two of these routes stop before the step, and the row says why: ``default``'s float16 linear layers
meet float32 hidden states, because axolotl's loader casts the embedding and every module named "norm" to float32
(``_configure_embedding_dtypes``, loaders/model.py lines 435–450, through lines 1153–1175) and casts them back
only for flash-attention or Cut Cross-Entropy (lines 470–490); without autocast on the CPU nothing reconciles the
two (that Trainer runs no float16 autocast on a CPU is a guess, not read). ``bf16`` reaches transformers'
TrainingArguments, which refuses bf16 without ``use_cpu`` where no GPU has it (transformers 5.16.1,
training_args.py lines 1737–1741); axolotl's builder never sets ``use_cpu``.

axolotl's collator pads every batch to a multiple of 64 positions (core/builders/causal.py lines 386–394:
``pad_to_multiple_of`` 64 when ``pad_to_sequence_len`` is unset), with labels -100 there, on the side the folder's
tokenizer pads; the model is causal, so the real positions do not see right padding, and the per-position arrays
are cut back to the positions the batch's attention mask marks.

Telemetry is switched off (``AXOLOTL_DO_NOT_TRACK=1``) before axolotl is imported: its opt-out client otherwise
posts to a server at exit. What the step computed is written as adapter_train_transformers writes it, the LoRA
route's as its LoRA routes (each adapted layer's dL/dB with A and the scale)."""

import json
import os

import numpy as np

import adapter_train_transformers as base

ROUTES = {
    "default": "axolotl train on a minimal config, everything else at axolotl's defaults (on a CPU: float16)",
    "fp32": "the same config with bf16: false, fp16: false",
    "fp32-eager": "the same with attn_implementation: eager",
    "bf16": "the same config with bf16: true",
    "lora": "fp32 with adapter: lora, lora_target_linear: true, lora_r: 32, lora_alpha: 16, lora_dropout: 0",
    "lora-no-kernels": "the same LoRA with axolotl's LoRA kernels off (lora_mlp/qkv/o/embedding_kernel: false)",
}
CHANGES = {"default": {}, "fp32": {"bf16": False, "fp16": False},
           "fp32-eager": {"bf16": False, "fp16": False, "attn_implementation": "eager"},
           "bf16": {"bf16": True},
           "lora": {"bf16": False, "fp16": False, "adapter": "lora", "lora_target_linear": True, "lora_r": 32,
                    "lora_alpha": 16, "lora_dropout": 0.0}}
CHANGES["lora-no-kernels"] = CHANGES["lora"] | {f"lora_{k}_kernel": False for k in ("mlp", "qkv", "o", "embedding")}
PER_POSITION = ("logits", "logits_grad", "precap", "precap_grad")
PACKAGES = ("axolotl", "transformers", "torch", "trl", "peft", "accelerate")


def config(folder, data, scratch, route: str) -> dict:
    """The YAML a user writes for one step on ``folder`` (as a dict: YAML is a superset of JSON)."""
    return {"base_model": str(folder), "datasets": [{"path": str(data), "ds_type": "json"}],
            "sequence_len": 64, "learning_rate": 5e-5, "micro_batch_size": 1, "gradient_accumulation_steps": 1,
            "max_steps": 1, "num_epochs": 1, "output_dir": str(scratch / "out"),
            "dataset_prepared_path": str(scratch / "prepared"),
            "save_strategy": "no", "logging_steps": 1, "trust_remote_code": False, **CHANGES[route]}


def run_variant(run, variant: str) -> dict:
    os.environ["AXOLOTL_DO_NOT_TRACK"] = "1"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from axolotl import train as axolotl_train
    from axolotl.cli.args import TrainerCliArgs
    from axolotl.cli.config import load_cfg
    from axolotl.common.datasets import load_datasets

    torch.manual_seed(0)
    scratch = run.scratch(variant)
    ids = [int(i) for i in run.ids]
    data = scratch / "data.jsonl"
    data.write_text(json.dumps({"input_ids": ids, "attention_mask": [1] * len(ids), "labels": ids}) + "\n",
                    encoding="utf-8")
    path = scratch / "config.yml"
    path.write_text(json.dumps(config(run.folder(variant), data, scratch, run.route), indent=1), encoding="utf-8")
    cfg = load_cfg(str(path))
    meta = load_datasets(cfg=cfg, cli_args=TrainerCliArgs())
    seen: dict = {}
    setup = axolotl_train.setup_model_and_trainer

    def watched_setup(cfg, dataset_meta):  # axolotl's own setup; the step's hooks go on the model it built
        built = setup(cfg, dataset_meta)
        model = built[1]
        inner = model.get_base_model() if hasattr(model, "get_base_model") else model
        seen["model"], seen["inner"] = model, inner
        seen["kept"], seen["remove"] = base.watch(model, inner.get_output_embeddings())
        return built

    axolotl_train.setup_model_and_trainer = watched_setup
    try:
        axolotl_train.train(cfg=cfg, dataset_meta=meta)
    finally:
        axolotl_train.setup_model_and_trainer = setup
        if "remove" in seen:
            seen["remove"]()
    model, inner, kept = seen["model"], seen["inner"], seen["kept"]
    dtype = str(next(inner.parameters()).dtype).replace("torch.", "")
    attention = getattr(inner.config, "_attn_implementation", "?")
    lora = run.route.startswith("lora")
    run.did = (f"axolotl train ({run.route}: bf16={cfg.bf16}, fp16={cfg.fp16}{', LoRA' if lora else ''}) on "
               f"{type(inner).__name__}, attention {attention}, weights {dtype}; logits "
               f"{kept.get('logits_dtype', '?')}, final cap input {kept.get('precap_dtype', '?')}")
    run.precision = "bf16" if cfg.bf16 is True or dtype == "bfloat16" else "fp16" if cfg.fp16 or \
        dtype == "float16" else "fp32"
    out = base.arrays(kept, model if lora else None)
    real = np.flatnonzero(kept["attention_mask"]) if "attention_mask" in kept else np.arange(len(ids))
    if real.size != len(ids):
        raise RuntimeError(f"the step's batch holds {real.size} unpadded positions, not the {len(ids)} token ids")
    for name in PER_POSITION:
        if name in out:
            out[name] = out[name][real]
    return out


if __name__ == "__main__":
    raise SystemExit(base.main(routes=ROUTES, run_variant=run_variant, packages=PACKAGES))

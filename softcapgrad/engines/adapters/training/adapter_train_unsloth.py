"""unsloth as its users fine-tune with it, on the CPU: its fallback there (unsloth 2026.10.9: "no GPU found,
training on CPU ... supported: text LoRA / full finetuning with SFTTrainer") runs transformers' own model code.

``FastLanguageModel.from_pretrained(folder)`` at its defaults (unsloth picks the dtype and transformers the
attention), then one step of trl's ``SFTTrainer`` at ``SFTConfig``'s defaults, as unsloth's notebooks train. Route
``lora`` first wraps the model with ``FastLanguageModel.get_peft_model`` at its defaults; the loader's default
``load_in_4bit=True`` has quantized the base weights to 4-bit NF4 (bitsandbytes' CPU backend), so it is a QLoRA
step, judged in 4 bits. Route ``full`` loads with ``full_finetuning=True``, unquantized; ``full-eager`` also with
``attn_implementation="eager"``. What the step computed is written as adapter_train_transformers writes it (its
LoRA routes: each adapted layer's dL/dB with A and the scale)."""

import adapter_train_transformers as base

ROUTES = {
    "lora": "FastLanguageModel.from_pretrained(folder) and get_peft_model at their defaults, one SFTTrainer step at "
            "SFTConfig's defaults",
    "full": "FastLanguageModel.from_pretrained(folder, full_finetuning=True), one SFTTrainer step at SFTConfig's "
            "defaults",
    "full-eager": 'the same with attn_implementation="eager", which the loader passes on to transformers',
}
LOADED = {"lora": {}, "full": {"full_finetuning": True},
          "full-eager": {"full_finetuning": True, "attn_implementation": "eager"}}
PACKAGES = ("unsloth", "unsloth_zoo", "transformers", "torch", "trl", "peft")


def run_variant(run, variant: str) -> dict:
    import torch
    from unsloth import FastLanguageModel  # first: it patches transformers and trl as it imports

    torch.manual_seed(0)
    folder = run.folder(variant)
    model, _ = FastLanguageModel.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False,
                                                 **LOADED[run.route])
    head = model.get_output_embeddings()
    dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    four_bit = bool(getattr(model, "is_loaded_in_4bit", False))  # load_in_4bit=True, its default: bitsandbytes NF4
    attention = getattr(model.config, "_attn_implementation", "?")
    wrapped = None
    if run.route == "lora":
        model = wrapped = FastLanguageModel.get_peft_model(model)

    def trainer(m, ids, scratch):
        return base.sft(m, ids, folder, scratch)

    kept = base.step(model, head, run.ids, trainer, False, run.scratch(variant))
    bf16 = kept.pop("bf16", False)
    weights = f"4-bit NF4 (bitsandbytes), compute {dtype}" if four_bit else dtype
    run.did = (f"unsloth FastLanguageModel ({run.route}{', get_peft_model defaults' if wrapped else ''}) on "
               f"{type(model).__name__}, attention {attention}, weights {weights}, trl SFTTrainer (one step, SFTConfig "
               f"defaults{', bf16=True' if bf16 else ''}); logits {kept.get('logits_dtype', '?')}, final cap input "
               f"{kept.get('precap_dtype', '?')}")
    run.precision = "nf4" if four_bit else "bf16" if bf16 or dtype == "bfloat16" else "fp32"
    return base.arrays(kept, wrapped)


if __name__ == "__main__":
    raise SystemExit(base.main(routes=ROUTES, run_variant=run_variant, packages=PACKAGES))

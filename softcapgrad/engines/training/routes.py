"""The training check's routes: each engine's environment, its adapter, its routes as its users take them, and
the libraries a row's versions name first (engines/training/parity.py runs them)."""

from __future__ import annotations

from softcapgrad.engines.forward import catalog
from softcapgrad.engines.environments.environments import MAIN

ADAPTER = "train_transformers"
ENGINES = {"transformers": MAIN, "transformers-4": "transformers-4", "transformers-5.0": "transformers-5.0",
           "peft-trl": "train-peft", "torchtune": "torchtune", "litgpt": "litgpt", "kerashub": "train-kerashub",
           "mlx-lm": "mlx-lm", "fused-loss": "train-fused", "gemma-jax": "gemma-jax", "unsloth": "train-unsloth",
           "axolotl": "train-axolotl", "easydel": "train-easydel",
           "penzai": "train-penzai", "unsloth-zoo-rl": "train-unsloth"}
ADAPTERS = {"torchtune": "train_torch_tune", "litgpt": "train_lit_gpt",  # engine -> its training adapter (else ADAPTER)
            "kerashub": "train_kerashub", "mlx-lm": "train_mlxlm", "fused-loss": "train_fused",
            "gemma-jax": "train_gemma_jax", "unsloth": "train_unsloth", "axolotl": "train_axolotl",
            "easydel": "train_easydel", "penzai": "train_penzai", "unsloth-zoo-rl": "train_unsloth_rl"}
TRAINER_ROUTES = (
    catalog.Route("default", "Trainer, one step at its defaults (fp32); attention as transformers picks it"),
    catalog.Route("eager", 'Trainer at its defaults, attn_implementation="eager"'),
    catalog.Route("default-bf16", "Trainer with bf16=True (autocast); attention as transformers picks it", "bf16"),
    catalog.Route("eager-bf16", 'Trainer with bf16=True, attn_implementation="eager"', "bf16"),
    catalog.Route("loop-default", "loss.backward() without Trainer (fp32); attention as transformers picks it"),
    catalog.Route("loop-eager", 'loss.backward() without Trainer, attn_implementation="eager"'),
)
LIBRARY_ROUTES = (  # the training libraries on top of the pinned transformers, each at its own defaults
    catalog.Route("lora", "peft LoRA at LoraConfig(task_type='CAUSAL_LM') defaults, one Trainer step; attention "
                          "as transformers picks it"),
    catalog.Route("lora-eager", 'peft LoRA, one Trainer step, attn_implementation="eager"'),
    catalog.Route("sft", "trl SFTTrainer, one step at SFTConfig's defaults (their precision); attention as "
                         "transformers picks it"),
    catalog.Route("sft-eager", 'trl SFTTrainer at SFTConfig\'s defaults, attn_implementation="eager"'),
    catalog.Route("sft-fp32", "trl SFTTrainer at SFTConfig's defaults but bf16=False; attention as transformers "
                              "picks it"),
)
TUNE_ROUTES = (  # torchtune's own Gemma 2, in parity's torchtune environment
    catalog.Route("default", "torchtune's full fine-tune step on its gemma2 builder, the caps as its named Gemma 2 "
                             "builders pass them"),
    catalog.Route("config-caps", "the same step with the caps read from config.json"),
)
LIT_ROUTES = (catalog.Route("default", "LitGPT's full fine-tune step on its own GPT, converted with the family's "
                                       "named config"),)
KERAS_ROUTES = (catalog.Route("jax", "Keras Hub's own CausalLM, one fit step on the JAX backend, float32"),
                catalog.Route("jax-mixed-bf16", "the same under the mixed_bfloat16 dtype policy", "bf16"),
                catalog.Route("torch", "Keras Hub's own CausalLM, one fit step on the torch backend, float32"),
                catalog.Route("torch-mixed-bf16", "the same under the mixed_bfloat16 dtype policy", "bf16"))
MLX_ROUTES = (catalog.Route("full", "mlx-lm's own model, one step as mlx_lm.lora --fine-tune-type full takes it "
                                     "(default_loss, every block trained), the weights' dtype (fp32)"),
              catalog.Route("full-bf16", "the same step after model.set_dtype(mx.bfloat16)", "bf16"),
              catalog.Route("lora", "mlx_lm.lora's LoRA step at its CLI defaults (rank 8, scale 20), every block"))
FUSED_ROUTES = (  # the final cap inside a fused linear cross-entropy, on transformers' model (eager, fp32)
    catalog.Route("cce", "Cut Cross-Entropy's linear_cross_entropy on the final hidden state and the head's weight, "
                         "softcap=final_logit_softcapping, impl='torch_compile' (its implementation without a GPU)"),
    catalog.Route("cce-no-softcap", "the same call without softcap, as Cut Cross-Entropy's README example makes it"),
    catalog.Route("cce-default", "the same call with its default implementation, impl='cce' (Triton kernels)"),
    catalog.Route("liger", "Liger-Kernel's _apply_liger_kernel_to_instance(model) at its defaults (its fused linear "
                           "cross-entropy takes the final cap), then model(ids, labels=ids)"))
GEMMA_JAX_ROUTES = (catalog.Route("default", "Google DeepMind's gemma (JAX): its own training on the folder's "
                                              "weights, through its own reader of a Hugging Face folder if it ships "
                                              "one"),)
UNSLOTH_ROUTES = (  # unsloth's CPU fallback: transformers' own model under its loader and trl's SFTTrainer
    catalog.Route("lora", "unsloth's FastLanguageModel and get_peft_model at their defaults (load_in_4bit: a QLoRA "
                          "step on 4-bit NF4 weights), one SFTTrainer step", "nf4"),
    catalog.Route("full", "unsloth's FastLanguageModel with full_finetuning=True, one SFTTrainer step", "bf16"),
    catalog.Route("full-eager", 'the same with attn_implementation="eager"', "bf16"))
AXOLOTL_ROUTES = (  # axolotl's own config loader, model loader and trainer builder, from a YAML config
    catalog.Route("default", "axolotl train on a minimal config, the rest at its defaults (on a CPU: float16 weights)",
                  "fp16"),
    catalog.Route("fp32", "the same config with bf16: false, fp16: false"),
    catalog.Route("fp32-eager", "the same with attn_implementation: eager"),
    catalog.Route("bf16", "the same config with bf16: true", "bf16"),
    catalog.Route("lora", "fp32 with adapter: lora, lora_target_linear: true (axolotl's LoRA kernels switch on)"),
    catalog.Route("lora-no-kernels", "the same LoRA with lora_mlp/qkv/o/embedding_kernel: false"))
EASYDEL_ROUTES = (  # EasyDeL's own Flax model from its reader of the folder, its Trainer's step function
    catalog.Route("default", "EasyDeL's Trainer step on AutoEasyDeLModelForCausalLM.from_pretrained at its defaults "
                             "(float32, as its signature says)"),
    catalog.Route("fp32", "the same with torch_dtype=torch.float32 and attn_dtype=float32"),
    catalog.Route("bf16", "the same with dtype and param_dtype bfloat16", "bf16"))
PENZAI_ROUTES = (catalog.Route("default", "penzai's own Gemma (JAX) from the folder's weights, through its own reader "
                                           "of a Hugging Face folder or model for Gemma if it ships one"),)
UNSLOTH_RL_ROUTES = (  # an RL trainer's per-token log-probs: the final cap inside its log-softmax of the hidden state
    catalog.Route("grpo", "unsloth-zoo's chunked_hidden_states_selective_log_softmax as unsloth's GRPO trainer calls "
                          "it (logit_softcapping=final_logit_softcapping, temperature 1.0) on transformers' final "
                          "hidden state; the loss −mean(log-probs), judged on the log-probs and gradients"),)
ROUTES_OF = {"unsloth-zoo-rl": UNSLOTH_RL_ROUTES, "unsloth": UNSLOTH_ROUTES, "axolotl": AXOLOTL_ROUTES, "peft-trl": LIBRARY_ROUTES, "torchtune": TUNE_ROUTES,
             "litgpt": LIT_ROUTES, "kerashub": KERAS_ROUTES, "mlx-lm": MLX_ROUTES, "fused-loss": FUSED_ROUTES,
             "gemma-jax": GEMMA_JAX_ROUTES, "easydel": EASYDEL_ROUTES,
             "penzai": PENZAI_ROUTES}
ROUTES = TRAINER_ROUTES + LIBRARY_ROUTES  # every route of adapter_train_transformers
DEFAULTS = {  # the routes a user runs without changing a setting, and the mixed-precision switch each library
    # documents (Trainer's bf16=True, Keras' mixed_bfloat16): a row of one left undecided is a gap in the answer
    **{e: ("default", "default-bf16", "loop-default") for e in ("transformers", "transformers-4", "transformers-5.0")},
    "peft-trl": ("lora", "sft"), "torchtune": ("default",), "litgpt": ("default",),
    "kerashub": ("jax", "jax-mixed-bf16", "torch", "torch-mixed-bf16"), "mlx-lm": ("full", "lora"),
    "fused-loss": ("cce-default", "liger"), "gemma-jax": ("default",), "unsloth": ("lora", "full"),
    "axolotl": ("default",), "easydel": ("default",), "penzai": ("default",), "unsloth-zoo-rl": ("grpo",)}


def routes(engine: str) -> tuple:
    return ROUTES_OF.get(engine, TRAINER_ROUTES)


LIBRARIES = {"peft-trl": ("peft", "trl"), "torchtune": ("torchtune",), "litgpt": ("litgpt",),  # what trained, first
             "kerashub": ("keras-hub", "keras", "jax"), "mlx-lm": ("mlx-lm", "mlx"),
             "fused-loss": ("cut-cross-entropy", "liger-kernel"), "gemma-jax": ("gemma",),
             "unsloth": ("unsloth", "trl"), "axolotl": ("axolotl", "trl", "peft"), "easydel": ("easydel",),
             "penzai": ("penzai", "jax"), "unsloth-zoo-rl": ("unsloth-zoo", "unsloth")}


NEEDS = {  # the distributions --python's interpreter must hold for the engine's adapter (names as pip lists them)
    **{e: ("numpy", "torch", "transformers") for e in ("transformers", "transformers-4", "transformers-5.0")},
    "peft-trl": ("numpy", "torch", "transformers", "peft", "trl", "datasets"), "torchtune": ("torch", "torchtune"),
    "litgpt": ("torch", "litgpt"), "kerashub": ("keras-hub", "keras", "jax"), "mlx-lm": ("mlx", "mlx-lm"),
    "fused-loss": ("torch", "transformers", "cut-cross-entropy", "liger-kernel"), "gemma-jax": ("gemma",),
    "unsloth": ("unsloth", "trl"), "axolotl": ("axolotl", "trl", "peft"), "easydel": ("easydel",),
    "penzai": ("penzai",), "unsloth-zoo-rl": ("numpy", "torch", "transformers", "unsloth-zoo")}
ABSENT = {  # model types an engine's routes have no model for, each measured as "no such architecture" on every
    # route (results/train-parity.json): train-parity DIR refuses a folder of one of them when no engine asked has it
    "transformers-4": ("nanochat",), "torchtune": ("gemma3_text", "nanochat"), "litgpt": ("nanochat",),
    "kerashub": ("nanochat",), "gemma-jax": ("nanochat",), "easydel": ("nanochat",),
    "penzai": ("gemma3_text", "nanochat")}


def _short(versions: dict, engine: str) -> str:
    """A row's versions: the engine's own libraries, then the transformers, torch and accelerate beneath them."""
    names = LIBRARIES.get(engine, ()) + ("transformers", "torch", "accelerate")
    return ", ".join(f"{k} {versions[k]}" for k in names if k in versions)

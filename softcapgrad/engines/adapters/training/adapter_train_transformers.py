"""One training step of a transformers model as its users train it, with what the step computed.

Routes ``default`` and ``eager`` run ``transformers.Trainer`` for one step at its defaults (AdamW,
learning rate 5e-5, gradient clipping at 1.0, the model's own loss), on the CPU, on a dataset of
one example (the token ids as inputs and labels); ``*-bf16`` sets ``bf16=True`` as well (autocast to
bf16 over fp32 weights). ``loop-*`` is the plain PyTorch loop without Trainer:
``model(input_ids=ids, labels=ids).loss.backward()``, for environments where Trainer cannot start.
The model is loaded as adapter_transformers_load loads it (local files only, no remote code;
``attn_implementation="eager"`` for routes ending in ``eager`` or ``eager-bf16``).

Routes ``lora`` and ``lora-eager`` wrap the model in peft's ``get_peft_model`` with ``LoraConfig(task_type=
"CAUSAL_LM")`` at its defaults (peft's own target modules for the model type, B initialised to zero, so the
step's logits are the base model's) and run one Trainer step; the step's gradients are those of each adapted
layer's B, written under the base weight's name, with that layer's A (``lora_A/<weight>``) and scale
(``lora_scale``): at B = 0, dL/dB = scale·(dL/dW)·Aᵀ, which the check computes from the reference's dL/dW.
Routes ``sft`` and ``sft-eager`` run one step of trl's ``SFTTrainer`` at ``SFTConfig``'s defaults (with the
folder's tokenizer), whatever precision those choose, on a dataset of one pre-tokenised example; ``sft-fp32``
sets ``bf16=False``. SFTTrainer computes its loss through trl's own fused head, which returns each position's
log-prob of its label and no logits: those are written as ``token_log_probs``.

Per variant folder the adapter writes the returned logits as every adapter does (``VARIANT.npy``), and
``WORK/out/ROUTE/VARIANT.npz`` (read with allow_pickle=False):
``loss``, the returned ``logits`` [tokens, vocab], ``logits_grad`` (the loss's gradient at them;
absent where the loss does not read them), ``precap`` and ``precap_grad`` (the output projection's
output, the final cap's input, and the gradient there), ``attention_cap`` [scores, 4] (where the model has an
attention cap and its code calls it: each score's a, dL/da, dL/dz and the c its call used, every layer's),
and ``grad/<parameter>`` for each parameter: its gradient as the backward accumulated it, before the Trainer
clips it.
"""

import json
import sys
import traceback
import types
from pathlib import Path

import numpy as np

import adapter_protocol as protocol
from adapter_transformers_load import load, precision

ROUTES = {
    "default": "Trainer, one step at its defaults (fp32), on from_pretrained(folder) as transformers picks the attention",
    "eager": 'the same, loaded with attn_implementation="eager"',
    "default-bf16": "Trainer with bf16=True (autocast to bf16 over fp32 weights), attention as transformers picks it",
    "eager-bf16": 'Trainer with bf16=True, loaded with attn_implementation="eager"',
    "loop-default": "model(input_ids, labels).loss.backward() without Trainer (fp32), attention as transformers picks",
    "loop-eager": 'the same loop, loaded with attn_implementation="eager"',
    "lora": "peft LoRA at LoraConfig(task_type='CAUSAL_LM') defaults, one Trainer step; attention as transformers "
            "picks it",
    "lora-eager": 'the same, loaded with attn_implementation="eager"',
    "sft": "trl SFTTrainer, one step at SFTConfig's defaults; attention as transformers picks it",
    "sft-eager": 'the same, loaded with attn_implementation="eager"',
    "sft-fp32": "trl SFTTrainer, one step at SFTConfig's defaults but bf16=False",
}
PACKAGES = ("transformers", "torch", "accelerate", "peft", "trl")


class _Rows:
    """A dataset of one example for Trainer: the ids as inputs and labels."""

    def __init__(self, ids):
        self.ids = ids

    def __len__(self):
        return 1

    def __getitem__(self, i):
        import torch

        x = torch.as_tensor(self.ids, dtype=torch.long)
        return {"input_ids": x, "labels": x.clone()}


def _attention_cap(kept: dict):
    """A torch function mode that keeps each attention-cap call's input a, dL/da and dL/dz, as the model's own code
    makes the call: a 4-D score tensor divided by a number c, the quotient into torch.tanh, the tanh times the same
    c (transformers' eager attention for Gemma, LitGPT's do_softcapping, torchtune's Gemma 2 attention). Nothing is
    changed: each op runs as called, and only that sequence is read, whatever c the code uses."""
    from torch.overrides import TorchFunctionMode

    def number(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    def array(t):
        return t.detach().double().cpu().numpy().ravel().copy()

    class AttentionCap(TorchFunctionMode):
        divided = capped = None  # (quotient, a, c), then (tanh output, a, c): the call in progress

        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = getattr(func, "__name__", "")
            if name in ("__truediv__", "div") and len(args) == 2 and number(args[1]) \
                    and getattr(args[0], "ndim", 0) == 4:
                self.divided = (out, args[0], float(args[1]))
            elif name == "tanh" and self.divided is not None and args and args[0] is self.divided[0]:
                self.capped, self.divided = (out, *self.divided[1:]), None
            elif name in ("__mul__", "__rmul__", "mul") and self.capped is not None and len(args) == 2 \
                    and args[0] is self.capped[0] and number(args[1]) and float(args[1]) == self.capped[2]:
                a, c, self.capped = self.capped[1], self.capped[2], None
                entry = {"a": array(a), "c": c}
                kept.setdefault("attention", []).append(entry)
                if a.requires_grad and out.requires_grad:
                    a.register_hook(lambda g: entry.__setitem__("da", array(g)))
                    out.register_hook(lambda g: entry.__setitem__("dz", array(g)))
            return out

    return AttentionCap()


def attention_watch(kept: dict):
    """The mode that keeps the attention cap's calls in ``kept["attention"]`` while it is entered (``with``). A
    step whose attention calls no cap then writes an empty array."""
    kept["attention"] = []
    return _attention_cap(kept)


def attention_array(kept: dict) -> dict:
    """``attention_cap`` [scores, 4] (each score's a, dL/da, dL/dz and the c its call divided by, over every call)
    where the calls were watched."""
    if "attention" not in kept:
        return {}
    calls = [np.stack([e["a"], e["da"], e["dz"], np.full(e["a"].shape, e["c"])], axis=1) for e in kept["attention"]
             if "da" in e and "dz" in e]
    return {"attention_cap": np.concatenate(calls) if calls else np.zeros((0, 4))}


def watch(model, head):
    """Hooks that keep what the step computes: the parameters' gradients, the returned logits and the loss, the
    output projection's output (the final cap's input) and the gradients at both, and each attention-cap call's
    input with the gradients at it and at its output. Returns (kept, remove)."""
    kept = {"grad": {}}
    names = {id(p): n for n, p in model.named_parameters()}
    handles = []

    def on_grad(p):
        kept["grad"][names[id(p)]] = p.grad.detach().double().cpu().numpy().copy()

    for p in model.parameters():
        if p.requires_grad:
            handles.append(p.register_post_accumulate_grad_hook(on_grad))

    def keep(name):
        def hook(g):
            kept[name] = g.detach()[0].double().cpu().numpy().copy()
        return hook

    def on_head(module, args, out):
        kept["precap"] = out.detach()[0].double().cpu().numpy().copy()
        kept["precap_dtype"] = str(out.dtype).replace("torch.", "")
        if out.requires_grad:
            out.register_hook(keep("precap_grad"))

    def on_model(module, args, kwargs, out):
        if getattr(out, "logits", None) is None and getattr(out, "log_probs", None) is not None:
            # a fused head (trl's): each position's log-prob of its label, no logits
            kept["token_log_probs"] = out.log_probs.detach()[0].double().cpu().numpy().copy()
            kept["logits_dtype"] = f"none (fused head, log-probs {str(out.log_probs.dtype).replace('torch.', '')})"
            if out.loss is not None:
                kept["loss"] = float(out.loss.detach().double())
            return
        logits = out["logits"] if isinstance(out, dict) else out.logits
        kept["logits"] = logits.detach()[0].double().cpu().numpy().copy()
        mask = kwargs.get("attention_mask")
        if mask is not None:  # which positions hold tokens, where a collator padded the batch
            kept["attention_mask"] = mask.detach()[0].cpu().numpy() != 0
        kept["logits_dtype"] = str(logits.dtype).replace("torch.", "")
        loss = out["loss"] if isinstance(out, dict) else out.loss
        if loss is not None:
            kept["loss"] = float(loss.detach().double())
        if logits.requires_grad:
            logits.register_hook(keep("logits_grad"))

    handles.append(head.register_forward_hook(on_head, prepend=True))  # the head's own output, before other hooks
    handles.append(model.register_forward_hook(on_model, with_kwargs=True))
    capped = getattr(getattr(model, "config", None), "attn_logit_softcapping", None)
    mode = attention_watch(kept) if capped else None
    if mode is not None:  # entered here and left in remove(): the step runs between the two, outside this code
        mode.__enter__()

    def remove():
        if mode is not None:
            mode.__exit__(None, None, None)
        for h in handles:
            h.remove()

    return kept, remove


def sft(model, ids, folder: Path, scratch: Path, **changes) -> bool:
    """One step of trl's SFTTrainer at SFTConfig's defaults (but ``changes``); whether it trained in bf16."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    args = SFTConfig(output_dir=str(scratch), max_steps=1, report_to="none", save_strategy="no", use_cpu=True,
                     disable_tqdm=True, dataloader_num_workers=0, **changes)
    data = Dataset.from_dict({"input_ids": [[int(i) for i in ids]]})
    trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
    trainer.train()
    return bool(trainer.args.bf16)


def lora_arrays(model, kept: dict) -> dict:
    """The adapted layers' dL/dB under their base weight's name, with each layer's A and the scale."""
    out = {}
    for name, module in model.named_modules():
        a = getattr(module, "lora_A", None)
        if a is None or "default" not in a:
            continue
        base = name.removeprefix("base_model.model.") + ".weight"
        out[f"grad/{base}"] = kept["grad"][f"{name}.lora_B.default.weight"]
        out[f"lora_A/{base}"] = a["default"].weight.detach().double().cpu().numpy().copy()
        out["lora_scale"] = np.asarray(float(module.scaling["default"]), dtype=np.float64)
    if not out:
        raise RuntimeError("peft adapted no layer of this model")
    return out


def step(model, head, ids, trainer: bool, bf16: bool, scratch: Path) -> dict:
    """One training step of ``model`` on ``ids``; what ``watch`` kept."""
    import torch

    kept, remove = watch(model, head)
    try:
        if callable(trainer):  # a library's own trainer: it says whether it chose bf16
            kept["bf16"] = trainer(model, ids, scratch)
        elif trainer:
            from transformers import Trainer, TrainingArguments

            args = TrainingArguments(output_dir=str(scratch), max_steps=1, report_to="none", save_strategy="no",
                                     use_cpu=True, bf16=bf16, disable_tqdm=True, dataloader_num_workers=0)
            Trainer(model=model, args=args, train_dataset=_Rows(ids)).train()
        else:
            model.train()
            x = torch.as_tensor(ids, dtype=torch.long).reshape(1, -1)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                out = model(input_ids=x, labels=x, use_cache=False)
            out.loss.backward()
    finally:
        remove()
    return kept


def arrays(kept: dict, model=None) -> dict:
    out = {"loss": np.asarray(kept.get("loss", np.nan), dtype=np.float64)}
    for name in ("logits", "token_log_probs", "logits_grad", "precap", "precap_grad"):
        if name in kept:
            out[name] = kept[name]
    out.update(attention_array(kept))
    if model is not None:  # a LoRA step: its B gradients, A and scale
        out.update(lora_arrays(model, kept))
    else:
        out.update({f"grad/{k}": v for k, v in kept["grad"].items()})
    return out


def loaded_as(route: str) -> str:
    """The route name the loader reads (it loads eager attention for names ending in ``eager``): ``eager-bf16``
    loads as ``eager``. Read as its own name, it loaded the default attention, sdpa in transformers 4.57.6 and
    5.0.0, which takes no cap."""
    return route.removesuffix("-bf16")


def run_variant(run, variant: str) -> dict:
    import torch

    torch.manual_seed(0)
    model, attention, dtype = load(types.SimpleNamespace(route=loaded_as(run.route), folder=run.folder), variant)
    head = model.get_output_embeddings()
    wrapped, how = None, ""
    if run.route.startswith("lora"):
        from peft import LoraConfig, get_peft_model

        model = wrapped = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM"))
        how = "peft LoRA (LoraConfig defaults), "
    if run.route.startswith("sft"):
        changes = {"bf16": False} if run.route == "sft-fp32" else {}

        def trainer(m, ids, scratch, folder=run.folder(variant)):
            return sft(m, ids, folder, scratch, **changes)
        bf16, how = None, f"trl SFTTrainer (one step, SFTConfig defaults{', bf16=False' if changes else ''})"
    else:
        trainer, bf16 = not run.route.startswith("loop-"), run.route.endswith("-bf16")
        how += "Trainer (one step, defaults)" if trainer else "loss.backward()"
    kept = step(model, head, run.ids, trainer, bf16, run.scratch(variant))
    bf16 = kept.pop("bf16", bf16)
    run.did = (f"{how} on {type(model).__name__}, attention {attention}, weights {dtype}"
               f"{', bf16=True (autocast)' if bf16 else ''}; logits {kept['logits_dtype']}, final cap input "
               f"{kept.get('precap_dtype', '?')}")
    run.precision = "bf16" if bf16 else precision(dtype)
    return arrays(kept, wrapped)


def converted(loss, logits, grads: dict, **kept) -> dict:
    """A library's own step as this adapter writes one: its loss, logits [tokens, vocab] and each gradient already
    under transformers' parameter names (torch tensors), as float64 arrays; ``kept``: ``precap``, ``precap_grad``,
    ``logits_grad`` where the library exposes them ([1, tokens, vocab] tensors)."""
    out = {"loss": np.asarray(float(loss.detach()), dtype=np.float64),
           "logits": logits.detach()[0].double().cpu().numpy().copy()}
    out.update({k: v.detach()[0].double().cpu().numpy().copy() for k, v in kept.items() if v is not None})
    out.update({f"grad/{k}": v.detach().double().cpu().numpy().copy() for k, v in grads.items()})
    return out


def main(argv=None, routes=None, run_variant=None, packages=PACKAGES) -> int:
    """``WORK ROUTE VARIANT...`` as adapter_protocol.main reads them; one .npz per variant and info.json. Another
    training adapter passes its own ``routes``, ``run_variant`` (returning the arrays ``arrays`` gives) and
    ``packages``."""
    argv = sys.argv[1:] if argv is None else argv
    routes, run_variant = routes or ROUTES, run_variant or globals()["run_variant"]
    if len(argv) < 3:
        return protocol.reason("usage: WORK ROUTE VARIANT...", protocol.FAILED)
    work, route, variants = Path(argv[0]), argv[1], argv[2:]
    if route not in routes:
        return protocol.reason(f"unknown route {route!r}; this adapter has {', '.join(routes)}", protocol.FAILED)
    run = protocol.Run(work, route, variants, np.load(work / "ids.npy", allow_pickle=False).astype(np.int64))
    out = work / "out" / route
    out.mkdir(parents=True, exist_ok=True)
    failed = {}
    for variant in variants:
        try:
            step = run_variant(run, variant)
            np.savez(out / f"{variant}.npz", **step)
            shown = step["logits"] if "logits" in step else step["token_log_probs"].reshape(1, -1)  # fused: [1, n−1]
            np.save(out / f"{variant}.npy", shown, allow_pickle=False)  # as the runner reads every adapter
        except protocol.NoArchitecture as err:
            return protocol.reason(f"the engine has no such architecture: {err}", protocol.NO_ARCHITECTURE)
        except Exception as err:  # noqa: BLE001 -- any failure of the step is the variant's reason
            traceback.print_exc(file=sys.stderr)
            failed[variant] = " ".join(f"{type(err).__name__}: {err}".split())[:400]
    if len(failed) == len(variants):
        return protocol.reason(failed[variants[0]], protocol.FAILED)
    info = {"route": route, "route_text": routes[route], "did": run.did, "precision": run.precision,
            "versions": protocol.versions(packages), "failed": failed}
    (out / "info.json").write_text(json.dumps(info, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

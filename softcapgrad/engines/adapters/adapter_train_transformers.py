"""One training step of a transformers model as its users train it, with what the step computed.

Routes ``default`` and ``eager`` run ``transformers.Trainer`` for one step at its defaults (AdamW,
learning rate 5e-5, gradient clipping at 1.0, the model's own loss), on the CPU, on a dataset of
one example (the token ids as inputs and labels); ``*-bf16`` sets ``bf16=True`` as well (autocast to
bf16 over fp32 weights). ``loop-*`` is the plain PyTorch loop without Trainer:
``model(input_ids=ids, labels=ids).loss.backward()``, for environments where Trainer cannot start.
The model is loaded as adapter_transformers_load loads it (local files only, no remote code;
``attn_implementation="eager"`` for routes ending in ``eager``).

Routes ``peft`` and ``trl`` only import that package: where it is missing, its import error is the
route's reason (their training routes are not written yet).

Per variant folder the adapter writes the returned logits as every adapter does (``VARIANT.npy``), and
``WORK/out/ROUTE/VARIANT.npz`` (read with allow_pickle=False):
``loss``, the returned ``logits`` [tokens, vocab], ``logits_grad`` (the loss's gradient at them;
absent where the loss does not read them), ``precap`` and ``precap_grad`` (the output projection's
output, the final cap's input, and the gradient there), and ``grad/<parameter>`` for each parameter:
its gradient as the backward accumulated it, before the Trainer clips it.
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
    "peft": "a LoRA step through peft (this slice only asks whether peft imports here)",
    "trl": "a step through trl's SFTTrainer (this slice only asks whether trl imports here)",
}
PROBES = ("peft", "trl")
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


def watch(model, head):
    """Hooks that keep what the step computes: the parameters' gradients, the returned logits and the loss, the
    output projection's output (the final cap's input) and the gradients at both. Returns (kept, remove)."""
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
        logits = out["logits"] if isinstance(out, dict) else out.logits
        kept["logits"] = logits.detach()[0].double().cpu().numpy().copy()
        kept["logits_dtype"] = str(logits.dtype).replace("torch.", "")
        loss = out["loss"] if isinstance(out, dict) else out.loss
        if loss is not None:
            kept["loss"] = float(loss.detach().double())
        if logits.requires_grad:
            logits.register_hook(keep("logits_grad"))

    handles.append(head.register_forward_hook(on_head, prepend=True))  # the head's own output, before other hooks
    handles.append(model.register_forward_hook(on_model, with_kwargs=True))
    return kept, lambda: [h.remove() for h in handles]


def step(model, head, ids, trainer: bool, bf16: bool, scratch: Path) -> dict:
    """One training step of ``model`` on ``ids``; what ``watch`` kept."""
    import torch

    kept, remove = watch(model, head)
    try:
        if trainer:
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


def arrays(kept: dict) -> dict:
    out = {"loss": np.asarray(kept.get("loss", np.nan), dtype=np.float64), "logits": kept["logits"]}
    for name in ("logits_grad", "precap", "precap_grad"):
        if name in kept:
            out[name] = kept[name]
    out.update({f"grad/{k}": v for k, v in kept["grad"].items()})
    return out


def run_variant(run, variant: str) -> dict:
    import importlib

    import torch

    if run.route in PROBES:  # the import's own error is the row's reason
        module = importlib.import_module(run.route)
        raise RuntimeError(f"{run.route} {getattr(module, '__version__', '?')} imports, but its training route is "
                           "not written yet")

    torch.manual_seed(0)
    model, attention, dtype = load(types.SimpleNamespace(route=run.route, folder=run.folder), variant)
    trainer, bf16 = not run.route.startswith("loop-"), run.route.endswith("-bf16")
    kept = step(model, model.get_output_embeddings(), run.ids, trainer, bf16, run.scratch(variant))
    run.did = (f"{'Trainer (one step, defaults)' if trainer else 'loss.backward()'} on {type(model).__name__}, "
               f"attention {attention}, weights {dtype}{', bf16=True (autocast)' if bf16 else ''}; "
               f"logits {kept['logits_dtype']}, final cap input {kept.get('precap_dtype', '?')}")
    run.precision = "bf16" if bf16 else precision(dtype)
    return arrays(kept)


def main(argv=None) -> int:
    """``WORK ROUTE VARIANT...`` as adapter_protocol.main reads them; one .npz per variant and info.json."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 3:
        return protocol.reason("usage: WORK ROUTE VARIANT...", protocol.FAILED)
    work, route, variants = Path(argv[0]), argv[1], argv[2:]
    if route not in ROUTES:
        return protocol.reason(f"unknown route {route!r}; this adapter has {', '.join(ROUTES)}", protocol.FAILED)
    run = protocol.Run(work, route, variants, np.load(work / "ids.npy", allow_pickle=False).astype(np.int64))
    out = work / "out" / route
    out.mkdir(parents=True, exist_ok=True)
    failed = {}
    for variant in variants:
        try:
            step = run_variant(run, variant)
            np.savez(out / f"{variant}.npz", **step)
            np.save(out / f"{variant}.npy", step["logits"], allow_pickle=False)  # as the runner reads every adapter
        except protocol.NoArchitecture as err:
            return protocol.reason(f"the engine has no such architecture: {err}", protocol.NO_ARCHITECTURE)
        except Exception as err:  # noqa: BLE001 -- any failure of the step is the variant's reason
            traceback.print_exc(file=sys.stderr)
            failed[variant] = " ".join(f"{type(err).__name__}: {err}".split())[:400]
    if len(failed) == len(variants):
        return protocol.reason(failed[variants[0]], protocol.FAILED)
    info = {"route": route, "route_text": ROUTES[route], "did": run.did, "precision": run.precision,
            "versions": protocol.versions(PACKAGES), "failed": failed}
    (out / "info.json").write_text(json.dumps(info, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

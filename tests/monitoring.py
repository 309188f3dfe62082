"""The tests' tiny models with caps pushed past their horizons, and a brute force from captured tanh inputs."""

import ml_dtypes
import numpy as np
import torch

from softcapgrad.laws import horizon as horizon_law
from softcapgrad.models import audit

BF16 = np.dtype(ml_dtypes.bfloat16)
# the first bf16 input whose eager tanh is stored as ±1 (c = 1: the division is exact), found by autograd
KNEE = horizon_law.first_zero_gradient(1.0, BF16).first_true

MODELS = {  # model type -> --set fields; T5Gemma and VaultGemma carry caps 30 / 50 by default
    "gemma2": {"final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0},
    "gemma3_text": {"final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0},
    "t5gemma": {},
    "vaultgemma": {},
    "llama": {},
}


def tiny(model_type: str, implementation: str = "eager", dtype=torch.bfloat16, **sets):
    config = audit.model_type_config(model_type, {**MODELS[model_type], **sets})
    torch.manual_seed(0)
    return audit.build(audit.Source(config, None, False), config, implementation, dtype)


def confident(model, logits: float = 400.0, queries: float = 4000.0):
    """Push final logits and attention scores past their bf16 horizons: scale the head's output and q_proj."""
    model.get_output_embeddings().register_forward_hook(lambda m, args, out: out * logits)
    with torch.no_grad():
        for name, module in model.named_modules():
            if name.endswith("q_proj"):
                module.weight.mul_(queries)
    return model


def ids(vocab: int = 256, shape=(2, 12)):
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(1))


class Capture:
    """Every torch.tanh the model calls: its input, the module it ran in, and the gradient reaching its output."""

    def __init__(self, model, monkeypatch):
        self.calls = []  # [module, input, upstream gradient or None]
        self.current = [type(model).__name__]
        for name, module in model.named_modules():
            if name.rsplit(".", 1)[-1] in ("self_attn", "cross_attn"):
                module.register_forward_pre_hook(lambda m, a, name=name: self.current.append(name))
                module.register_forward_hook(lambda m, a, o: self.current.pop() and None)
        original = torch.tanh

        def tanh(x):
            y = original(x)
            call = [self.current[-1], x.detach().clone(), None]
            self.calls.append(call)
            if y.requires_grad:
                y.register_hook(lambda g: call.__setitem__(2, g.detach().clone()))
            return y

        monkeypatch.setattr(torch, "tanh", tanh)

    def brute_force(self) -> dict[str, tuple[int, int, int, float]]:
        """module -> (elements, |x| past the knee, past the knee with a non-zero upstream, largest |x|)."""
        out = {}
        for module, x, g in self.calls:
            past = x.abs().float() >= KNEE
            n, s, z, m = out.get(module, (0, 0, 0, 0.0))
            out[module] = (n + x.numel(), s + int(past.sum()), z + int((past & (g != 0)).sum()),
                           max(m, float(x.abs().max())))
        return out


def _step(model, batch):
    out = model(input_ids=batch, labels=batch)
    out.loss.backward()
    return out.logits.detach()


def _rows(monitor):
    return {r.module: (r.count, r.backward_count, r.saturated, r.zero_grad, r.max_abs_input) for r in monitor.rows()}


def _expected(capture, prefix=""):
    return {f"{prefix}{m}": (n, n, s, z, largest) for m, (n, s, z, largest) in capture.brute_force().items()}



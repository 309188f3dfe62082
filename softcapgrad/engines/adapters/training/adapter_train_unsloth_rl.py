"""unsloth-zoo's RL log-prob function as unsloth's GRPO trainer calls it: the final cap inside the log-softmax.

unsloth's GRPO trainer does not take the logits from the model: with ``UNSLOTH_RETURN_HIDDEN_STATES=1`` the model
returns its final hidden state h (the final norm applied), and unsloth-zoo's
``chunked_hidden_states_selective_log_softmax(h, lm_head, index, chunks, logit_scale_multiply, logit_scale_divide,
logit_softcapping, temperature)`` (unsloth_zoo/rl_replacements.py, ``RL_REPLACEMENTS["grpo_selective_log_softmax"]``)
computes each completion token's log-prob from h and the output projection's weight, the final cap one of its
arguments. unsloth 2026.4.4 passes ``logit_softcapping=config.final_logit_softcapping`` (0 when None),
``logit_scale_multiply=config.logit_scale``, ``logit_scale_divide=config.logits_scaling`` (0 when absent) and
``temperature=self.temperature`` (GRPOConfig's default 1.0): unsloth/models/rl_replacements.py lines 857-866, the
call at 919-932; unsloth-zoo's own ``grpo_accumulated_loss`` reaches the same function for the training loss.

unsloth-zoo cannot be imported without a GPU in some releases (2026.4.6's device_type.py raises "Unsloth cannot find
any torch accelerator? You need a GPU.") and never without unsloth installed, so the function is read from the
installed distribution's own file (located with ``find_spec``, nothing of the package run) and compiled alone, its
``torch.compile`` decorator left out: the release's own arithmetic, run eagerly. The step: transformers' model
loaded as adapter_transformers_load loads it (eager attention, fp32), h from its base for the first n − 1 positions,
the next tokens as the index, ``chunks`` = max(4, seq_len // 4096) (the trainer's formula when no mini-batch
autotuning runs, line 780; chunking changes no arithmetic), the loss the mean of the negated log-probs (the
reference's cross-entropy), one backward. Written as adapter_train_fused writes a step: ``token_log_probs``, no
logits.
"""

import ast
import importlib.util
import sys
from importlib import metadata
from pathlib import Path

import numpy as np

from adapter_train_transformers import main
from adapter_transformers_load import load

FUNCTION = "chunked_hidden_states_selective_log_softmax"
ROUTES = {"grpo": "unsloth_zoo.rl_replacements.chunked_hidden_states_selective_log_softmax(h, lm_head, next ids, "
                  "logit_softcapping="
                  "final_logit_softcapping, temperature=1.0) as unsloth's GRPO trainer calls it (the installed "
                  "file's function, its torch.compile decorator left out), fp32, eager attention"}
PACKAGES = ("unsloth-zoo", "unsloth", "transformers", "torch")


class _Loaded:
    def __init__(self, run):
        self.route, self.folder = "eager", run.folder


def installed_function(name: str = FUNCTION):
    """The function ``name`` of the installed unsloth_zoo/rl_replacements.py, compiled alone without its
    decorators; (function, file, the line and source of its soft-cap statement)."""
    import torch

    spec = importlib.util.find_spec("unsloth_zoo")  # locates the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("unsloth_zoo is not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / "rl_replacements.py"
    text = path.read_text(encoding="utf-8")
    found = [n for n in ast.parse(text, str(path)).body if isinstance(n, ast.FunctionDef) and n.name == name]
    if not found:
        raise RuntimeError(f"{path.name} of this unsloth-zoo defines no {name}")
    fn = found[0]
    # the module's own imports of the standard library and torch, which the function may name (os, from 2026.10):
    # run beside it; any other (unsloth_zoo's own, which ask for an accelerator at import) is left out
    imports = [n for n in ast.parse(text, str(path)).body if isinstance(n, (ast.Import, ast.ImportFrom))
               and all(m.split(".")[0] in sys.stdlib_module_names | {"torch"}
                       for m in ([a.name for a in n.names] if isinstance(n, ast.Import) else [n.module or "."]))
               and not (isinstance(n, ast.ImportFrom) and n.level)]
    cap = next((n for n in ast.walk(fn) if isinstance(n, ast.Assign) and "tanh" in ast.unparse(n.value)), None)
    where = "" if cap is None else f"line {cap.lineno}: {ast.get_source_segment(text, cap)}"
    fn.decorator_list = []
    space = {"torch": torch}
    module = ast.Module(body=[*imports, fn], type_ignores=[])
    exec(compile(module, str(path), "exec"), space)  # noqa: S102 -- the installed release's own code
    return space[name], path, where


def _version() -> str:
    try:
        return metadata.version("unsloth-zoo")
    except metadata.PackageNotFoundError:
        return "(no distribution record)"


def run_variant(run, variant: str) -> dict:
    import torch

    torch.manual_seed(0)
    model, attention, dtype = load(_Loaded(run), variant)
    model.train()
    fn, path, where = installed_function()
    config = model.config
    x = torch.as_tensor(run.ids, dtype=torch.long).view(1, -1)
    h = getattr(model, model.base_model_prefix)(input_ids=x, use_cache=False).last_hidden_state[:, :-1]
    w = model.get_output_embeddings().weight
    c = getattr(config, "final_logit_softcapping", 0) or 0
    log_probs = fn(h, w, x[:, 1:], chunks=max(4, x.shape[1] // 4096),
                   logit_scale_multiply=getattr(config, "logit_scale", 0) or 0,
                   logit_scale_divide=getattr(config, "logits_scaling", 0) or 0,
                   logit_softcapping=c, temperature=1.0)
    loss = -log_probs.mean()
    loss.backward()
    run.did = (f"{type(model).__name__}, attention {attention}, weights {dtype}; unsloth-zoo "
               f"{_version()} {path.parent.name}/{path.name} {FUNCTION}(logit_softcapping={c}), "
               f"its cap at {where or 'no tanh statement found'}; loss −mean(log-probs), one backward, fp32")
    run.precision = "fp32"
    out = {"loss": np.asarray(float(loss.detach()), dtype=np.float64),
           "token_log_probs": log_probs.detach()[0].double().cpu().numpy().copy()}
    out.update({f"grad/{n}": p.grad.detach().double().cpu().numpy().copy() for n, p in model.named_parameters()
                if p.grad is not None})
    return out


if __name__ == "__main__":
    sys.exit(main(routes=ROUTES, run_variant=run_variant, packages=PACKAGES))

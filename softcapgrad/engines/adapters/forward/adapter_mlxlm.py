"""MLX with mlx-lm on the CPU: ``mlx_lm.load(folder)`` (its own reading of config.json and the safetensors), then one
forward of the whole prompt, the logits at every position. The architecture registry is mlx-lm's own: a module
``mlx_lm.models.<model_type>`` after its ``MODEL_REMAPPING``."""

from __future__ import annotations

import importlib.util
import sys

import numpy as np

import adapter_protocol as protocol

ROUTES = {"default": "mlx_lm.load of the folder, one forward of the prompt without a KV cache, the weights' own dtype"}
PRECISION = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def module_for(kind: str) -> str:
    from mlx_lm import utils

    name = utils.MODEL_REMAPPING.get(kind, kind)
    if importlib.util.find_spec(f"mlx_lm.models.{name}") is None:
        raise protocol.NoArchitecture(f"mlx-lm has no module mlx_lm.models.{name} for model_type {kind} "
                                      "(registry read: mlx_lm.models and mlx_lm.utils.MODEL_REMAPPING)")
    return name


def run_variant(run: protocol.Run, variant: str) -> np.ndarray:
    import mlx.core as mx
    import mlx_lm
    from mlx.utils import tree_flatten

    mx.set_default_device(mx.cpu)
    name = module_for(run.config(variant).get("model_type", "?"))
    model, _ = mlx_lm.load(str(run.folder(variant)))
    dtypes = sorted({str(p.dtype).rsplit(".", 1)[-1] for _, p in tree_flatten(model.parameters())})
    out = model(mx.array(run.ids.astype(np.int32).reshape(1, -1)))
    run.precision = "/".join(PRECISION.get(d, d) for d in dtypes)
    run.did = (f"mlx_lm.load, mlx_lm.models.{name}.Model forward on mx.cpu, weights {'/'.join(dtypes)}, "
               f"logits {str(out.dtype).rsplit('.', 1)[-1]}, no KV cache")
    run.packages = ("mlx", "mlx-cpu", "mlx-lm")
    return np.array(out.astype(mx.float32))[0]


if __name__ == "__main__":
    sys.exit(protocol.main(ROUTES, run_variant))

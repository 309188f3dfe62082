"""ONNX Runtime on the model exported by ``torch.onnx.export`` (the dynamo exporter) from the model as
``from_pretrained`` loads it (route ``default``: transformers picks the attention) or loaded with
``attn_implementation="eager"`` (route ``eager``); run on the CPU execution provider, one thread."""

import contextlib
import io

import adapter_protocol as protocol
from adapter_transformers_load import load, logits_only, precision

ROUTES = {
    "default": "torch.onnx.export (dynamo) of the model from_pretrained loads -> ONNX Runtime, CPU",
    "eager": 'the same, loaded with attn_implementation="eager"',
}
# routes that may run one after another in one process (catalog.processes): nothing one sets outlives it
PROCESSES = (("default", "eager"),)
MODELS_PER_PROCESS = 7  # models one child runs in turn (catalog.models_per_process)
PACKAGES = ("onnxruntime", "onnx", "onnxscript", "torch", "transformers")


def run_variant(run, variant):
    import onnxruntime as ort
    import torch

    model, attention, dtype = load(run, variant)

    x = torch.as_tensor(run.ids, dtype=torch.long).reshape(1, -1)
    with contextlib.redirect_stdout(io.StringIO()):  # the exporter reports its steps on stdout
        program = torch.onnx.export(logits_only(model), (x,), dynamo=True, verbose=False)
    path = run.scratch(variant) / "model.onnx"
    program.save(str(path))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    run.did = (f"torch.onnx.export (dynamo) of {type(model).__name__} (attention {attention}, weights {dtype}) "
               f"-> ONNX Runtime {ort.__version__}, CPUExecutionProvider")
    run.precision = precision(dtype)
    run.packages = PACKAGES
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})[0][0]


if __name__ == "__main__":
    raise SystemExit(protocol.main(ROUTES, run_variant))

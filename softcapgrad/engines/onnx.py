"""ONNX Runtime: the model exported by ``torch.onnx.export`` (the dynamo exporter), run on the CPU in fp32."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def logits(folder: Path, ids: np.ndarray, work: Path, name: str = "onnx") -> np.ndarray:
    import contextlib
    import io

    import onnxruntime as ort
    import torch

    from softcapgrad.engines.reference import LogitsOnly, load

    work.mkdir(parents=True, exist_ok=True)
    model = LogitsOnly(load(folder))
    x = torch.as_tensor(ids, dtype=torch.long).reshape(1, -1)
    with contextlib.redirect_stdout(io.StringIO()):  # the exporter reports its steps on stdout
        program = torch.onnx.export(model, (x,), dynamo=True, verbose=False)
    path = work / "model.onnx"
    program.save(str(path))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})[0][0]

"""The in-PyTorch serving path: ``torch.export.export`` of the model, then the exported program's module as
it is (engine ``torchexport``) or compiled by ``torch.compile`` with inductor's C++ kernels (``inductor``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def logits(folder: Path, ids: np.ndarray, work: Path, name: str = "torchexport") -> np.ndarray:
    import torch

    from softcapgrad.engines.reference import LogitsOnly, load

    torch.set_num_threads(1)
    model = LogitsOnly(load(folder))
    x = torch.as_tensor(ids, dtype=torch.long).reshape(1, -1)
    program = torch.export.export(model, (x,))
    module = program.module()
    if name == "inductor":
        work.mkdir(parents=True, exist_ok=True)
        import os

        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(work / "inductor"))
        module = torch.compile(module, backend="inductor", dynamic=False)
    with torch.no_grad():
        return module(x)[0].double().numpy()

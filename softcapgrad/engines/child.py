"""The child process that runs one engine: ``python -m softcapgrad.engines.child NAME MODULE WORK VARIANT...``.

It reads ``WORK/ids.npy`` and the transformers directory ``WORK/VARIANT`` for each variant, and
writes ``WORK/ENGINE.VARIANT.npy`` (the logits, [tokens, vocab]). A failure ends it with exit code 1
and one line ``reason: ...`` on stderr; standard input is never read.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np


def main(argv: list[str]) -> int:
    name, module_name, work, variants = argv[0], argv[1], Path(argv[2]), argv[3:]
    ids = np.load(work / "ids.npy", allow_pickle=False)
    try:
        module = importlib.import_module(f"softcapgrad.engines.{module_name}")
        for variant in variants:
            logits = np.asarray(module.logits(work / variant, ids, work / f"{name}.{variant}.work", name))
            np.save(work / f"{name}.{variant}.npy", logits, allow_pickle=False)
    except Exception as err:  # noqa: BLE001 -- any failure of an engine is its row's reason
        text = " ".join(str(err).split()) or type(err).__name__
        print(f"reason: {type(err).__name__}: {text[:260]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""softcapgrad: numerical investigations of tanh soft-capping, softplus gates and TetherGate.

``softcapgrad.softcap`` and ``softcapgrad.SoftCap`` (the dead-zone-free soft-cap), ``DeadZoneMonitor``
(every tanh and sigmoid of a step, and where its gradient is exactly 0), ``GateMonitor`` (how open each
gate is, step after step) and ``DeadZoneCallback`` (the
same in a transformers Trainer, one step in N, logged with the loss), and ``fp32_tanh_backward`` /
``patch`` (their derivative from the input in fp32, in someone else's model) are loaded on first use,
so that importing the package does not import torch.

The package is layered, each layer importing only those below it (tests/test_layers.py keeps it so):
``core`` (report shape, input checks, files, progress, chunking) < ``laws`` (the documents' format
arithmetic; numpy, ml_dtypes, mpmath) < ``training`` (what goes into a training loop; torch) <
``stacks`` (the real backends, measured or recorded) and ``demos`` (the gate and TetherGate documents'
demonstrations) < ``models`` (real models and files) < ``ledger`` (the claims and figures) < ``cli``.
"""

__version__ = "0.1.0"

__all__ = ["DeadZoneCallback", "DeadZoneMonitor", "GateMonitor", "SoftCap", "TetherCallback", "fp32_tanh_backward", "patch",
           "softcap", "__version__"]

_LAZY = {"DeadZoneCallback": "integrations.trainer", "TetherCallback": "integrations.trainer",
         "softcap": "training.remedy", "SoftCap": "training.remedy", "DeadZoneMonitor": "stacks.watch", "GateMonitor": "stacks.watch",
         "fp32_tanh_backward": "training.fp32grad", "patch": "training.fp32grad"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"softcapgrad.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'softcapgrad' has no attribute {name!r}")

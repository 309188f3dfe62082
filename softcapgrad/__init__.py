"""softcapgrad: numerical investigations of tanh soft-capping, softplus gates and TetherGate.

``softcapgrad.softcap`` and ``softcapgrad.SoftCap`` (the dead-zone-free soft-cap), ``DeadZoneMonitor``
(every tanh and sigmoid of a step, and where its gradient is exactly 0), and ``fp32_tanh_backward`` /
``patch`` (their derivative from the input in fp32, in someone else's model) are loaded on first use,
so that importing the package does not import torch.
"""

__version__ = "0.1.0"

__all__ = ["DeadZoneMonitor", "SoftCap", "fp32_tanh_backward", "patch", "softcap", "__version__"]

_LAZY = {"softcap": "remedy", "SoftCap": "remedy", "DeadZoneMonitor": "monitor",
         "fp32_tanh_backward": "fp32grad", "patch": "fp32grad"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"softcapgrad.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'softcapgrad' has no attribute {name!r}")

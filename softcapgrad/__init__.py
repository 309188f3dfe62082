"""softcapgrad: numerical investigations of tanh soft-capping, softplus gates and TetherGate.

``softcapgrad.softcap`` and ``softcapgrad.SoftCap`` (the dead-zone-free soft-cap) are loaded on first
use, so that importing the package does not import torch.
"""

__version__ = "0.1.0"

__all__ = ["SoftCap", "softcap", "__version__"]


def __getattr__(name: str):
    if name in ("softcap", "SoftCap"):
        from softcapgrad import remedy

        return getattr(remedy, name)
    raise AttributeError(f"module 'softcapgrad' has no attribute {name!r}")

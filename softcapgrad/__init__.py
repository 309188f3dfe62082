"""softcapgrad: numerical investigations of tanh soft-capping, softplus gates and TetherGate."""

__version__ = "0.1.0"

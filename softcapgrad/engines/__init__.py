"""Do a model's soft-caps survive leaving transformers: the same weights through export and serving engines.

``reference`` runs the transformers model (fp32, eager attention) with its caps, and with each cap
switched off, on inputs scaled so that every cap binds. Each engine (``catalog``) is an adapter
script (``adapters/``) run by the interpreter of an environment of its own (``environments``:
one cached virtual environment per pinned requirements file) in an isolated child process
(``runner``); ``verdict`` compares log-probabilities and names, per cap, what the engine did with it.
"""

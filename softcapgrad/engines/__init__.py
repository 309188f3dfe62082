"""Do a model's soft-caps survive leaving transformers: the same weights through export and serving engines.

``forward.reference`` runs the transformers model (fp32, eager attention) with its caps, and with each cap
switched off, on inputs scaled so that every cap binds. Each engine (``forward.catalog``) is an adapter
script (``adapters/``) run by the interpreter of an environment of its own (``environments``:
one cached virtual environment per pinned requirements file) in an isolated child process
(``forward.runner``); ``forward.verdict`` compares log-probabilities and names, per cap, what the engine did with
it. Built on that check, beside one another: ``served`` (a deployment), ``training`` (one training step),
``repro`` (reproduction bundles) and ``releases`` (transformers release by release).
"""

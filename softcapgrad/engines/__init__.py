"""Do a model's soft-caps survive leaving transformers: the same weights through export and serving engines.

``reference`` runs the transformers model (fp32, eager attention) with its caps, and with each cap
switched off, on inputs scaled so that every cap binds; one module per engine runs the same weights
there (``onnx``, ``llamacpp`` with ``gguf``, ``kerashub``, ``torchexport``), each in a child process
(``child``, ``runner``); ``verdict`` compares full-vocabulary log-probabilities and names, per cap,
what the engine did with it.
"""

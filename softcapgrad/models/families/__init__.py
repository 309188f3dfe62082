"""What some model types need beyond shrinking: fields set after it, and inputs of a kind the generic rules miss.

Each module holds one family of model types and exports two tables:

- ``OVERRIDES``: model type -> {dotted field: value}, set on the shrunk configuration before the class
  validates it, each with the reason the shrunk defaults are inconsistent. An override never turns a
  cap or a gate on or off: the census row lists every override beside the figures it gives.
- ``INPUTS``: model type -> ``feed(cls, config, ids, g) -> dict`` of forward keyword arguments (tensors on
  the CPU, drawn from the generator ``g``; ``ids`` are the audit's token ids, whose batch is the batch).
  A ``labels`` entry makes the loss the model's own.

A model type sits in one family only; ``test_families`` checks it.
"""

from __future__ import annotations

from softcapgrad.models.families import audio, detection, multimodal, segmenters, text, vision

FAMILIES = (text, multimodal, detection, vision, segmenters, audio)


def _merged(table: str) -> dict:
    merged: dict = {}
    for family in FAMILIES:
        merged.update(getattr(family, table))
    return merged


OVERRIDES = _merged("OVERRIDES")
INPUTS = _merged("INPUTS")

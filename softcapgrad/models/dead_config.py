"""A set cap field the eager trace saw move no tanh is *dead config*, unless the audited class lacks the part
where that cap would run: no output head (a final cap), or no attention layer at all (an attention cap).
Such a field is said so (``no head here``, ``no attention here``) rather than called dead."""

from __future__ import annotations

import dataclasses
import re

from softcapgrad.models import runnable

ATTENTION_FIELD = re.compile(r"attn|attention", re.IGNORECASE)


def attention_layers(config) -> int:
    """How many attention modules the audited class builds from ``config`` (on the meta device: no memory);
    a depth of 0 builds none. Counted by class name, as every transformers attention module is named."""
    import copy

    import torch

    try:
        with torch.device("meta"):
            model = runnable.model_class(config)._from_config(copy.deepcopy(config))
    except Exception:  # noqa: BLE001 -- not buildable so: the audit's own build reports it; assume attention
        return 1
    return sum("attention" in type(m).__name__.lower() for m in model.modules())


def qualified(caps: list, cls, config) -> list:
    """The caps found (caps.Cap), each dead config field restated where ``cls`` has no part to run it."""
    if runnable.headless(cls):  # a field its head would read is not dead: this module has no head
        caps = [dataclasses.replace(c, status="no head here", evidence=c.evidence + f"; {cls.__name__} has no "
                                    "output head, which is where a final cap would run")
                if c.status == "dead config" else c for c in caps]
    if not attention_layers(config):  # an attention cap is not dead where there is no attention at all
        caps = [dataclasses.replace(c, status="no attention here", evidence=c.evidence + f"; {cls.__name__} "
                                    "has no attention layer, which is where an attention cap would run")
                if c.status == "dead config" and ATTENTION_FIELD.search(c.field or "") else c for c in caps]
    return caps

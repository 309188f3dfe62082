"""The kinds of a census row: why a model type was not audited (by a phrase of its reason), what a gate site is."""

from __future__ import annotations

SHAPE = (2, 8)  # batch and tokens of the census's own forward and backward


REFUSALS = (  # a phrase of the reason -> the kind of refusal
    ("no model class", "a configuration without a model class"),
    ("the audit feeds token ids", "inputs that are not tokens, images, audio or video"),
    ("which is not installed here", "a package not installed here"),
    ("_forward_unimplemented", "a class without a forward of its own (a tokenizer, a generate-only wrapper)"),
    ("inference_session", "inputs the audit does not build"),
    ("under torch.inference_mode()", "an inference-only forward (no backward can run)"),
    ("the model has no eager path", "no eager attention (the audit's tracing runs eager)"),
    ("no floating-point output to compare", "an output of integer codes only (nothing to differentiate)"),
    ("Training of", "no training mode"),
    ("must be provided to run in training mode", "no training mode"),
    ("no tiny configuration found", "no tiny configuration under the parameter limit"),
    ("missing", "inputs the audit does not build"),
    ("does not validate or run", "a tiny configuration its class or forward refuses"),
)


def refusal_kind(r) -> str:
    """The kind of a row not audited: the first phrase of ``REFUSALS`` its reason holds."""
    if r.status in ("timed out", "internal error"):
        return r.status
    return next((kind for phrase, kind in REFUSALS if phrase in r.reason), "refused at run")


def _kind(g: dict) -> str:
    """A gate site's kind: a gate, an activation, an attention-sink rescale."""
    return g.get("kind", "gate")

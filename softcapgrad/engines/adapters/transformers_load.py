"""Loading a transformers folder the way its users do, shared by the adapters that start from transformers.

Every route passes the folder, ``local_files_only`` and no remote code; a route whose id ends in
``eager`` also passes ``attn_implementation="eager"``. Nothing else: transformers picks the
attention implementation and the dtype by itself, and the implementation it records is reported.
"""


UNKNOWN = ("does not recognize this architecture", "Unrecognized configuration class")  # its registry's own words


def load(run, variant):
    """The model as the route loads it, and the attention implementation it records."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    torch.set_num_threads(1)
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    options = {"attn_implementation": "eager"} if run.route.endswith("eager") else {}
    try:
        model = AutoModelForCausalLM.from_pretrained(str(run.folder(variant)), local_files_only=True,
                                                     trust_remote_code=False, **options).eval()
    except (ValueError, KeyError) as err:  # a model type this version's registry does not list
        if not any(words in str(err) for words in UNKNOWN):
            raise
        import protocol
        import transformers

        raise protocol.NoArchitecture(f"transformers {transformers.__version__}: {str(err).split('. ')[0]}") from None
    attention = getattr(model.config, "_attn_implementation", None) or "not recorded"
    dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    return model, attention, dtype


def precision(dtype):
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(dtype, dtype)


def logits_only(model):
    """The model as ids -> logits: the one input and output an exporter traces."""
    import torch

    class LogitsOnly(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids):
            return self.inner(input_ids=input_ids, use_cache=False).logits

    return LogitsOnly(model)

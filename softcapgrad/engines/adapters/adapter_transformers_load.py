"""Loading a transformers folder the way its users do, shared by the adapters that start from transformers.

Every route passes the folder, ``local_files_only`` and no remote code; a route whose id ends in
``eager`` also passes ``attn_implementation="eager"``. Nothing else: transformers picks the
attention implementation and the dtype by itself, and the implementation it records is reported.
A folder whose tensors the version's model class does not all find (it would initialise the rest at
random) is refused with the count and a name: its logits would say nothing of the caps.
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
        model, loading = AutoModelForCausalLM.from_pretrained(str(run.folder(variant)), local_files_only=True,
                                                              trust_remote_code=False, output_loading_info=True,
                                                              **options)
    except (ValueError, KeyError) as err:  # a model type this version's registry does not list
        if not any(words in str(err) for words in UNKNOWN):
            raise
        import adapter_protocol as protocol
        import transformers

        raise protocol.NoArchitecture(f"transformers {transformers.__version__}: {str(err).split('. ')[0]}") from None
    missing = sorted(loading.get("missing_keys") or ())
    if missing:  # the engine would run tensors it made up: its logits say nothing of the caps
        import transformers

        raise RuntimeError(f"transformers {transformers.__version__} finds no weights in the folder for "
                           f"{len(missing)} tensors its {type(model).__name__} has (such as {missing[0]}) and "
                           "would initialise them at random")
    model.eval()
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

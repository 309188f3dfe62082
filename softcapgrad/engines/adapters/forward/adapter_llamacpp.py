"""llama.cpp as its users run it: its own converter to GGUF, then llama-cpp-python on the file.

The converter is llama.cpp's ``convert_hf_to_gguf.py`` with its ``conversion`` package and the
``gguf-py`` it puts first on its path, as shipped in the installed llama-cpp-python's source
distribution (``adapter_llamacpp_sources.py`` extracts them into the environment after the install). It
runs here, in this process, exactly as its command line does (``convert_hf_to_gguf.py FOLDER
--outfile FILE --outtype TYPE``), so that torch and transformers are imported once for every
variant. Before it runs, the converter's own registry (``conversion.TEXT_MODEL_MAP``, keyed by the
config's ``architectures``) is read: an architecture it lacks is exit 3.

The GGUF then runs in ``llama_cpp.Llama`` with logits at every position (``logits_all``), the
token ids given as ids, llama-cpp-python's defaults otherwise (flash attention off, an f16 KV
cache) unless the route names the option. Each route's notes record what the converter wrote for
the caps and the window (read back from the file with the converter's own gguf-py).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import sys
import traceback
from pathlib import Path

import numpy as np
from adapter_protocol import NoArchitecture, main

CONVERTER = Path(sys.prefix) / "share" / "llama.cpp-converter"
ROUTES = {
    "default": "the converter's default --outtype auto, llama-cpp-python's defaults (flash attention off, f16 KV)",
    "f32": "--outtype f32; flash attention off, f16 KV cache (llama-cpp-python's defaults)",
    "f32-fa": "--outtype f32; flash_attn=True, f16 KV cache",
    "f32-kv32": "--outtype f32; flash attention off, f32 KV cache (type_k = type_v = GGML_TYPE_F32)",
    "q8_0": "--outtype q8_0; flash attention off, f16 KV cache",
    "q8_0-fa": "--outtype q8_0; flash_attn=True, f16 KV cache",
}
# routes that may run one after another in one process (catalog.processes): nothing one sets outlives it
PROCESSES = (("default", "f32", "f32-fa", "f32-kv32", "q8_0", "q8_0-fa"),)
MODELS_PER_PROCESS = 7  # models one child runs in turn (catalog.models_per_process)
OUTTYPE = {"default": "auto", "f32": "f32", "f32-fa": "f32", "f32-kv32": "f32", "q8_0": "q8_0", "q8_0-fa": "q8_0"}
FLASH = {"f32-fa", "q8_0-fa"}
GGML_TYPE_F32 = 0
OFF = 2.0 ** 100  # a/2^100 and t·2^100 are exact in f32, and tanh returns a tiny argument unchanged
CAP_FIELDS = ("attn_logit_softcapping", "final_logit_softcapping")
KEYS = ("attn_logit_softcapping", "final_logit_softcapping", "attention.sliding_window")


class ConverterFailed(Exception):
    pass


def _converter() -> Path:
    script = CONVERTER / "convert_hf_to_gguf.py"
    if not script.is_file():
        raise FileNotFoundError(f"llama.cpp's converter is not in this environment ({script.name} missing): "
                                "run adapter_llamacpp_sources.py with the environment's interpreter")
    if str(CONVERTER) not in sys.path:
        sys.path.insert(0, str(CONVERTER))  # what `python convert_hf_to_gguf.py` puts first: the script's folder
    return script


def _registered(config: dict) -> str:
    from conversion import TEXT_MODEL_MAP  # the converter's registry: architecture name -> its module

    names = config.get("architectures") or []
    for name in names:
        if name in TEXT_MODEL_MAP:
            return name
    raise NoArchitecture(f"llama.cpp's converter registry (conversion.TEXT_MODEL_MAP) has no class for "
                         f"{', '.join(names) or 'a config without architectures'} "
                         f"(model_type {config.get('model_type')})")


def _failure(err: BaseException) -> str:
    """The converter's own last words: its message, or for a bare assertion the source line that failed."""
    frames = traceback.extract_tb(err.__traceback__)
    where = next((f for f in reversed(frames) if str(CONVERTER) in f.filename), frames[-1] if frames else None)
    text = " ".join(str(err).split())
    if where is not None and (not text or isinstance(err, AssertionError)):
        place = os.path.relpath(where.filename, CONVERTER)
        return f"{type(err).__name__} at {place}:{where.lineno}: {where.line} {text}".strip()
    return f"{type(err).__name__}: {text}"


def convert(script: Path, folder: Path, outfile: Path, outtype: str) -> str:
    """Run the converter's command line in this process; its log (stderr) is returned for the notes."""
    argv, log = sys.argv, io.StringIO()
    sys.argv = [str(script), str(folder), "--outfile", str(outfile), "--outtype", outtype]
    try:
        with contextlib.redirect_stderr(log):
            runpy.run_path(str(script), run_name="__main__")
    except SystemExit as err:
        if err.code not in (None, 0):
            lines = [line for line in log.getvalue().splitlines() if line.strip()]
            raise ConverterFailed(f"the converter exited {err.code}: {lines[-1] if lines else ''}") from None
    except Exception as err:  # noqa: BLE001 -- the converter's failure is the row's reason
        sys.stderr.write(log.getvalue())
        raise ConverterFailed(f"the converter failed: {_failure(err)}") from None
    finally:
        sys.argv = argv
    if not outfile.is_file():
        raise ConverterFailed("the converter wrote no file")
    return log.getvalue()


def off_as_number(run, variant: str) -> Path:
    """A copy of the variant's folder with each null cap written as OFF: for a variant with a cap switched off, where
    the converter refuses a null cap (Gemma 2's class writes the field as a float unconditionally)."""
    import shutil

    copy = run.scratch(variant) / "off-as-number"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(run.folder(variant), copy)
    config = run.config(variant)
    for key in CAP_FIELDS:
        if key in config and config[key] is None:
            config[key] = OFF
    (copy / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return copy


def written(path: Path) -> tuple[str, dict, str]:
    """What the converter put in the file: its architecture, the cap and window keys, and its tensor types."""
    import gguf  # the converter's own gguf-py, first on the path

    reader = gguf.GGUFReader(str(path))
    arch = str(reader.fields["general.architecture"].contents())
    keys = {}
    for key in KEYS:
        field = reader.fields.get(f"{arch}.{key}")
        keys[key] = None if field is None else field.contents()
    types = sorted({t.tensor_type.name for t in reader.tensors})
    return arch, keys, "+".join(types)


def load(llama_cpp, path: Path, n: int, options: dict):
    """``llama_cpp.Llama`` on the file; where it refuses the file, its loader's own last error line is the reason
    (llama-cpp-python hides the loader's log unless verbose, so the refused load is repeated with its log kept)."""
    arguments = dict(model_path=str(path), n_ctx=n, n_batch=n, n_ubatch=n, logits_all=True, **options)
    try:
        return llama_cpp.Llama(verbose=False, **arguments)
    except ValueError as err:
        log = io.StringIO()
        with contextlib.redirect_stderr(log), contextlib.suppress(ValueError):
            llama_cpp.Llama(verbose=True, **arguments).close()
        errors = [line.strip() for line in log.getvalue().splitlines() if "error" in line.lower()]
        raise RuntimeError(f"llama.cpp refused the converted file: {errors[-1] if errors else err}") from None


def logits(path: Path, ids: np.ndarray, route: str) -> tuple[np.ndarray, str]:
    import llama_cpp

    options = {"flash_attn": route in FLASH}
    if route == "f32-kv32":
        options.update(type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32)
    n = int(ids.size)
    llm = load(llama_cpp, path, n, options)
    try:
        llm.eval([int(i) for i in ids])
        out = np.array(llm.scores[:n], dtype=np.float32)
        flash = llm.context_params.flash_attn_type
        kv = "f32" if route == "f32-kv32" else "f16 (default)"
        said = {llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED: "on", llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED: "off"}
        return out, f"flash attention {said.get(flash, flash)}, KV cache {kv}"
    finally:
        llm.close()


def run_variant(run, variant: str) -> np.ndarray:
    run.packages = ("llama-cpp-python", "torch", "transformers", "sentencepiece", "numpy", "protobuf")
    script = _converter()
    config = run.config(variant)
    arch = _registered(config)
    outtype = OUTTYPE[run.route]
    outfile = run.scratch(variant) / f"model-{outtype}.gguf"
    try:
        convert(script, run.folder(variant), outfile, outtype)
    except ConverterFailed as err:
        nulls = [key for key in CAP_FIELDS if key in config and config[key] is None]
        if variant == "capped" or not nulls:
            raise
        run.notes.append(f"{variant}: {err} (its config has {', '.join(nulls)} = null); converted again with "
                         f"each null cap written as 2^100, which leaves every logit unchanged in f32")
        convert(script, off_as_number(run, variant), outfile, outtype)
    written_arch, keys, types = written(outfile)
    values, how = logits(outfile, run.ids, run.route)
    source = json.loads((CONVERTER / "SOURCE.json").read_text(encoding="utf-8"))
    run.did = (f"llama.cpp's convert_hf_to_gguf.py ({source['archive']}) --outtype {outtype} on {arch} -> GGUF "
               f"{written_arch} ({types}); llama_cpp.Llama logits_all, {how}")
    run.precision = coarsest(types, run.route)
    run.notes.append(f"{variant}: the converter wrote " + ", ".join(f"{written_arch}.{k} = {v}" for k, v in keys.items()))
    return values


COARSER = ("q8_0", "fp16", "fp32")  # by unit roundoff, coarsest first (q8_0 keeps 8 bits per weight)


def coarsest(types: str, route: str) -> str:
    """The coarsest format on the data path: the file's tensor types (e.g. "F32+Q8_0") and the KV cache (f16
    unless the route asks for f32), the precision the row is judged in."""
    found = {"f16": "fp16", "f32": "fp32", "q8_0": "q8_0"}
    formats = {found.get(t.lower(), t.lower()) for t in types.split("+")}
    if route != "f32-kv32":
        formats.add("fp16")
    return next((f for f in COARSER if f in formats), sorted(formats)[0])


if __name__ == "__main__":
    sys.exit(main(ROUTES, run_variant))

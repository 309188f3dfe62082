"""The soft-cap as the real backends run it: torch eager and torch.compile (CPU or CUDA), JAX op by op
and under jax.jit, FlexAttention and the PTX ``tanh.approx.f32`` instruction (CUDA only); MLX in
stacks/mlx_cap.py.

Each evaluation takes values of a scores format and returns float64 arrays: the gradient d/da of
the cap for an upstream gradient of ones, or whether the backend's tanh (sigmoid) returns exactly
1.0. Nothing here emulates a backend: the cap is the formula as user code writes it,
``c * torch.tanh(a / c)``, handed to the library.

Values run in batches of a fixed size, padded with zeros. Inductor emits scalar C++ (the C
library's tanh) for a tensor of one element and vector code (SLEEF) for any larger one; a fixed
large shape keeps every value on the kernel a model's tensors get, and compiles one graph per
format and cap.
"""

from __future__ import annotations

import contextlib
import functools
import types
import warnings
from typing import Callable, Iterator

import numpy as np

from softcapgrad.laws import formats

BATCH = 1 << 15  # values per evaluation: every positive bf16 or fp16 value fits in one


def batched(values: np.ndarray, run: Callable[[np.ndarray], np.ndarray], width: int = 1) -> np.ndarray:
    """``run`` over fixed-size float64 chunks of ``values`` (the last padded with zeros), unpadded, as float64.

    ``run`` returns BATCH results, or (BATCH, ``width``) when it gives several per value.
    """
    flat = np.asarray(values).astype(np.float64).reshape(-1)
    out = np.empty((flat.size, width), dtype=np.float64)
    for start in range(0, flat.size, BATCH):
        part = flat[start:start + BATCH]
        chunk = np.zeros(BATCH, dtype=np.float64)
        chunk[:part.size] = part
        out[start:start + part.size] = np.asarray(run(chunk), dtype=np.float64).reshape(BATCH, width)[:part.size]
    return out[:, 0] if width == 1 else out


# --- torch -----------------------------------------------------------------------------------


NO_COMPILER = "not measured here: no C++ compiler"


def cxx_compiler_missing() -> str:
    """'' when inductor finds a working C++ compiler for CPU code; else one line saying what is missing.

    inductor runs ``CXX --version`` for each name in ``torch._inductor.config.cpp.cxx`` (``CXX`` or g++;
    clang++ on macOS) and raises InvalidCxxCompiler when none answers: every compiled CPU stack needs one."""
    try:
        from torch._inductor import config, exc
        from torch._inductor.cpp_builder import get_cpp_compiler
    except ImportError:  # another torch layout: its own error will say what is wrong
        return ""
    try:
        get_cpp_compiler()
    except exc.InvalidCxxCompiler:
        tried = ", ".join(str(name) for name in config.cpp.cxx if name)
        return f"{NO_COMPILER} (inductor tried {tried}; install one or point CXX at it)"
    return ""


def inductor_isa(simd: int | None = None) -> tuple[str, int] | None:
    """The vector ISA inductor's C++ uses in this process, as (name, bits); None where it emits scalar code.

    ``simd`` None: what inductor picks when left to itself, the CPU's widest ISA or the one
    ``ATEN_CPU_CAPABILITY`` names (``default``: scalar code). ``simd`` given: the ISA of that width,
    which inductor uses whatever the environment says (None if this CPU has none of that width)."""
    import os

    from torch._inductor import cpu_vec_isa

    isas = cpu_vec_isa.valid_vec_isa_list()
    if simd is None:
        isa = cpu_vec_isa.get_isa_from_cpu_capability(os.getenv("ATEN_CPU_CAPABILITY"), isas, cpu_vec_isa.invalid_vec_isa) \
            if isas else None
    else:
        isa = next((i for i in isas if i.bit_width() == simd), None)
    return (str(isa).split()[0].upper(), isa.bit_width()) if isa else None


def vector_simdlen() -> int | None:
    """The vector width (bits) inductor uses in this process when left to itself; None: scalar code.

    Passed on explicitly (cpp.simdlen), so the stack runs exactly what a torch.compile in this
    process runs, and its label says which ISA that is."""
    found = inductor_isa()
    return found[1] if found else None


def formula(fn: str, c: float, sigmoid: tuple[float, float, float], upcast: bool) -> Callable:
    """The cap as user code writes it: c·tanh(a/c), m·σ((a + b)/s), the remedy (softcapgrad.softcap), or c·tanh(a/c)
    under softcapgrad.patch's mode; ``upcast``: on a.float()."""
    import torch

    m, s, b = sigmoid
    if fn == "tanh":
        def cap(x):
            return c * torch.tanh(x / c)
    elif fn == "sigmoid":
        def cap(x):
            return m * torch.sigmoid((x + b) / s)
    elif fn == "remedy":
        from softcapgrad.training.remedy import softcap

        def cap(x):
            return softcap(x, c)
    elif fn == "patch":
        from softcapgrad.training.fp32grad import fp32_tanh_backward

        def cap(x):
            with fp32_tanh_backward():
                return c * torch.tanh(x / c)
    else:
        raise ValueError(fn)
    if not upcast:
        return cap

    def upcast_cap(x):
        return cap(x.float())

    return upcast_cap


def own_code(fn: Callable, name: str) -> Callable:
    """``fn`` with a code object of its own, named ``name``.

    torch.compile caches graphs per code object and guards only on what the traced code reads, not
    on inductor's settings: two configurations of one function would otherwise share a graph.
    """
    code = fn.__code__.replace(co_name=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


_COMPILED: dict[tuple, Callable] = {}


def compile_once(key: tuple, build: Callable[[], Callable]) -> Callable:
    """torch.compile of ``build()``, once per ``key`` (fullgraph: a graph break or a recompile is an error)."""
    import torch

    if key not in _COMPILED:
        name = "_".join(str(k) for k in key).translate(str.maketrans(".-, ()", "pm____"))
        _COMPILED[key] = torch.compile(own_code(build(), f"softcapgrad_{name}"), fullgraph=True, dynamic=False)
    return _COMPILED[key]


@contextlib.contextmanager
def _inductor_settings(compiling: bool, simd: int | None) -> Iterator[None]:
    """Around a compiled call: ``simd``, the vector width in bits for inductor's C++ (1: scalar code; None: inductor's
    default). torch's compiler warns about its own deprecated internals while it imports them: not the caller's to act
    on, and an error where warnings are errors, so those are silenced here. Each graph is compiled in this process
    (``compile_threads`` 1): the stacks' graphs are a few small kernels each, and starting inductor's pool of compile
    workers took longer than compiling them (82 s against 33 s of wall time for a cold ``horizon --path all`` on 2
    cores; the same kernels, the same output)."""
    if not compiling:
        yield
        return
    from torch._inductor import config

    settings = {"compile_threads": 1, **({"cpp.simdlen": simd} if simd is not None else {})}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.")
        with config.patch(settings):
            yield


def torch_gradient(values: np.ndarray, dtype: np.dtype, c: float, fn: str = "tanh", *, compiled: bool = False,
                   simd: int | None = None, upcast: bool = False, sigmoid: tuple[float, float, float] = (0.0, 1.0, 0.0),
                   device: str = "cpu") -> np.ndarray:
    """d/da of the cap over ``values`` of ``dtype``: autograd of the eager formula, or of its torch.compile."""
    import torch

    tdtype = formats.torch_dtype(dtype)
    key = ("grad", fn, c, sigmoid if fn == "sigmoid" else None, upcast, simd, device, dtype.name)
    cap = compile_once(key, lambda: formula(fn, c, sigmoid, upcast)) if compiled else formula(fn, c, sigmoid, upcast)

    def run(chunk: np.ndarray) -> np.ndarray:
        x = torch.from_numpy(chunk).to(device=device, dtype=tdtype).requires_grad_(True)
        with _inductor_settings(compiled, simd):
            z = cap(x)
            (g,) = torch.autograd.grad(z, x, torch.ones_like(z))
        return g.double().cpu().numpy()

    return batched(values, run)


def torch_saturates(values: np.ndarray, dtype: np.dtype, fn: str = "tanh", *, compiled: bool = False,
                    simd: int | None = None, device: str = "cpu") -> np.ndarray:
    """Whether torch's tanh (sigmoid) of each value of ``dtype`` is returned as exactly 1.0."""
    import torch

    tdtype = formats.torch_dtype(dtype)
    f = torch.tanh if fn == "tanh" else torch.sigmoid

    def plain(x):
        return f(x)

    op = compile_once(("knee", fn, simd, device, dtype.name), lambda: plain) if compiled else plain

    def run(chunk: np.ndarray) -> np.ndarray:
        x = torch.from_numpy(chunk).to(device=device, dtype=tdtype)
        with torch.no_grad(), _inductor_settings(compiled, simd):
            return (op(x) == 1.0).cpu().numpy()

    return batched(values, run) == 1.0


# --- jax -------------------------------------------------------------------------------------


@functools.cache
def _jax_gradient_fn(c: float, upcast: bool, jit: bool) -> Callable:
    import jax
    import jax.numpy as jnp

    def cap(a):
        x = a.astype(jnp.float32) if upcast else a
        return c * jnp.tanh(x / c)

    def grad(a):
        z, pull = jax.vjp(cap, a)
        return pull(jnp.ones_like(z))[0]

    return jax.jit(grad) if jit else grad


@functools.cache
def _jax_tanh_fn(fn: str, jit: bool) -> Callable:
    import jax
    import jax.numpy as jnp

    f = jnp.tanh if fn == "tanh" else jax.nn.sigmoid
    return jax.jit(f) if jit else f


def _jax_put(chunk: np.ndarray, dtype: np.dtype, device: str):
    import jax

    return jax.device_put(chunk.astype(dtype), jax.devices(device)[0])


def jax_gradient(values: np.ndarray, dtype: np.dtype, c: float, *, jit: bool, upcast: bool = False,
                 device: str = "cpu") -> np.ndarray:
    """d/da of c·jnp.tanh(a/c) by jax.vjp, op by op or under jax.jit; ``upcast``: on a.astype(float32)."""
    grad = _jax_gradient_fn(c, upcast, jit)
    return batched(values, lambda chunk: np.asarray(grad(_jax_put(chunk, dtype, device))).astype(np.float64))


def jax_saturates(values: np.ndarray, dtype: np.dtype, fn: str = "tanh", *, jit: bool, device: str = "cpu") -> np.ndarray:
    f = _jax_tanh_fn(fn, jit)
    return batched(values, lambda chunk: np.asarray(f(_jax_put(chunk, dtype, device))).astype(np.float64) == 1.0) == 1.0


# --- CUDA only: FlexAttention and tanh.approx.f32 ---------------------------------------------

FLEX_KV, FLEX_D = 128, 16


def flex_gradient(values: np.ndarray, dtype: np.dtype, c: float) -> np.ndarray:
    """FlexAttention (compiled, CUDA) with ``score_mod`` c·tanh(s/c), one chosen score per query.

    q_i = (a_i, 0, …), k_0 = e_0 and the other keys 0: score(i, 0) = a_i exactly (one non-zero
    product, scale 1), every other score 0. v_0 = 0 and the other values e_0; with an upstream gradient
    of ones the softmax passes −p_i0·(1 − p_i0) to score(i, 0), with no cancellation and non-zero for
    |cap| ≤ c < 80. The gradient reaching q_i[0] is that times the backward of the score_mod: zero
    exactly where the cap's derivative is.
    """
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    tdtype = formats.torch_dtype(dtype)

    def score_mod(score, b, h, q_idx, kv_idx):
        return c * torch.tanh(score / c)

    def build():
        def attend(q, k, v):
            return flex_attention(q, k, v, score_mod=score_mod, scale=1.0)

        return attend

    attend = compile_once(("flex", c, dtype.name), build)

    def run(chunk: np.ndarray) -> np.ndarray:
        q = torch.zeros(1, 1, BATCH, FLEX_D, dtype=tdtype, device="cuda")
        q[0, 0, :, 0] = torch.from_numpy(chunk).to(device="cuda", dtype=tdtype)
        k = torch.zeros(1, 1, FLEX_KV, FLEX_D, dtype=tdtype, device="cuda")
        k[0, 0, 0, 0] = 1.0
        v = torch.zeros_like(k)
        v[0, 0, 1:, 0] = 1.0
        q.requires_grad_(True)
        with _inductor_settings(True, None):
            out = attend(q, k, v)
            (g,) = torch.autograd.grad(out, q, torch.ones_like(out))
        return g[0, 0, :, 0].double().cpu().numpy()

    return batched(values, run)


@functools.cache
def _tanh_approx_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(x_ptr, inv_c, t_ptr, g_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        inside = i < n
        x = tl.load(x_ptr + i, mask=inside, other=0.0).to(tl.float32)
        t = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [x * inv_c],
                                      dtype=tl.float32, is_pure=True, pack=1)
        tl.store(t_ptr + i, t, mask=inside)
        tl.store(g_ptr + i, 1.0 - t * t, mask=inside)

    return kernel


def tanh_approx(values: np.ndarray, dtype: np.dtype, c: float, out: str = "grad") -> np.ndarray:
    """flash-attn's softcap arithmetic with the instruction it uses: t = tanh.approx.f32(a·fl(1/c)), then 1 − t².

    ``out``: "grad" for 1 − t² in fp32 (the derivative the backward multiplies by), "tanh" for t.
    With c = 1, t is the instruction's own tanh of a (for the knee).
    """
    import torch

    kernel = _tanh_approx_kernel()
    inv_c = float(np.float32(1.0) / np.float32(c))
    tdtype = formats.torch_dtype(dtype)

    def run(chunk: np.ndarray) -> np.ndarray:
        x = torch.from_numpy(chunk).to(device="cuda", dtype=tdtype)
        t = torch.empty(BATCH, dtype=torch.float32, device="cuda")
        g = torch.empty_like(t)
        kernel[(BATCH // 1024,)](x, inv_c, t, g, BATCH, BLOCK=1024)
        return (g if out == "grad" else t).double().cpu().numpy()

    return batched(values, run)

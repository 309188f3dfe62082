"""Whether a stack runs on this machine, and where a measurement of it ran: the backend installed (jax, mlx,
triton, a CUDA build of torch), a CUDA device, a C++ compiler and a vector ISA for inductor's CPU code."""

from __future__ import annotations

import functools


@functools.cache
def torch_build() -> str:
    """'cuda' unless the installed torch certainly has no CUDA: not installed, or a CPU-only build (a version
    tagged +cpu). Read from the package's metadata, without importing torch: a scan against recorded CUDA
    stacks then needs no torch at all."""
    from importlib import metadata

    try:
        version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "torch is not installed"
    return f"torch {version} is a CPU-only build" if version.endswith("+cpu") else "cuda"


def runs_here(stack) -> str:
    """'' when the stack's backend runs on this machine, else why not."""
    if stack.library == "jax":
        try:
            import jax
        except ImportError:
            return "jax is not installed (pip install 'softcapgrad[jax]')"
        if stack.device == "cuda":
            try:
                jax.devices("gpu")
            except RuntimeError:
                return "jax has no GPU here"
        return ""
    if stack.library == "mlx":
        try:
            import mlx.core  # noqa: F401
        except ImportError:
            return "mlx is not installed (pip install 'softcapgrad[mlx]')"
        return ""
    if stack.device == "cuda":
        build = torch_build()
        if build != "cuda":
            return f"no CUDA device here ({build})"
        import torch

        if not torch.cuda.is_available():
            return "no CUDA device here (torch.cuda.is_available() is False)"
        if stack.engine == "tanh-approx":
            try:
                import triton  # noqa: F401
            except ImportError:
                return "triton is not installed"
    if stack.engine.startswith("torch-compile") and stack.device == "cpu" and (missing := _no_compiler()):
        return missing
    if stack.engine == "torch-compile" and stack.device == "cpu":
        import os

        from softcapgrad.stacks.runners import vector_simdlen

        if vector_simdlen() is None:
            capability = os.getenv("ATEN_CPU_CAPABILITY")
            return (f"inductor emits scalar code in this process (ATEN_CPU_CAPABILITY={capability}): that is "
                    "torch-compile-cpu-scalar" if capability else
                    "inductor has no vector ISA on this CPU (see torch-compile-cpu-scalar)")
    return ""


def _no_compiler() -> str:
    from softcapgrad.stacks.runners import cxx_compiler_missing

    return cxx_compiler_missing()


def _where(stack, simd: int | None = None) -> str:
    """Where a measurement ran; for compiled CPU code, the ISA and vector width that ran."""
    if stack.device == "cuda":
        import torch

        return f"measured on {torch.cuda.get_device_name()}"
    if stack.engine == "torch-compile":
        from softcapgrad.stacks.runners import inductor_isa

        isa = inductor_isa(simd or _simd(stack))
        return f"measured on this CPU (inductor {isa[0]} vector code, {isa[1]} bits)" if isa else "measured on this CPU"
    if stack.engine == "torch-compile-scalar":
        return "measured on this CPU (inductor scalar code)"
    return "measured on this CPU"


def _simd(stack) -> int | None:
    """Inductor's C++ vector width for the stack: what inductor picks in this process for vector code
    (honouring ATEN_CPU_CAPABILITY), 1 for scalar code, else None."""
    if stack.engine == "torch-compile-scalar":
        return 1
    if stack.engine == "torch-compile" and stack.device == "cpu":
        from softcapgrad.stacks.runners import vector_simdlen

        return vector_simdlen()
    return None

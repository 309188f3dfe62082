"""The names users choose from, in one light module the command line can read without torch."""

GATE_SECTIONS = ("competition", "backward", "laguna", "cost", "stability")
TETHER_SECTIONS = ("collapse", "wd", "clamp", "floor", "anchors")
KNEE_FUNCTIONS = ("tanh", "sigmoid")
DYNAMICS_BACKWARDS = ("eager", "remedy")
# the real stacks (softcapgrad.stacks), named here so that the command line lists them without torch
STACK_PATHS = (
    "torch-eager-cpu", "torch-eager-cpu-upcast", "torch-eager-cpu-sigmoid", "torch-eager-cpu-remedy",
    "torch-eager-cpu-patch",
    "torch-compile-cpu", "torch-compile-cpu-scalar", "torch-eager-cuda", "torch-compile-cuda", "flex-attention-cuda",
    "tanh-approx-cuda", "jax-jit-cpu", "jax-jit-cpu-upcast", "jax-eager-cpu", "jax-jit-cuda", "jax-jit-cuda-upcast",
    "jax-eager-cuda",
)
KNEE_STACKS = (  # the stacks whose tanh is their own (not an upcast or another function on another stack's tanh)
    "torch-eager-cpu", "torch-compile-cpu", "torch-compile-cpu-scalar", "torch-eager-cuda", "torch-compile-cuda",
    "tanh-approx-cuda", "jax-jit-cpu", "jax-eager-cpu", "jax-jit-cuda", "jax-eager-cuda",
)

"""The names users choose from, in one light module the command line can read without torch."""

GATE_SECTIONS = ("competition", "backward", "laguna", "cost", "stability")
TETHER_SECTIONS = ("collapse", "wd", "clamp", "floor", "anchors")
KNEE_FUNCTIONS = ("tanh", "sigmoid", "softplus")
HORIZON_FUNCTIONS = KNEE_FUNCTIONS  # tanh: the soft-cap; the others: a gate on its own
DYNAMICS_BACKWARDS = ("eager", "remedy")
# the real stacks (softcapgrad.stacks), named here so that the command line lists them without torch
STACK_PATHS = (
    "torch-eager-cpu", "torch-eager-cpu-upcast", "torch-eager-cpu-sigmoid", "torch-eager-cpu-remedy",
    "torch-eager-cpu-patch",
    "torch-compile-cpu", "torch-compile-cpu-scalar", "torch-eager-cuda", "torch-compile-cuda", "flex-attention-cuda",
    "tanh-approx-cuda", "jax-jit-cpu", "jax-jit-cpu-upcast", "jax-eager-cpu", "jax-jit-cuda", "jax-jit-cuda-upcast",
    "jax-eager-cuda", "mlx-cpu", "mlx-compile-cpu",
)
KNEE_STACKS = (  # the stacks whose tanh is their own (not an upcast or another function on another stack's tanh)
    "torch-eager-cpu", "torch-compile-cpu", "torch-compile-cpu-scalar", "torch-eager-cuda", "torch-compile-cuda",
    "tanh-approx-cuda", "jax-jit-cpu", "jax-eager-cpu", "jax-jit-cuda", "jax-eager-cuda", "mlx-cpu", "mlx-compile-cpu",
)
# the experiment's arms (softcapgrad.experiments.design), named here so that `experiment --help` lists them
# without importing the experiment
EXPERIMENT_ARMS = ("bf16-eager", "bf16-patch", "bf16-patch-deadzone", "bf16-compile", "fp32-eager", "no-cap")
# The experiment's budget, which `experiment --help` states: the committed default run took 1351 s wall for at most
# 150,200 training steps on a shared 2-core machine, 9 ms a step of the tiny model with its set-up; the budget is what
# such a machine does in about half a day.
EXPERIMENT_STEP_SECONDS = 0.009
EXPERIMENT_BUDGET_STEPS = 5_000_000

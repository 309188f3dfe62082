"""The real stacks: where torch eager and compiled, FlexAttention, tanh.approx and JAX kill the
soft-cap gradient. The registry (registry), the runners that measure each stack (runners), the
recorded CUDA measurements and their data (recording, data/), the stacks' knee rows (knees), their
reports (reports), and the monitor composed with the registry (watch). Imports core, laws, training.
"""

"""The demonstrations of the gate documents: the Laguna softplus head gate and its cost (gates) and
TetherGate's collapse and anchoring (tether_demo). Sibling of stacks; imports core, laws, training.
"""

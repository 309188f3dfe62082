"""The names users choose from, in one light module the command line can read without torch."""

GATE_SECTIONS = ("competition", "backward", "laguna", "cost", "stability")
TETHER_SECTIONS = ("collapse", "wd", "clamp", "floor", "anchors")
KNEE_FUNCTIONS = ("tanh", "sigmoid")
DYNAMICS_BACKWARDS = ("eager", "remedy")

"""What users put in a training loop, torch only: the dead-zone-free soft-cap (remedy), the fp32
backward for someone else's tanh and sigmoid (fp32grad), the dead-zone monitor (monitor, with
attribution: where an op ran; tally: what is counted; ingraph: the counter inside compiled code) and
TetherGate (tether). Knows no model family, no stack registry and no command line; what it needs
from above (a path's first zero-gradient input) is passed in. Imports core and laws only.
"""

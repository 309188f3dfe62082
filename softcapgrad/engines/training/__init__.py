"""The training check (``train-parity``): one float64 step as the reference, each library's own step, the verdicts.
"""

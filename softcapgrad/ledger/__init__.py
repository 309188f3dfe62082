"""The claims ledger (claims: every document number beside its recomputation and verdict) and the
figures make reproduce draws (figures). Imports every layer below, never the command line.
"""

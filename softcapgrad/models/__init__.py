"""What looks at real models and files: the audit of a transformers model (audit), the Gemma 2 driver
(gemma2), the scan of saved tensors (scan) and a new recording of the CUDA stacks (record).
Imports every layer below, never the ledger or the command line.
"""

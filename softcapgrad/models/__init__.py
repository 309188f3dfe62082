"""What looks at real transformers models: the audit of one model (audit, caps, trace, contracts,
runnable, audit_report), the census of every model type (census, tiny), the Gemma 2 driver (gemma2)
and a new recording of the CUDA stacks (record). Imports every layer below, never the ledger or the
command line.
"""

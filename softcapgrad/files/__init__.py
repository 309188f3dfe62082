"""What reads saved tensors: the formats a file may hold and reading them in chunks (tensorfiles; a
torch.save archive's structure and storages: torchzip), the one-pass tally of where values sit against
the dead zone (scantally) and the scan's report (scan). Imports core, laws and, lazily, stacks; never
models, the ledger or the command line.
"""

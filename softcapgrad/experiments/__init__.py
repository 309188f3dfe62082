"""End-to-end measurements on real models: does the bf16 dead zone change training, and does the patch
buy anything back (``softcapgrad experiment``). The synthetic task (task), the fixed design (design),
the arms (arms), the training loop (loop), the recovery statistics (stats) and the written results
(report). Imports every layer below, never the ledger or the command line.
"""

"""What plugs the tool into other frameworks' training loops: the transformers Trainer callback
(trainer). Imports the layers below; never models, files, the ledger or the command line.
"""

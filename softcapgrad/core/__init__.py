"""Shared plumbing under every layer: the report shape and its renderer (report), input checks and the
one-line error (checks), atomic and checked files (files), progress lines (progress), chunked torch
loops (chunks, imported only by torch code) and the vocabularies the command line lists (names).
Imports nothing of the package outside this folder.
"""

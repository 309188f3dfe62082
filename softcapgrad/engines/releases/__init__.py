"""``parity-releases``: the same check across the releases of transformers, and their ranges.
"""

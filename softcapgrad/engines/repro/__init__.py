"""``parity --repro``: a reproduction bundle per finding, and its check run again.
"""

"""The forward check (``parity``): the transformers reference, each engine's adapter run in a child, the verdict per cap.
"""

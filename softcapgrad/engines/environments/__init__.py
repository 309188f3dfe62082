"""The engines' environments: one cached virtual environment per requirements file (``environments``), built in
steps (``build_steps``), run only when trusted (``trust``), and what a result records of where it ran (``provenance``).
"""

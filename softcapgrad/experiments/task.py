"""The seeded synthetic token task: a deterministic bigram language, and its label shift.

Every token t of a vocabulary of V has one successor π(t), a permutation drawn from the seed; a batch
is uniform random tokens x with targets π(x) at the same positions, so a model can become fully
confident. The shift: a stated fraction of the tokens (the shifted contexts) get a new successor, the
old successors of the shifted set rotated by one inside it, so each new target is another valid
token and none keeps its old one. Batches are drawn from (seed, phase, step) alone: every arm of a
seed sees the same data in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Task:
    vocab: int  # V
    seq: int  # tokens per sequence
    batch: int  # sequences per step
    shift_fraction: float  # share of tokens whose successor changes at the shift


@dataclass(frozen=True)
class Mapping:
    before: np.ndarray  # π: successor of each token before the shift
    after: np.ndarray  # π' after it
    shifted: np.ndarray  # bool per token: its successor changed


def mapping(task: Task, seed: int) -> Mapping:
    rng = np.random.default_rng([seed, 0])
    before = rng.permutation(task.vocab)
    n = max(2, int(round(task.shift_fraction * task.vocab)))
    chosen = np.sort(rng.choice(task.vocab, size=n, replace=False))
    after = before.copy()
    after[chosen] = before[np.roll(chosen, 1)]  # a rotation inside the shifted set: every one changes
    shifted = np.zeros(task.vocab, dtype=bool)
    shifted[chosen] = True
    return Mapping(before, after, shifted)


def batch(task: Task, seed: int, phase: int, step: int) -> np.ndarray:
    """Token ids (batch, seq), int64, from (seed, phase, step) alone."""
    rng = np.random.default_rng([seed, 1 + phase, step])
    return rng.integers(0, task.vocab, size=(task.batch, task.seq), dtype=np.int64)


def probe(task: Task) -> np.ndarray:
    """Every token once, as one row per sequence length: the contexts the confidence is set on. The last
    row is filled with the tokens again from the first, round as often as a vocabulary shorter than a
    sequence needs."""
    rows = -(-task.vocab // task.seq)
    return np.resize(np.arange(task.vocab, dtype=np.int64), rows * task.seq).reshape(rows, task.seq)


def band_mapping(m: Mapping, logits: np.ndarray, band: tuple[float, float], aim: float) -> tuple[Mapping, int]:
    """The band shift: each shifted context t gets the token whose pre-cap logit ``logits[t]`` lies in ``band``
    closest to ``aim`` (not its old successor); a context with no such token keeps ``m.after[t]``. Returns the
    mapping and the count of shifted contexts that found one."""
    after = m.after.copy()
    found = 0
    for t in np.flatnonzero(m.shifted):
        row = logits[t].astype(np.float64)
        inside = (row >= band[0]) & (row <= band[1])
        inside[m.before[t]] = False
        if inside.any():
            candidates = np.flatnonzero(inside)
            after[t] = candidates[np.argmin(np.abs(row[candidates] - aim))]
            found += 1
    return Mapping(m.before, after, m.shifted), found

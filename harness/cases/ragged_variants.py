"""A ragged case changed in one way that must not change one sequence's result.

The properties of ragged kernels compare a kernel's output for a sequence on a case and on one
of these variants, bit for bit:

- :func:`sequence_alone`: the sequence as a batch of one (batch invariance);
- :func:`others_redrawn`: every input the sequence does not own drawn again, larger
  (sequence independence);
- :func:`pool_permuted`: the pages of a paged cache moved to other places in the pool, the
  block table following them (page independence);
- :func:`unowned_filled`: every slot of the pool that no sequence owns (spare pages, the slots
  past each ``cache_seqlens``) set to a finite value instead of NaN (nothing read past the end).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .ragged import RaggedCase

__all__ = ["others_redrawn", "owned_slots", "pool_permuted", "sequence_alone", "unowned_filled"]


def _need(case: RaggedCase, *layouts: str) -> None:
    if case.layout not in layouts:
        raise ValueError(f"this variant takes a {' or '.join(layouts)} case, not {case.layout}")


def _with(case: RaggedCase, tensors: dict, index: dict | None = None) -> RaggedCase:
    return replace(case, tensors=tensors, index=dict(case.index if index is None else index))


def sequence_alone(case: RaggedCase, b: int) -> RaggedCase:
    """Sequence ``b`` of a varlen or paged case as a batch of one (a paged case keeps the
    whole pool and the sequence's row of the block table)."""
    _need(case, "varlen", "paged")
    t = case.tensors
    if case.layout == "varlen":
        rq, rk = case.batch.query_rows(b), case.batch.key_rows(b)
        tensors = {"q": t["q"][rq], "k": t["k"][rk], "v": t["v"][rk]}
        cu_q = np.array([0, rq.stop - rq.start], np.int32)
        cu_k = np.array([0, rk.stop - rk.start], np.int32)
        return _with(case, tensors, {"cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k})
    tensors = {**t, "q": t["q"][b : b + 1]}
    index = {name: x[b : b + 1] for name, x in case.index.items()}
    return _with(case, tensors, index)


def owned_slots(case: RaggedCase) -> np.ndarray:
    """Per sequence, a ``(num_blocks, page_size)`` mask of the pool slots it reads."""
    _need(case, "paged")
    blocks, page = case.tensors["k_cache"].shape[:2]
    out = np.zeros((case.sequences, blocks, page), dtype=bool)
    for b in range(case.sequences):
        n = case.lengths(b)[1]
        j = np.arange(n)
        out[b, case.index["block_table"][b, j // page], j % page] = True
    return out


def others_redrawn(case: RaggedCase, b: int, *, seed: int, sigma: float = 3.0) -> RaggedCase:
    """``case`` with every float input sequence ``b`` does not read drawn again from
    ``σ·N(0, 1)`` (σ = 3: larger than the generated inputs, so a leak shows); what ``b``
    reads, and every index tensor, stays bit for bit."""
    _need(case, "varlen", "paged")
    rng = np.random.default_rng(seed)
    tensors = {name: x.copy() for name, x in case.tensors.items()}

    def redraw(name: str, where: np.ndarray) -> None:
        x = tensors[name]
        new = (rng.standard_normal(x.shape) * sigma).astype(np.float32).astype(x.dtype)
        x[where] = new[where]

    if case.layout == "varlen":
        for names, rows in (
            (("q",), case.batch.query_rows(b)),
            (("k", "v"), case.batch.key_rows(b)),
        ):
            mine = np.zeros(tensors[names[0]].shape[0], dtype=bool)
            mine[rows] = True
            for name in names:
                redraw(name, ~mine)
        return _with(case, tensors)
    mine_q = np.zeros(case.sequences, dtype=bool)
    mine_q[b] = True
    redraw("q", ~mine_q)
    owned = owned_slots(case)
    others = owned.any(axis=0) & ~owned[b]  # a shared page stays: sequence b reads it too
    for name in ("k_cache", "v_cache"):
        redraw(name, others)
    return _with(case, tensors)


def pool_permuted(case: RaggedCase, *, seed: int) -> RaggedCase:
    """A paged case with its pages at other places of the pool (a random permutation) and the
    block table pointing at them there: every sequence reads the same keys in the same order."""
    _need(case, "paged")
    blocks = case.tensors["k_cache"].shape[0]
    perm = np.random.default_rng(seed).permutation(blocks)  # page i moves to perm[i]
    tensors = dict(case.tensors)
    for name in ("k_cache", "v_cache"):
        pool = np.empty_like(case.tensors[name])
        pool[perm] = case.tensors[name]
        tensors[name] = pool
    index = dict(case.index)
    index["block_table"] = perm[case.index["block_table"]].astype(np.int32)
    return _with(case, tensors, index)


def unowned_filled(case: RaggedCase, value: float = 0.0) -> RaggedCase:
    """A paged case with ``value`` in every pool slot no sequence reads (NaN when generated)."""
    _need(case, "paged")
    free = ~owned_slots(case).any(axis=0)
    tensors = dict(case.tensors)
    for name in ("k_cache", "v_cache"):
        x = case.tensors[name].copy()
        x[free] = value
        tensors[name] = x
    return _with(case, tensors)

"""Hypothesis strategies of flashcheck's adversarial attention inputs (docs/properties.md, Inputs).

``attention_cases(kernel, dtype=...)`` draws :class:`flashcheck.Case` objects from the input
families below, inside the kernel's contract (its dtypes, head dims, masks, GQA, ``Nq != Nk``,
batch and sequence-length multiple). Pass a drawn case to :func:`flashcheck.assert_attention`.

Families: ``randn``, ``huge_logits`` (scores near and past the format's and exp's overflow),
``negative_rows`` (every score of a row large and negative),
``near_ties`` and ``exact_ties`` of the row max, ``subnormal``, ``tiny``, ``spike``,
``fa3_outliers``, ``sink``, ``monotone`` (the running max grows at every key), ``cancel_v``
(outputs near 0), ``uniform``, ``one_hot`` and ``nonfinite`` (NaN/±Inf inputs).

``ragged_cases(kernel, dtype=...)`` draws :class:`flashcheck.RaggedCase` objects for a kernel
declared with ``flashcheck.kernel(fn, layout="varlen")``, ``layout="paged"`` or
``op="combine"``: lengths at block edges and zero-length sequences, pages of 1, 7, 16 and
256 slots in a permuted pool with NaN in every slot no sequence owns, shared pages, decode
with 1 to 8 queries and grouped heads, split-KV partials with empty splits and empty rows.
Pass a drawn case to :func:`flashcheck.check`.

A drawn dense case prints as ``make_case(Recipe(...))``: with ``from flashcheck.strategies import
Recipe, make_case`` that expression rebuilds exactly the values tested.
"""

from flashcheck.properties.strategies import (
    FAMILIES,
    Recipe,
    attention_cases,
    make_case,
    ragged_cases,
)

__all__ = ["FAMILIES", "Recipe", "attention_cases", "make_case", "ragged_cases"]

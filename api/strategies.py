"""Hypothesis strategies of flashcheck's adversarial attention inputs (docs/properties.md, Inputs).

``attention_cases(kernel, dtype=...)`` draws :class:`flashcheck.Case` objects from the input
families below, inside the kernel's contract (its dtypes, head dims, masks, GQA, ``Nq != Nk``,
batch and sequence-length multiple). Pass a drawn case to :func:`flashcheck.assert_attention`.

Families: ``randn``, ``huge_logits`` (scores near and past the format's and exp's overflow),
``negative_rows`` (every score of a row large and negative),
``near_ties`` and ``exact_ties`` of the row max, ``subnormal``, ``tiny``, ``spike``,
``fa3_outliers``, ``sink``, ``monotone`` (the running max grows at every key), ``cancel_v``
(outputs near 0), ``uniform``, ``one_hot`` and ``nonfinite`` (NaN/±Inf inputs).

A drawn case prints as ``make_case(Recipe(...))``: with ``from flashcheck.strategies import
Recipe, make_case`` that expression rebuilds exactly the values tested.
"""

from flashcheck.properties.strategies import FAMILIES, Recipe, attention_cases, make_case

__all__ = ["FAMILIES", "Recipe", "attention_cases", "make_case"]

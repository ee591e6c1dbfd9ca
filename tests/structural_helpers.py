"""Small cases and planted numpy kernels shared by the structural checks' tests."""

import numpy as np

import flashcheck
from flashcheck.harness.cases.families import Recipe, make_case
from flashcheck.kernels.naive import naive_numpy


def small_case(family="randn", b=2, hq=2, hk=2, n=16, nk=None, d=16, seed=1, dtype="fp16", **kw):
    """A (B, H, N, d) case of ``family``, fp16 by default, with ``nk`` keys (default ``n``)."""
    nk = n if nk is None else nk
    return make_case(Recipe(dtype, family, b, hq, hk, n, nk, d, d, seed, **kw))


def naive_fn(q, k, v, *, causal=False, window=None, scale=None, mask=None):
    """The correct naive kernel, as a plain function."""
    return naive_numpy(q, k, v, causal=causal, window=window, mask=mask, scale=scale)


def planted(fn, **kw):
    """A numpy kernel of the naive class that promises bitwise reproducibility."""
    opts = {"arithmetic": "naive", "api": "numpy", "deterministic": True, "batch_invariant": True}
    return flashcheck.kernel(fn, **{**opts, **kw})


def nan_to_zero(q, k, v, *, causal=False, window=None, scale=None, mask=None):
    """NaN inputs read as 0: a NaN never reaches the output."""
    q, k, v = (np.nan_to_num(x, nan=0.0) for x in (q, k, v))
    return naive_fn(q, k, v, causal=causal, window=window, scale=scale, mask=mask)

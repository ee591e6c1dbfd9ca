"""Small adversarial attention problems for the oracle's tests (forward and gradients)."""

import ml_dtypes
import numpy as np
from hypothesis import note
from hypothesis import strategies as st

from flashcheck.harness.core.formats import BF16, FP16, FP32, round_to_format

FMTS = {"fp16": (FP16, np.float16), "bf16": (BF16, ml_dtypes.bfloat16), "fp32": (FP32, np.float32)}


def cast(x, name):
    fmt, dt = FMTS[name]
    return round_to_format(x, fmt).astype(np.float32).astype(dt)  # exact after rounding


@st.composite
def small_cases(draw):
    """Small adversarial problems: sizes, a value family and a seed drive a seeded RNG."""
    name = draw(st.sampled_from(sorted(FMTS)))
    fmt = FMTS[name][0]
    nq, nk = draw(st.integers(1, 5)), draw(st.integers(1, 6))
    d, dv = draw(st.integers(1, 6)), draw(st.integers(1, 3))
    hk = draw(st.sampled_from([1, 2]))
    hq = hk * draw(st.sampled_from([1, 2]))
    family = draw(st.sampled_from(["normal", "huge", "ties", "subnormal", "spread", "cancel"]))
    seed = draw(st.integers(0, 2**32 - 1))
    causal = draw(st.booleans())
    rng = np.random.default_rng(seed)
    masking = draw(st.sampled_from(["none", "window", "random"]))
    extra = {}
    if masking == "window":
        extra["window"] = (draw(st.integers(0, 3)), draw(st.sampled_from([0, 1, None])))
    elif masking == "random":
        extra["mask"] = rng.random((1, hq, nq, nk)) < 0.7
    big = {"fp16": 2.0**7, "bf16": 2.0**60, "fp32": 2.0**60}[name]
    q = rng.standard_normal((1, hq, nq, d))
    k = rng.standard_normal((1, hk, nk, d))
    v = rng.standard_normal((1, hk, nk, dv))
    if family == "huge":
        q *= big
        k *= big
    elif family == "ties":
        k[:] = k[:, :, :1]  # every key identical: exact ties of the row max
    elif family == "subnormal":
        q *= fmt.min_normal * 4
        v *= fmt.min_normal / 8
    elif family == "spread":
        q *= np.exp2(rng.integers(-8, 8, q.shape))
        k *= np.exp2(rng.integers(-8, 8, k.shape))
    elif family == "cancel":
        v[:, :, 1::2] = -v[:, :, ::2][:, :, : v[:, :, 1::2].shape[2]]
    note(
        f"fmt={name} family={family} seed={seed} causal={causal} "
        f"shapes={q.shape},{k.shape},{v.shape}"
    )
    return cast(q, name), cast(k, name), cast(v, name), causal, extra

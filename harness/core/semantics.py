"""The attention problem every implementation and the oracle agree on (docs/api.md, "Attention,
as flashcheck defines it").

Per batch ``b`` and query head ``h`` (key/value head ``h // (Hq/Hk)``, which covers MHA, GQA and
MQA)::

    s_ij = scale · q_i·k_j,   p_ij = exp(s_ij) / Σ_{j' kept} exp(s_ij'),
    O[i, :] = Σ_j p_ij · V[j, :]
    LSE[i]  = log Σ_{j kept} exp(s_ij)            (natural log)

over the keys ``j`` that row ``i`` keeps. Key ``j`` is kept by query ``i`` when every given mask
agrees, with ``off = Nk − Nq`` (masks are aligned bottom-right when ``Nq != Nk``):

- causal: ``j ≤ i + off``;
- window ``(left, right)``: ``i + off − left ≤ j ≤ i + off + right`` (``None`` = unbounded);
- explicit boolean ``mask`` broadcastable to ``(B, Hq, Nq, Nk)``: ``True`` keeps the key.

A row that keeps no key gives ``O = 0`` and ``LSE = −inf``. NaN and ±inf inputs follow the rule
of :func:`nan_rows_and_cols`. Two options change the softmax (:func:`check_softcap_sinks`):
``softcap = c`` replaces every score by ``c·tanh(s_ij/c)``, and ``sinks`` adds ``exp(σ_h)`` to
every denominator of head ``h`` (no value row; a row that keeps no key then has ``LSE = σ_h``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from .formats import Format, format_of
from .fp8 import FP8_GRID, Fp8Scaling, as_descale, as_fp8_array, exact_input, fp8_format_of

__all__ = ["AttentionProblem", "as_exact_array", "check_softcap_sinks", "make_problem"]

INPUT_FORMATS = ("fp16", "bf16", "fp32")


def as_exact_array(x: Any, name: str) -> tuple[np.ndarray, Format]:
    """Host float64 copy of a numpy array or torch tensor (any device) and its format.

    Every fp16/bf16/fp32 value is exactly a float64, so the copy is exact. bf16 torch tensors
    travel as their bit patterns, never through a rounding cast.
    """
    mod = type(x).__module__
    if mod.startswith("torch"):
        import torch

        t = x.detach()
        if t.dtype == torch.bfloat16:
            arr = t.cpu().contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        else:
            arr = t.cpu().numpy()
    elif isinstance(x, np.ndarray):
        arr = x
    else:
        raise TypeError(f"{name} must be a numpy array or a torch tensor, got {type(x).__name__}")
    try:
        fmt = format_of(arr.dtype)
    except TypeError:
        fmt = None
    if fmt is None or fmt.name not in INPUT_FORMATS:
        raise TypeError(
            f"{name} has dtype {arr.dtype}; attention inputs must be float16, bfloat16 or "
            "float32: cast them first (numpy: x.astype(np.float32); torch: x.float(), "
            "x.half() or x.bfloat16())"
        )
    return np.asarray(arr, dtype=np.float64), fmt


@dataclass(frozen=True)
class AttentionProblem:
    """Validated inputs as exact float64 arrays plus the masking and scaling options."""

    q: np.ndarray  # (B, Hq, Nq, d)
    k: np.ndarray  # (B, Hk, Nk, d)
    v: np.ndarray  # (B, Hk, Nk, dv)
    fmt: Format  # the input format
    scale: float | None  # None: the exact real 1/sqrt(d)
    causal: bool
    window: tuple[int | None, int | None] | None
    mask: np.ndarray | None  # bool, broadcast to (B, Hq, Nq, Nk)
    softcap: float | None = None  # c > 0: scores become c·tanh(s/c); None: no cap
    sinks: np.ndarray | None = None  # (Hq,) float64 holding fp32 values: one logit per head
    # FP8 inputs: their format and descales; q, k, v then hold the exact products (fmt is the
    # grid FP8_GRID of those products, see core/fp8.py).
    fp8: Fp8Scaling | None = None

    @property
    def has_options(self) -> bool:
        """Whether soft-capping or sinks change the softmax (:func:`check_softcap_sinks`)."""
        return self.softcap is not None or self.sinks is not None

    @property
    def shape(self) -> tuple[int, int, int, int, int, int, int]:
        """``(B, Hq, Hk, Nq, Nk, d, dv)``."""
        b, hq, nq, d = self.q.shape
        return b, hq, self.k.shape[1], nq, self.k.shape[2], d, self.v.shape[3]

    def kv_head(self, h: int) -> int:
        _, hq, hk, *_ = self.shape
        return h // (hq // hk)

    def keep(self, b: int, h: int, rows: np.ndarray) -> np.ndarray:
        """Boolean ``(len(rows), Nk)``: which keys each of the given query rows keeps."""
        _, _, _, nq, nk, _, _ = self.shape
        i = np.asarray(rows)[:, None]
        j = np.arange(nk)[None, :]
        off = nk - nq
        keep = np.ones((len(rows), nk), dtype=bool)
        if self.causal:
            keep &= j <= i + off
        if self.window is not None:
            left, right = self.window
            if left is not None:
                keep &= j >= i + off - left
            if right is not None:
                keep &= j <= i + off + right
        if self.mask is not None:
            keep &= self.mask[b, h][np.asarray(rows)]
        return keep


def _check_window(window: Any) -> tuple[int | None, int | None] | None:
    if window is None:
        return None
    try:
        left, right = window
    except (TypeError, ValueError):
        raise ValueError(
            f"window must be a pair (left, right) of non-negative ints or None, got {window!r}"
        ) from None
    out = []
    for side, w in (("left", left), ("right", right)):
        if w is None or (isinstance(w, int | np.integer) and w == -1):
            out.append(None)  # -1 is FlashAttention's spelling of "unbounded"
        elif isinstance(w, int | np.integer) and w >= 0:
            out.append(int(w))
        else:
            raise ValueError(f"window {side} must be an int >= 0, -1 or None, got {w!r}")
    return out[0], out[1]


def make_problem(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    window: Any = None,
    mask: Any = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: Any = None,
    descale_q: Any = None,
    descale_k: Any = None,
    descale_v: Any = None,
) -> AttentionProblem:
    """Validate inputs and options; raise ``ValueError``/``TypeError`` that say how to fix them.
    ``softcap`` and ``sinks`` as :func:`check_softcap_sinks` reads them. FP8 inputs
    (``float8_e4m3fn`` or ``float8_e5m2``) take the descales of :mod:`.fp8` (fp32 ``(B, Hk)``,
    default 1): the problem's ``q, k, v`` are then the exact products ``x8 · descale``."""
    descales = {"descale_q": descale_q, "descale_k": descale_k, "descale_v": descale_v}
    (qa, fq), (ka, fk), (va, fv) = _inputs(q, k, v, descales)
    if not (fq == fk == fv):
        raise TypeError(
            f"q, k and v must share one format, got {fq.name}, {fk.name}, {fv.name}; "
            "cast them to the kernel's input dtype"
        )
    for name, a in (("q", qa), ("k", ka), ("v", va)):
        if a.ndim != 4:
            raise ValueError(
                f"{name} must have 4 dimensions (batch, heads, seq, head_dim), got shape "
                f"{a.shape}; add leading axes with {name}[None, None] for a single head"
            )
    b, hq, nq, d = qa.shape
    bk, hk, nk, dk = ka.shape
    bv, hv, nv, dv = va.shape
    if d != dk:
        raise ValueError(f"q head_dim {d} != k head_dim {dk}; q and k must share head_dim")
    if d == 0 or dv == 0:
        raise ValueError("head_dim of q/k and of v must be >= 1")
    if (bk, hk, nk) != (bv, hv, nv):
        raise ValueError(
            f"k {ka.shape} and v {va.shape} must agree in batch, heads and sequence length"
        )
    if bk != b:
        raise ValueError(f"q has batch {b} but k/v have batch {bk}")
    if hk == 0 or hq % hk != 0:
        raise ValueError(
            f"q heads ({hq}) must be a positive multiple of k/v heads ({hk}) for MHA/GQA/MQA"
        )
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, int | float | np.floating):
            raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
        scale = float(scale)
        if not math.isfinite(scale) or abs(scale) > 2.0**64:
            raise ValueError(f"scale must be finite with |scale| <= 2**64, got {scale!r}")
    if not isinstance(causal, bool | np.bool_):
        # (causal="yes" was taken as True, and causal="no" would be too)
        raise TypeError(f"causal must be True or False, got {causal!r}")
    win = _check_window(window)
    m = None
    if mask is not None:
        if type(mask).__module__.startswith("torch"):
            mask = mask.detach().cpu().numpy()
        m = np.asarray(mask)
        if m.dtype != np.bool_:
            raise TypeError(
                f"mask must be boolean (True = keep the key), got dtype {m.dtype}; "
                "convert an additive mask with mask == 0"
            )
        try:
            m = np.broadcast_to(m, (b, hq, nq, nk))
        except ValueError:
            raise ValueError(
                f"mask of shape {m.shape} does not broadcast to (B, Hq, Nq, Nk) = {(b, hq, nq, nk)}"
            ) from None
    cap, sink_arr = check_softcap_sinks(softcap, sinks, hq)
    opts = (scale, bool(causal), win, m, cap, sink_arr)
    if fq.name not in INPUT_FORMATS:  # FP8: exact products with the descales
        scaling = Fp8Scaling(fq, *(as_descale(x, n, (b, hk)) for n, x in descales.items()))
        ds = scaling.descales().values()
        exact = [exact_input(x, d, hk) for x, d in zip((qa, ka, va), ds, strict=True)]
        return AttentionProblem(*exact, FP8_GRID, *opts, scaling)
    return AttentionProblem(qa, ka, va, fq, *opts)


def _inputs(q: Any, k: Any, v: Any, descales: dict[str, Any]) -> list[tuple[np.ndarray, Format]]:
    """The three inputs as exact float64 arrays with their formats (FP8 values as they are:
    the descales are applied once the shapes are checked)."""
    if any(fp8_format_of(x) is not None for x in (q, k, v)):
        return [as_fp8_array(x, n) for x, n in zip((q, k, v), "qkv", strict=True)]
    given = sorted(n for n, x in descales.items() if x is not None)
    if given:
        raise ValueError(
            f"{', '.join(given)} apply to FP8 inputs only; q, k, v here are not float8 "
            "(pass float8_e4m3fn/float8_e5m2 arrays, or drop the descales)"
        )
    return [as_exact_array(x, n) for x, n in zip((q, k, v), "qkv", strict=True)]


def check_softcap_sinks(softcap: Any, sinks: Any, hq: int) -> tuple[float | None, Any]:
    """The two softmax options, validated: ``(softcap, sinks)``.

    ``softcap``: ``None`` or ``0`` (FlashAttention's spelling of "off") for no cap, else a
    finite float ``c > 0``: every score ``s = scale·q·k`` becomes ``c·tanh(s/c)`` before masking.
    ``sinks``: ``None``, or one finite float32 logit ``σ_h`` per query head (a numpy array or
    torch tensor of shape ``(Hq,)``): the denominator of every row of head ``h`` gains
    ``exp(σ_h)``, which has no value row; it is neither scaled nor capped. Returns the cap as a
    float (or ``None``) and the sinks as a float64 array (or ``None``).
    """
    cap = None
    if softcap is not None:
        if isinstance(softcap, bool) or not isinstance(softcap, int | float | np.floating):
            raise TypeError(f"softcap must be a float > 0 or None, got {type(softcap).__name__}")
        if not math.isfinite(float(softcap)) or softcap < 0:
            raise ValueError(
                f"softcap must be a finite float > 0 (or 0/None: off), got {softcap!r}"
            )
        cap = float(softcap) or None
    if sinks is None:
        return cap, None
    if type(sinks).__module__.startswith("torch"):
        sinks = sinks.detach().cpu().float().numpy()
    arr = np.asarray(sinks)
    if arr.dtype.kind != "f":
        raise TypeError(f"sinks must be float32 logits, got dtype {arr.dtype}")
    if arr.shape != (hq,):
        raise ValueError(
            f"sinks must hold one logit per query head, shape ({hq},), got {arr.shape}"
        )
    out = arr.astype(np.float64)
    if not np.isfinite(out).all() or not (out.astype(np.float32).astype(np.float64) == out).all():
        raise ValueError(
            "sinks must be finite float32 values: pass np.asarray(sinks, dtype=np.float32)"
        )
    return cap, out


def nan_rows_and_cols(
    q_rows: np.ndarray, k: np.ndarray, v: np.ndarray, keep: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Which outputs a NaN or ±inf input poisons, for one (batch, head).

    The rule: an output is NaN exactly when its exact computation involves a non-finite input.
    ``O[i, :]`` and ``LSE[i]`` involve ``q_i`` and every kept ``k_j`` (through every score of the
    row); ``O[i, c]`` also involves ``v_jc`` for every kept ``j`` (each kept key has a positive
    weight). Keys a row does not keep are not involved, and a row that keeps no key computes
    nothing (``O = 0``, ``LSE = −inf``). Returns ``row_nan`` ``(R,)`` (O row and LSE) and
    ``elem_nan`` ``(R, dv)`` (O elements, including the rows of ``row_nan``).
    """
    has = keep.any(axis=1)
    bad_q = ~np.isfinite(q_rows).all(axis=1)
    bad_k = ~np.isfinite(k).all(axis=1)
    row_nan = has & (bad_q | (keep & bad_k[None, :]).any(axis=1))
    bad_v = ~np.isfinite(v)  # (Nk, dv)
    if bad_v.any():
        # float64 BLAS: counts are exact integers far below 2^53.
        elem_nan = (keep.astype(np.float64) @ bad_v.astype(np.float64)) > 0
    else:
        elem_nan = np.zeros((keep.shape[0], v.shape[1]), dtype=bool)
    return row_nan, elem_nan | row_nan[:, None]

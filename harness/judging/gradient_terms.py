"""The terms of the gradient bounds (:mod:`flashcheck.harness.judging.gradient_bounds`): the
bounds of one chunk of dQ rows and the sums over query rows that give dK and dV.

``docs/error-bounds.md`` section 11 derives every term; the arithmetic classes are described in
:mod:`flashcheck.harness.judging.gradient_bounds`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.formats import FP32, Format
from .option_terms import cap_scores, cap_slope
from .roundoff import (
    FTZ,
    HALF_SUB32,
    RHO_EXP,
    RHO_TANH,
    SAFETY,
    TF32_SUB,
    U32,
    U_TF32,
    UA,
    finite,
    gamma,
    weight_growth,
)

__all__ = ["Context", "Sums", "add_terms", "chunk_bounds", "dot_terms", "finish_sums", "sum_depth"]


@dataclass
class Context:
    """The class, format, scale and blocking one set of gradient bounds is computed for."""

    fmt: Format
    arith: str
    tau: float
    lam: float
    key_block: int | None
    query_block: int | None
    d: int
    dv: int
    tanh_rho: float = RHO_TANH  # the soft-cap tanh's relative error (roundoff.TANH_ERRORS)

    @property
    def naive(self) -> bool:
        return self.arith == "naive"

    @property
    def tf32(self) -> bool:
        return self.arith == "tf32"

    @property
    def rounds(self) -> bool:
        """Whether ``fl_F`` changes fp32 values (False for F = fp32)."""
        return self.fmt.p < FP32.p

    @property
    def u_f(self) -> float:
        return self.fmt.u if self.rounds else 0.0

    @property
    def sub_f(self) -> float:
        return self.fmt.min_subnormal / 2 if self.rounds else 0.0

    @property
    def prod(self) -> int:
        """Extra rounding of a product in an fp32 dot: fp16/bf16 products are exact in fp32."""
        return 1 if 2 * self.fmt.p > FP32.p else 0

    def acc(self, n: Any, det: bool, u: float = UA) -> np.ndarray:
        """Accumulation constant for sums of depth ``n``: ``γ_n(u)`` or ``min(γ_n, λ√n·u)``."""
        g = gamma(n, u)
        if det:
            return g
        return np.minimum(self.lam * np.sqrt(np.asarray(n, dtype=np.float64)) * u, g)


class Sums:
    """Sums over query rows (and heads) of one kv head's dK or dV terms, per key and column:
    ``lin_*`` the weight errors, ``rnd_*`` the rounding of P or dS into F (deterministic; the
    same with the probabilistic magnitudes as the Hoeffding cap; ``rnd_sq`` the sum of squares
    for Hoeffding), ``mag_*`` the summands' magnitudes (for the accumulation constant),
    ``exact`` the exact sum and ``count`` the nonzero summands per key."""

    def __init__(self, nk: int, width: int) -> None:
        self.lin_det, self.lin_prob, self.rnd_det, self.rnd_cap, self.rnd_sq = (
            np.zeros((nk, width)) for _ in range(5)
        )
        self.mag_det, self.mag_prob, self.exact = (np.zeros((nk, width)) for _ in range(3))
        self.count = np.zeros(nk)


def sum_depth(ctx: Context, n: np.ndarray, block: int | None, n_total: int, heads: int):
    """Rounding depth of an fp32 sum of ``n`` nonzero terms out of ``heads·n_total``, in blocks
    of ``block``: in any order each term meets at most ``n − 1`` additions; blocked, at most
    ``block − 1`` inside its block plus one per block; plus the product's own rounding."""
    n = np.asarray(n, dtype=np.float64)
    depth = n
    if block is not None:
        depth = np.minimum(n, np.minimum(n, block) + heads * math.ceil(n_total / block))
    return depth + ctx.prod


def dot_terms(ctx: Context, absprod: np.ndarray, n: int, det: bool, row_abs, col_abs):
    """Error of an fp32-accumulated dot of length ``n`` with ``|x|·|y|`` = ``absprod``; tf32
    truncates both operands (relative 2^-10, absolute 2^-136 below the normal range)."""
    err = ctx.acc(n + ctx.prod, det) * absprod + n * HALF_SUB32
    if ctx.tf32:
        err = err + 2 * U_TF32 * absprod + TF32_SUB * (row_abs[:, None] + col_abs[None, :]) * 1.01
    return err


def chunk_bounds(ctx: Context, q, k, v, do, keep, fw, sums_k: Sums, sums_v: Sums, opts=None):
    """Bounds for the dQ rows of one chunk; adds the chunk's dK, dV terms to the sums.

    ``opts``: ``(softcap, sink, sink_terms)`` (:mod:`.option_terms`; with a sink, ``k``, ``v``,
    ``keep`` hold its slot first and ``sink_terms`` collects the rows' terms of ``dσ``).

    Longer than 80 lines: it follows section 11 of ``docs/error-bounds.md`` term by term (P,
    dP, D, dS, then dQ, dK, dV), and every later term reuses the earlier ones' arrays; split,
    each piece would take and return a dozen of them."""
    fmt, tau, naive = ctx.fmt, ctx.tau, ctx.naive
    u_f, sub_f = ctx.u_f, ctx.sub_f
    r_n, nk = keep.shape
    d, dv = ctx.d, ctx.dv
    has = keep.any(axis=1)
    n_keep = keep.sum(axis=1).astype(np.float64)
    kf = keep.astype(np.float64)

    # --- exact quantities (float64) -----------------------------------------------------
    s_raw = tau * (q @ k.T)
    a = abs(tau) * (np.abs(q) @ np.abs(k).T)
    cap = sink = None
    extra = g = 0.0
    if opts is not None:
        cap, sink, sink_terms = opts
        s, a, extra = cap_scores(
            s_raw, a, cap=cap, sink=sink, u_store=u_f if naive else 0.0, rho=ctx.tanh_rho
        )
    s = np.where(keep, s_raw if opts is None else s, -np.inf)
    m = np.where(has, s.max(axis=1, initial=-np.inf), 0.0)
    e = np.where(keep, np.exp(s - m[:, None]), 0.0)
    ell = np.where(has, e.sum(axis=1), 1.0)
    p = e / ell[:, None]
    lse = m + np.log(ell)
    log_p = np.where(keep, s - lse[:, None], -np.inf)  # for weights below float64's range
    s0 = np.where(keep, s, 0.0)
    dp = do @ v.T
    big_a = np.abs(do) @ np.abs(v).T  # Σ_c |dO_ic||v_jc|
    o = p @ v
    dd = (p * dp).sum(axis=1)  # D_i
    x = dp - dd[:, None]
    ds = p * x
    if cap is not None:
        g = np.where(keep, 1.0 - np.tanh(s_raw / cap) ** 2, 0.0)
        if sink is not None:
            g[:, 0] = 1.0
        ds = ds * g
    dq0 = ds @ k  # unscaled Σ_j dS_ij k_jc
    abs_k = np.abs(k)
    q_abs_rows = np.abs(q).sum(axis=1)
    k_abs_rows = abs_k.sum(axis=1)
    do_abs_rows = np.abs(do).sum(axis=1)
    v_abs_rows = np.abs(v).sum(axis=1)

    # the kernel's multiplier of dS in the dK GEMM, and its error: q (flash) or fl_F(τ·q)
    q_sub = sub_f if ctx.rounds else HALF_SUB32  # fl_F(τ·q) below F's normal range
    if naive:
        qm = tau * q
        q_err = (u_f + 2 * U32) * np.abs(qm) + q_sub
    else:
        qm = q
        q_err = np.zeros_like(q)

    dq_out = []
    for det in (True, False):
        # --- per-key logit perturbation δ (nats) and the error of the kernel's P ----------
        dot_s = dot_terms(
            ctx,
            a * (1 + (u_f + 2 * U32 if naive else 0.0)),
            d,
            det,
            abs(tau) * q_abs_rows,
            k_abs_rows,
        )
        if naive:
            stored = u_f * np.abs(s0) + sub_f  # S stored in F (subnormal S: half a spacing)
            if sink is not None:
                stored[:, 0] = 0.0  # σ is the fp32 logit itself, never stored in F
            delta = (
                dot_s
                + (u_f + 2 * U32) * a
                + q_sub * k_abs_rows[None, :]
                + stored
                + U32 * (m[:, None] - s0)
                + RHO_EXP
                + extra
            )
            delta_raw = np.where(keep, delta, 0.0)
            delta = np.minimum(delta_raw, 700.0)
            dbar_raw = (p * delta_raw).sum(axis=1)
            # P'/P = e^{Δ_j}/Σ p e^{Δ} lies in [e^{−δ_j−Λ}, e^{δ_j+δ̄}], Λ = log Σ p e^{δ} ≥ δ̄
            dmax = delta.max(axis=1, initial=0.0)
            big_l = dmax + np.log(np.maximum((p * np.exp(delta - dmax[:, None])).sum(1), 1e-300))
            # uncapped: a weight that underflows float64 may still grow to order one
            up = np.minimum(weight_growth(p, log_p, delta_raw + dbar_raw[:, None]), 1 - p)
            down = -p * np.expm1(-delta - big_l[:, None])
            pi = np.where(keep, np.maximum(up, down), 0.0)  # |P' − P|, P' = softmax(Ŝ)
            nu0 = gamma(n_keep + 1, U32) + 2 * U32  # fp32 sum and division: uncentred
            err_p = np.where(keep, pi + nu0[:, None] * (p + pi) + FTZ, 0.0)
            err_pk = err_p
            p_plus = p + err_p
            pk_plus = p_plus
            dc = np.zeros(r_n)
        else:
            bo = fw[0] if det else fw[1]
            lse_err = fw[2] if det else fw[3]
            bo = finite(bo)
            ell_abs = np.abs(np.where(has, lse, 0.0))
            # row-common: the forward's LSE error and lse2 = fl(lse·log2 e)
            dc = np.where(has, np.nan_to_num(lse_err, nan=np.inf) + 2 * U32 * ell_abs, 0.0)
            dc_raw = dc
            dc = np.minimum(dc, 700.0)
            # per key: the score dot, c = fl(scale·log2 e), t = fl(S·c), t − lse2, exp2
            dk_ = dot_s + 2 * U32 * np.abs(s0) + U32 * np.abs(lse[:, None] - s0) + RHO_EXP + extra
            dk_raw = np.where(keep, dk_, 0.0)
            err_pk = np.where(
                keep, weight_growth(p, log_p, dk_raw) + FTZ * np.exp(dc)[:, None], 0.0
            )
            grow = weight_growth(p, log_p, dk_raw + dc_raw[:, None])
            err_p = np.where(keep, grow + FTZ, 0.0)
            p_plus = p + err_p
            pk_plus = p + err_pk

        # --- dP, D, and dS ------------------------------------------------------------------
        e_dp = dot_terms(ctx, big_a, dv, det, do_abs_rows, v_abs_rows)
        if naive:
            e_dp = e_dp * (1 + u_f) + u_f * np.abs(dp) + sub_f  # dP stored in F
            e_dp = np.where(keep, e_dp, 0.0)
            dp_plus = np.abs(dp) + e_dp
            # Σ_j (P' − P)(dP̂_j − D) is centred (both sum to 1); the fp32 softmax's own
            # normalisation error ν and the dP errors are not.
            e_d = (
                (pi * (np.abs(x) + e_dp)).sum(1)
                + ((nu0[:, None] * p_plus + FTZ * kf) * dp_plus).sum(1)
                + (p * e_dp).sum(1)
                + ctx.acc(n_keep + 1, det, U32) * (p_plus * dp_plus).sum(1)
                + n_keep * HALF_SUB32
            )
        else:
            e_dp = np.where(keep, e_dp, 0.0)
            dp_plus = np.abs(dp) + e_dp
            # D = Σ_c fl(dO·Ô) from the forward's rounded output Ô = O ± B_O
            ndv = dv + ctx.prod
            e_d = (
                (np.abs(do) * bo).sum(1)
                + ctx.acc(ndv, det) * (np.abs(do) * (np.abs(o) + bo)).sum(1)
                + dv * HALF_SUB32
            )
        e_d = np.where(has, e_d, 0.0)
        d_plus = np.abs(dd) + e_d
        x_plus = np.where(keep, np.abs(x) + e_dp + e_d[:, None], 0.0)
        # dS32 = fl(P̂·fl(dP̂ − D̂)) (or fl(fl(P̂·dP̂) − fl(P̂·D̂))), less the term −P·e_D, which
        # is common to the row; flash: also less the row-common factor e^{θc}.
        e_ds = np.where(
            keep,
            err_pk * x_plus
            + p * e_dp
            + U32 * pk_plus * (dp_plus + d_plus[:, None] + x_plus)
            + 2 * HALF_SUB32
            + sub_f,
            0.0,
        )
        mag32 = np.where(keep, pk_plus * x_plus * (1 + U32), 0.0)  # |dŜ32|·e^{−θc}
        px = p_plus * x_plus * (1 + U32)
        g_hi = 1.0
        if cap is not None:  # dS32 times the recomputed slope ĝ = fl(1 − fl(tanh²)), either order
            s_err = dot_s + 2 * U32 * np.abs(s_raw)
            if naive:  # q·τ stored in F, S stored in F, s/c in fp32
                s_err = s_err + (u_f + 2 * U32) * a + q_sub * k_abs_rows + u_f * np.abs(s_raw)
                s_err = s_err + sub_f
            g_hi, e_g = cap_slope(s_raw, s_err, cap, keep=keep, sink=sink, rho=ctx.tanh_rho)
            g_hi = g_hi + e_g  # from here on: a bound on |ĝ|
            # The absolute terms (subnormal roundings of dS32 and of its product by ĝ, dS
            # rounded into F) do not shrink with ĝ: they are added again, unscaled. A kernel
            # that forms fl(P̂·ĝ) first (this project's Triton backward) multiplies that
            # product's subnormal rounding by |dP̂ − D̂|, the last term.
            e_ds = (
                g_hi * e_ds
                + mag32 * (e_g + 3 * U32 * g_hi)
                + 4 * HALF_SUB32
                + sub_f
                + HALF_SUB32 * x_plus * (1 + U32)
            )
            e_ds = np.where(keep, e_ds, 0.0)
            mag32 = mag32 * g_hi * (1 + 3 * U32)
            px = px * g_hi * (1 + 3 * U32)
        rnd = u_f * mag32  # dS rounded into F (relative part)
        ec = np.expm1(dc)
        mag_f = np.where(keep, (px + HALF_SUB32) * (1 + u_f) + sub_f, 0.0)
        if sink is not None:
            sink_terms.add(det, p=p[:, 0], err_p=err_p[:, 0], d=dd, e_d=e_d, has=has)

        # --- dQ ------------------------------------------------------------------------------
        dep_q = sum_depth(ctx, n_keep, ctx.key_block, nk, 1)
        acc_q = ctx.acc(dep_q, det)[:, None] * (mag_f @ abs_k) + dep_q[:, None] * HALF_SUB32
        if ctx.tf32:
            acc_q = (
                acc_q
                + 2 * U_TF32 * (mag_f @ abs_k)
                + TF32_SUB * (mag_f.sum(1)[:, None] + kf @ abs_k) * 1.01
            )
        if det:
            rq = rnd @ abs_k
        else:
            rq = np.minimum(ctx.lam * np.sqrt((rnd * rnd) @ (k * k)), rnd @ abs_k)
        lin_q = e_ds @ abs_k + rq + e_d[:, None] * np.abs((p * (g_hi if cap else 1.0)) @ k)
        err_q = np.exp(dc)[:, None] * lin_q + ec[:, None] * np.abs(dq0) + acc_q
        if naive:  # dQs = fl_F(acc), then dq = fl_F(dQs·τ) (τ rounded to fp32, fp32 product)
            err_q = err_q + u_f * (np.abs(dq0) + err_q) + sub_f
        big = np.abs(dq0) + err_q
        err_q = abs(tau) * err_q + abs(tau) * big * (2 * U32 + u_f * (1 + 2 * U32)) + sub_f
        err_q = err_q + HALF_SUB32
        err_q = np.where(has[:, None], err_q * (1 + SAFETY * ctx.fmt.u), 0.0)
        dq_out.append(np.nan_to_num(err_q, nan=np.inf))

        # --- dK terms: Σ_i dS_F,ij·qm_ic -------------------------------------------------
        ef = np.exp(dc)[:, None]
        e_full = ef * (e_ds + p * g_hi * e_d[:, None]) + ec[:, None] * np.abs(ds)
        r_full = ef * rnd
        qm_plus = np.abs(qm) + q_err
        add_terms(
            sums_k,
            det,
            ctx,
            lin=e_full.T @ np.abs(qm) + mag_f.T @ q_err,
            rnd=r_full.T @ np.abs(qm),
            sq=(r_full * r_full).T @ (qm * qm),
            mag=mag_f.T @ qm_plus,
            tf=(mag_f.sum(0)[:, None] + kf.T @ qm_plus) if ctx.tf32 else None,
            exact=ds.T @ qm,
            count=kf.sum(0),
        )

        # --- dV terms: Σ_i P_F,ij·dO_ic --------------------------------------------------
        sub_p = np.where(keep & (p - err_p < fmt.min_normal), sub_f, 0.0)
        rnd_p = u_f * p_plus
        pf_plus = np.where(keep, p_plus * (1 + u_f) + sub_f, 0.0)
        add_terms(
            sums_v,
            det,
            ctx,
            lin=(err_p + sub_p).T @ np.abs(do),
            rnd=rnd_p.T @ np.abs(do),
            sq=(rnd_p * rnd_p).T @ (do * do),
            mag=pf_plus.T @ np.abs(do),
            tf=(pf_plus.sum(0)[:, None] + kf.T @ np.abs(do)) if ctx.tf32 else None,
            exact=p.T @ do,
            count=kf.sum(0),
        )
    return dq_out


def add_terms(sums: Sums, det: bool, ctx: Context, *, lin, rnd, sq, mag, tf, exact, count):
    if tf is not None:  # tf32 operands of the dK / dV GEMM: 2·2^-10·Σ|x||y| + absolute terms
        lin = lin + 2 * U_TF32 * mag + TF32_SUB * tf * 1.01
    if det:
        sums.lin_det += lin
        sums.rnd_det += rnd
        sums.mag_det += mag
        sums.exact += exact
        sums.count += count
    else:
        sums.lin_prob += lin
        sums.rnd_cap += rnd
        sums.rnd_sq += sq
        sums.mag_prob += mag


def finish_sums(ctx: Context, sums: list[Sums], mult: float, heads: int, nq: int):
    """dK or dV bounds of one kv head from the sums: accumulation, scale (dK), store in F;
    naive: per-head stores, then the group's sum in F."""
    u_f, sub_f = ctx.u_f, ctx.sub_f
    outs = []
    for det in (True, False):
        total_err = 0.0
        total_mag = 0.0
        for sm in sums:
            dep = sum_depth(ctx, sm.count, ctx.query_block, nq, heads)[:, None]
            if det:
                lin = sm.lin_det + sm.rnd_det
                mag = sm.mag_det
            else:
                lin = sm.lin_prob + np.minimum(ctx.lam * np.sqrt(sm.rnd_sq), sm.rnd_cap)
                mag = sm.mag_prob
            err = lin + ctx.acc(dep, det) * mag + dep * HALF_SUB32
            big = np.abs(sm.exact) + err
            if ctx.naive:
                err = err + u_f * big + sub_f  # the per-head store in F
            else:  # fl_F(fl32(acc·fl32(scale))) for dK; fl_F(acc) for dV
                scale_u = 2 * U32 if mult != 1.0 else 0.0  # fl32(scale) and the product
                err = abs(mult) * (err + big * (scale_u + u_f * (1 + 2 * U32)))
                err = err + sub_f + HALF_SUB32
            err = np.where(sm.count[:, None] > 0, err, 0.0)
            total_err = total_err + err
            total_mag = total_mag + np.abs(sm.exact) * abs(mult) + err
        if len(sums) > 1:  # naive GQA: per-head results added in F, one rounding per add
            live = sum(sm.count for sm in sums)[:, None] > 0
            extra = gamma(len(sums) - 1, ctx.fmt.u) * total_mag + (len(sums) - 1) * (
                ctx.fmt.min_subnormal / 2
            )
            total_err = total_err + np.where(live, extra, 0.0)
        outs.append(np.nan_to_num(total_err * (1 + SAFETY * ctx.fmt.u), nan=np.inf))
    return outs

"""Time the Triton varlen kernel on a GPU, and check each timed shape against fp64 attention.

    python benchmarks/gpu_varlen_bench.py [--json out.json]

A packed batch of ``B`` sequences with ragged lengths (drawn from a fixed seed, ``Nq = Nk``),
``d = 128``, bf16 and fp16, causal and not, ``Hq = 16`` on ``Hk = 16`` or ``Hq = 32`` on
``Hk = 8``: forward and forward + backward of ``flash_attn_varlen`` (triton.testing.do_bench,
median), against the dense Triton kernel (kernels/triton_flash.py) on the same batch padded to
its longest sequence, which computes (and pays for) the padding too. TFLOP/s count only the
useful work of each sequence (4·Nq·Nk·d·Hq forward, 2.5× that for the backward; causal halved).
Each shape's O and dQ/dK/dV are compared with fp64 torch attention per sequence (the max
absolute error, printed next to the fp32-rounding scale of the values); the full numerics
verdict is the campaign's (``flashcheck report --kernel triton-varlen --preset gpu``).
"""

from __future__ import annotations

import argparse
import json
import math

import torch
import triton

from flashcheck.kernels.triton_flash import flash_attention
from flashcheck.kernels.triton_varlen_bwd import flash_attn_varlen_differentiable

SHAPES = [  # (batch, shortest, longest, hq, hk)
    (16, 128, 4096, 16, 16),
    (64, 16, 1024, 32, 8),
]
DTYPES = (torch.bfloat16, torch.float16)


def _batch(b, lo, hi, hq, hk, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (b,), generator=g)
    lens[0] = hi  # the longest sets the padded batch
    cu = torch.zeros(b + 1, dtype=torch.int32)
    cu[1:] = lens.cumsum(0)
    total = int(cu[-1])
    q = torch.randn(total, hq, 128, generator=g).to(dtype).cuda()
    k = torch.randn(total, hk, 128, generator=g).to(dtype).cuda()
    v = torch.randn(total, hk, 128, generator=g).to(dtype).cuda()
    return q, k, v, cu.cuda(), [int(x) for x in lens]


def _padded(x, cu, lens):
    out = x.new_zeros(len(lens), max(lens), *x.shape[1:])
    for b, n in enumerate(lens):
        out[b, :n] = x[int(cu[b]) : int(cu[b]) + n]
    return out.transpose(1, 2).contiguous()  # (B, H, N, d)


def _reference_errors(q, k, v, cu, lens, causal, o, grads, do):
    """Max |error| of O, dQ, dK, dV against fp64 torch attention, sequence by sequence."""
    worst = {"o": 0.0, "dq": 0.0, "dk": 0.0, "dv": 0.0}
    rep = q.shape[1] // k.shape[1]
    for b, n in enumerate(lens[:8]):  # the first 8 sequences (the longest among them)
        s0 = int(cu[b])
        qs, ks, vs = (x[s0 : s0 + n].double().requires_grad_() for x in (q, k, v))
        qh = qs.transpose(0, 1)
        kh = ks.transpose(0, 1).repeat_interleave(rep, 0)
        vh = vs.transpose(0, 1).repeat_interleave(rep, 0)
        sc = (qh @ kh.transpose(-1, -2)) / math.sqrt(q.shape[2])
        if causal:
            sc = sc.masked_fill(torch.ones(n, n, device=q.device).triu(1).bool(), -math.inf)
        ref = (torch.softmax(sc, -1) @ vh).transpose(0, 1)
        gr = torch.autograd.grad(ref, (qs, ks, vs), do[s0 : s0 + n].double())
        worst["o"] = max(worst["o"], (o[s0 : s0 + n].double() - ref).abs().max().item())
        for name, got, want in zip(("dq", "dk", "dv"), grads, gr, strict=True):
            err = (got[s0 : s0 + n].double() - want).abs().max().item()
            worst[name] = max(worst[name], err)
    return worst


def _one(shape, dtype, causal, seed):
    b, lo, hi, hq, hk = shape
    q, k, v, cu, lens = _batch(b, lo, hi, hq, hk, dtype, seed)
    mx = max(lens)
    args = (cu, cu, mx, mx)
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    o, _ = flash_attn_varlen_differentiable(qg, kg, vg, *args, causal=causal)
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, (qg, kg, vg), do)
    errs = _reference_errors(q, k, v, cu, lens, causal, o, grads, do)

    def fwd():
        return flash_attn_varlen_differentiable(q, k, v, *args, causal=causal)

    def fwd_bwd():
        out, _ = flash_attn_varlen_differentiable(qg, kg, vg, *args, causal=causal)
        out.backward(do)

    pq, pk, pv = (_padded(x, cu, lens) for x in (q, k, v))

    def dense():
        return flash_attention(pq, pk, pv, causal=causal)

    t_f = triton.testing.do_bench(fwd)
    t_fb = triton.testing.do_bench(fwd_bwd)
    t_d = triton.testing.do_bench(dense)
    work = sum(4.0 * n * n * 128 * hq for n in lens) * (0.5 if causal else 1.0)
    return {
        "shape": f"B={b} N={lo}..{hi} Hq={hq} Hk={hk}",
        "dtype": str(dtype).replace("torch.", ""),
        "causal": causal,
        "tokens": int(cu[-1]),
        "fwd_ms": t_f,
        "fwd_tflops": work / t_f / 1e9,
        "fwd_bwd_ms": t_fb,
        "fwd_bwd_tflops": 3.5 * work / t_fb / 1e9,
        "dense_padded_ms": t_d,
        "errors": errs,
    }


def _line(r: dict) -> str:
    e = r["errors"]
    return (
        f"| {r['shape']} | {r['dtype']} | {r['causal']} | {r['fwd_ms']:.3f} | "
        f"{r['fwd_tflops']:.0f} | {r['fwd_bwd_ms']:.3f} | {r['fwd_bwd_tflops']:.0f} | "
        f"{r['dense_padded_ms']:.3f} | {e['o']:.2g} / {e['dq']:.2g} / {e['dk']:.2g} / "
        f"{e['dv']:.2g} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the rows here as JSON (after each row)")
    args = ap.parse_args()
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    print(f"{gpu}, torch {torch.__version__}, triton {triton.__version__}")
    print(
        "| shape | dtype | causal | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s "
        "| dense padded fwd ms | max abs err O / dQ / dK / dV |"
    )
    print("|---" * 9 + "|", flush=True)
    rows = []
    for shape in SHAPES:
        for dtype in DTYPES:
            for causal in (False, True):
                rows.append(_one(shape, dtype, causal, seed=len(rows)))
                print(_line(rows[-1]), flush=True)  # a run stopped at its limit keeps these
                if args.json:
                    with open(args.json, "w") as fh:
                        json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()

"""GPU check and timing of the FP8 Triton forward (kernels/triton_flash_fp8.py), in one run.

    python benchmarks/fp8_check.py [--quick]     # on a CUDA GPU (Hopper for fp8 tensor cores)

1. Correctness, shape by shape (N 128-4096, d 64-256, causal or not, GQA): the kernel's O against
   (a) a float64 computation on the exact dequantized inputs (RMSE, max error) and (b) an
   emulation of its class in torch (fp32 scores by key blocks of the kernel's BLOCK_N, fp32
   online softmax, P rounded to e4m3 by torch's cast, fp32 P·V). PASS needs the kernel's
   RMSE against the exact result within 5 % of the emulation's (FlashAttention #2716 was 55-68 %
   above) and the kernel-emulation distance at most half the emulation's own error (measured
   8-29 %: Hopper's fp8 accumulator keeps about 13 bits, see the kernel's docstring), and the
   LSE within 1e-2 of float64's (-inf exactly where a row keeps no key). A kernel
   that rounds P to e5m2 doubles the error; one that applies a descale twice fails both.
   A probe also compares Triton's fp32 -> e4m3 cast with torch's on values in [0, 1] (the P
   quantization).
2. FlashAttention-3 Table 3: N = 4096, d = 128, inputs N(0,1) + N(0,100)·Bernoulli(0.001),
   RMSE against float64 on the unquantized inputs (the paper's measurement, which includes the
   input quantization) for the FP8 kernel (per-(B, H) descales), the project's fp16/bf16
   forward and SDPA, beside the paper's figures.
3. Accumulation: the fp8 tensor-core sum's error against float64 (Triton's default on sm_90
   and a promotion to fp32 every 32 products), and each accumulation variant of the kernel
   (Fp8Config.chunk, acc_in_dot) at N = 4K: its distance to the emulation and its speed.
4. Timing (triton.testing.do_bench median after warm-up): B·N = 16K, H = 16, d = 128,
   N 1K-16K, causal or not: the FP8 kernel ("triton-fp8": V as (B, H, N, d), which the public
   function copies to key-contiguous; "triton-fp8 Vt": V passed key-contiguous), the
   project's bf16 forward, SDPA flash and cuDNN (bf16); 4·N²·d FLOPs per head, halved for
   causal. cuDNN's FP8 attention: reported as absent or present (see `fp8_sdpa_api`).
   A launch-configuration sweep at N = 4K goes first (`--quick` skips it and the 8K point).
Every step catches its own errors, prints them and goes on. The summary tables come last.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fp8_reference import E4M3, emulate, exact, quantize

from flashcheck.kernels.triton_flash import flash_attention
from flashcheck.kernels.triton_flash_fp8 import (
    Fp8Config,
    flash_attention_fp8,
    fp8_launch_config,
    launch_fp8,
)

PAPER = (
    "paper (FA3 Table 3): FP16 baseline 3.2e-4, FA2/FA3 FP16 1.9e-4, FP8 baseline 2.4e-2, "
    "FA3 FP8 9.1e-3"
)


@dataclass(frozen=True)
class CheckRow:
    shape: str
    rmse: float
    max_err: float
    emu_rmse: float
    dist: float
    same: float
    lse_err: float
    status: str


@dataclass(frozen=True)
class TimeRow:
    provider: str
    n: int
    causal: bool
    ms: float
    tflops: float


def check_shape(shape, seed: int) -> CheckRow:
    b, hq, hk, nq, nk, d, causal = shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = [
        torch.randn(b, h, n, d, device="cuda", generator=g)
        for h, n in ((hq, nq), (hk, nk), (hk, nk))
    ]
    # q's descale is per (batch, kv-head) as in FA3: quantize q's heads of a group together.
    qg = x[0].reshape(b, hk, -1, d)
    q8, dq = quantize(qg)
    q8 = q8.reshape(b, hq, nq, d)
    (k8, dk), (v8, dv) = quantize(x[1]), quantize(x[2])
    scale = d**-0.5
    o, lse = flash_attention_fp8(
        q8, k8, v8, descale_q=dq, descale_k=dk, descale_v=dv, causal=causal, return_lse=True
    )
    o = o.float()

    def deq(t8, ds, g=1):
        return t8.float() * ds.repeat_interleave(g, 1)[:, :, None, None]

    ref, ref_lse = exact(
        deq(q8, dq, hq // hk), deq(k8, dk), deq(v8, dv), causal=causal, scale=scale, lse=True
    )
    empty = torch.isinf(ref_lse)
    lse_err = (lse.double() - ref_lse)[~empty].abs().max().item()
    lse_ok = bool(torch.equal(torch.isneginf(lse), empty)) and lse_err <= 1e-2
    cfg = fp8_launch_config(q8, v8, causal=causal)
    emu = emulate(q8, k8, v8, (dq, dk, dv), causal=causal, scale=scale, block_n=cfg.block_n)
    emu_bf = emu.to(torch.bfloat16).float()
    rmse = (o.double() - ref).pow(2).mean().sqrt().item()
    emu_rmse = (emu_bf.double() - ref).pow(2).mean().sqrt().item()
    dist = (o - emu_bf).double().pow(2).mean().sqrt().item()
    ok = lse_ok and rmse <= 1.05 * emu_rmse + 1e-7 and dist <= 0.5 * emu_rmse + 1e-7
    return CheckRow(
        "B{} Hq{} Hk{} Nq{} Nk{} d{} {}".format(*shape[:6], "causal" if causal else "full"),
        rmse, (o.double() - ref).abs().max().item(), emu_rmse, dist,
        (o == emu_bf).float().mean().item(), lse_err, "PASS" if ok else "FAIL",
    )  # fmt: skip


def cast_probe() -> str:
    """Triton's fp32 -> e4m3 cast (the kernel's P quantization) against torch's on [0, 1]."""
    import triton
    import triton.language as tl

    @triton.jit
    def _cast(X, Y, n, BLOCK: tl.constexpr):
        o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(Y + o, tl.load(X + o, mask=o < n).to(tl.float8e4nv), mask=o < n)

    bits = torch.arange(0, 0x3F800001, 97, dtype=torch.int64, device="cuda").to(torch.int32)
    x = bits.view(torch.float32)
    y = torch.empty(x.numel(), dtype=E4M3, device="cuda")
    _cast[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    diff = int((y.float() != x.to(E4M3).float()).sum())
    return f"fp32 -> e4m3 cast on {x.numel()} values in [0, 1]: {diff} differ from torch's"


def dot_probe(k_dim: int = 4096) -> list[str]:
    """How many bits the fp8 tensor-core sum keeps: one (64 × K)·(K × 64) e4m3 product with
    fp32 output, Triton's default against a promotion every 32 products, error in units of
    2^-24·Σ|a_i b_i| (an fp32 sum of K terms stays below about K/2 of them)."""
    import triton
    import triton.language as tl

    @triton.jit
    def _mm(A, B, C, K: tl.constexpr, CHUNK: tl.constexpr):
        r = tl.arange(0, 64)
        acc = tl.zeros([64, 64], dtype=tl.float32)
        for k0 in range(0, K, 128):
            kk = k0 + tl.arange(0, 128)
            a = tl.load(A + r[:, None] * K + kk[None, :])
            b = tl.load(B + kk[:, None] * 64 + r[None, :])
            if CHUNK > 0:
                acc = tl.dot(a, b, acc, max_num_imprecise_acc=CHUNK)
            else:
                acc = tl.dot(a, b, acc)
        tl.store(C + r[:, None] * 64 + r[None, :], acc)

    g = torch.Generator(device="cuda").manual_seed(1)
    a = (torch.randn(64, k_dim, device="cuda", generator=g) * 4).to(E4M3)
    bt = (torch.randn(64, k_dim, device="cuda", generator=g) * 4).to(E4M3)
    b = bt.t().contiguous()
    ref = a.double() @ b.double()
    mag = a.double().abs() @ b.double().abs()
    out = []
    for chunk in (0, 32):
        c = torch.empty(64, 64, device="cuda")
        _mm[(1,)](a, b, c, K=k_dim, CHUNK=chunk)
        e = ((c.double() - ref).abs() / mag / 2.0**-24).max().item()
        out.append(
            f"fp8 tl.dot K={k_dim}, max_num_imprecise_acc={chunk or 'default'}: "
            f"max error {e:.1f} x 2^-24·Σ|ab|"
        )
    f32 = (a.float() @ b.float()).double()
    out.append(
        f"torch fp32 matmul (no tf32): {((f32 - ref).abs() / mag / 2.0**-24).max().item():.1f}"
    )
    return out


VARIANTS = {
    "default": {},
    "chunk32": {"chunk": 32},
    "acc-out": {"acc_in_dot": False},
    "chunk32+acc-out": {"chunk": 32, "acc_in_dot": False},
}


def variant_probe(n: int = 4096, d: int = 128) -> list[str]:
    """Each accumulation variant at N = 4K: distance to the emulation and speed."""
    out = []
    for causal in (False, True):
        x = [torch.randn(1, 4, n, d, device="cuda") for _ in range(3)]
        (q8, dq), (k8, dk), (v8, dv) = (quantize(t) for t in x)
        vt = v8.transpose(-1, -2).contiguous().transpose(-1, -2)
        base = fp8_launch_config(q8, v8, causal=causal)
        ref = exact(
            *(t8.float() * s[:, :, None, None] for t8, s in ((q8, dq), (k8, dk), (v8, dv))),
            causal=causal,
            scale=d**-0.5,
        )
        emu = emulate(q8, k8, v8, (dq, dk, dv), causal=causal, scale=d**-0.5, block_n=base.block_n)
        emu = emu.to(torch.bfloat16).float()
        e_emu = (emu.double() - ref).pow(2).mean().sqrt().item()
        _, (tq, tk, _, tvt), tds, flops = _fp8_inputs(n, d, 16)
        for name, kw in VARIANTS.items():
            cfg = base._replace(**kw)
            o, _ = launch_fp8(
                q8,
                k8,
                vt,
                (dq, dk, dv),
                causal=causal,
                scale=d**-0.5,
                out_dtype=torch.bfloat16,
                config=cfg,
            )
            dist = (o.float() - emu).double().pow(2).mean().sqrt().item()
            same = (o.float() == emu).float().mean().item()
            run = partial(
                launch_fp8,
                tq,
                tk,
                tvt,
                tds,
                causal=causal,
                scale=d**-0.5,
                out_dtype=torch.bfloat16,
                config=cfg,
            )
            tf = _report(f"variant {name} causal={causal}", flops * (0.5 if causal else 1.0), run)
            out.append(f"| {name} | {causal} | {dist / e_emu:.3f} | {same:.3f} | {tf or 0:.0f} |")
    return out


def table3(seed: int = 0) -> list[tuple[str, float]]:
    b, h, n, d = 1, 8, 4096, 128
    g = torch.Generator(device="cuda").manual_seed(seed)

    def draw():
        x = torch.randn(b, h, n, d, device="cuda", generator=g)
        out = torch.randn(b, h, n, d, device="cuda", generator=g) * 10.0
        return x + out * (torch.rand(b, h, n, d, device="cuda", generator=g) < 0.001)

    q, k, v = draw(), draw(), draw()
    ref = exact(q, k, v, causal=False, scale=d**-0.5)

    def rmse(o):
        return (o.double() - ref).pow(2).mean().sqrt().item()

    rows = []
    (q8, dq), (k8, dk), (v8, dv) = quantize(q), quantize(k), quantize(v)
    rows.append(("triton-fp8 (e4m3, per-head descales)", rmse(
        flash_attention_fp8(q8, k8, v8, descale_q=dq, descale_k=dk, descale_v=dv))))  # fmt: skip
    for name, dt in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        qq, kk, vv = q.to(dt), k.to(dt), v.to(dt)
        rows.append((f"triton {name}", rmse(flash_attention(qq, kk, vv)[0])))
        rows.append(
            (f"sdpa {name}", rmse(torch.nn.functional.scaled_dot_product_attention(qq, kk, vv)))
        )
    return rows


def fp8_sdpa_api() -> str:
    names = [n for n in dir(torch.ops.aten) if "attention" in n and ("quant" in n or "fp8" in n)]
    names += [n for n in dir(torch.nn.functional) if "quantized" in n and "attention" in n]
    if not names:
        return f"torch {torch.__version__}: no FP8 SDPA entry point (cuDNN FP8 attention not timed)"
    return (
        f"torch {torch.__version__}: FP8 attention entry points {names} (not timed: API unverified)"
    )


def _bench(fn) -> float:
    import triton

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def _sdpa(backend):
    from torch.nn.attention import sdpa_kernel

    def run(q, k, v, causal):
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return run


def _fp8_inputs(n: int, d: int, heads: int):
    b = max(1, 16384 // n)
    x = [torch.randn(b, heads, n, d, device="cuda") for _ in range(3)]
    (q8, dq), (k8, dk), (v8, dv) = (quantize(t) for t in x)
    vt = v8.transpose(-1, -2).contiguous().transpose(-1, -2)  # key-contiguous V
    return x, (q8, k8, v8, vt), (dq, dk, dv), 4.0 * b * heads * n * n * d


def _report(label: str, flops: float, fn) -> float | None:
    """Time ``fn`` and print one line; on failure print the error and return None."""
    try:
        ms = _bench(fn)
    except Exception as e:  # keep going: one failure must not end the run
        print(f"  {label}: ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
        return None
    print(f"  {label:40s} {ms:8.3f} ms {flops / ms / 1e9:6.0f} TFLOP/s", flush=True)
    return flops / ms / 1e9


def time_shape(n: int, causal: bool, d: int = 128, heads: int = 16) -> list[TimeRow]:
    from torch.nn.attention import SDPBackend

    x, (q8, k8, v8, vt), (dq, dk, dv), flops = _fp8_inputs(n, d, heads)
    flops *= 0.5 if causal else 1.0
    bf = [t.to(torch.bfloat16) for t in x]
    fp8 = dict(descale_q=dq, descale_k=dk, descale_v=dv, causal=causal)
    providers = {
        "triton-fp8": partial(flash_attention_fp8, q8, k8, v8, **fp8),
        "triton-fp8 Vt": partial(flash_attention_fp8, q8, k8, vt, **fp8),
        "triton-bf16": partial(flash_attention, *bf, causal=causal),
        "sdpa-flash": partial(_sdpa(SDPBackend.FLASH_ATTENTION), *bf, causal),
        "sdpa-cudnn": partial(_sdpa(SDPBackend.CUDNN_ATTENTION), *bf, causal),
    }
    rows = []
    for name, fn in providers.items():
        tf = _report(f"{name} N={n} causal={causal}", flops, fn)
        if tf is not None:
            rows.append(TimeRow(name, n, causal, flops / tf / 1e9, tf))
    return rows


SWEEP = [
    Fp8Config(128, 64, 4, 3), Fp8Config(128, 64, 8, 3), Fp8Config(128, 128, 8, 3),
    Fp8Config(128, 128, 8, 2), Fp8Config(128, 128, 4, 3), Fp8Config(64, 128, 4, 3),
    Fp8Config(256, 64, 8, 3), Fp8Config(256, 128, 16, 2), Fp8Config(128, 256, 8, 2),
]  # fmt: skip


def sweep(n: int = 4096, d: int = 128) -> None:
    """Launch configurations at one shape, both V layouts, causal or not (tuning aid)."""
    _, (q8, k8, v8, vt), ds, flops = _fp8_inputs(n, d, 16)
    for causal in (False, True):
        for cfg in SWEEP:
            for lay, vv in (("V", v8), ("Vt", vt)):
                run = partial(
                    launch_fp8, q8, k8, vv, ds, causal=causal, scale=d**-0.5,
                    out_dtype=torch.bfloat16, config=cfg,
                )  # fmt: skip
                f = flops * (0.5 if causal else 1.0)
                _report(f"sweep causal={causal} {lay} {tuple(cfg[:4])}", f, run)


CHECKS = [
    # (B, Hq, Hk, Nq, Nk, d, causal)
    (2, 4, 4, 128, 128, 64, False),
    (2, 4, 2, 128, 128, 64, True),
    (1, 4, 4, 1000, 1000, 128, False),
    (1, 8, 2, 1000, 1537, 128, True),
    (1, 4, 4, 4096, 4096, 128, False),
    (1, 4, 4, 4096, 4096, 128, True),
    (1, 4, 2, 4096, 4096, 64, True),
    (1, 2, 2, 333, 2048, 96, False),
    (1, 2, 1, 517, 1030, 256, True),
    (1, 2, 2, 256, 777, 256, False),
    (1, 2, 1, 300, 117, 64, True),  # Nq > Nk: rows that keep no key (O = 0, LSE = -inf)
]


def _step(name, fn, *args):
    t0 = time.time()
    try:
        out = fn(*args)
        print(f"== {name}: done in {time.time() - t0:.1f} s", flush=True)
        return out
    except Exception:
        print(f"== {name}: ERROR\n{traceback.format_exc()}", flush=True)
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="skip the sweep and the N = 8K point")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # the emulation's fp32 products in fp32
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    import triton

    print(f"triton {triton.__version__}; {fp8_sdpa_api()}", flush=True)
    probe = _step("cast probe", cast_probe)
    checks = [r for i, s in enumerate(CHECKS) if (r := _step(f"check {s}", check_shape, s, i))]
    t3 = _step("Table 3", table3) or []
    dots = _step("dot probe", dot_probe) or []
    variants = _step("accumulation variants", variant_probe) or []
    if not args.quick:
        _step("sweep N=4096", sweep)
    times: list[TimeRow] = []
    for causal in (False, True):
        for n in (1024, 2048, 4096, 16384) if args.quick else (1024, 2048, 4096, 8192, 16384):
            times += _step(f"time N={n} causal={causal}", time_shape, n, causal) or []
    summary(probe, checks, t3, times, dots, variants)


def summary(probe, checks, t3, times, dots, variants) -> None:
    print("\n## FP8 forward: correctness (O in bf16; errors vs float64 on the dequantized inputs)")
    print(f"{probe}")
    cols = (
        "| shape | RMSE | max err | emulation RMSE | kernel-emulation RMSE | identical | LSE err |"
    )
    print(cols + " status |\n" + "|---" * 8 + "|")
    for r in checks:
        cells = (r.shape, f"{r.rmse:.3e}", f"{r.max_err:.3e}", f"{r.emu_rmse:.3e}")
        cells += (f"{r.dist:.3e}", f"{r.same:.4f}", f"{r.lse_err:.1e}", r.status)
        print("| " + " | ".join(cells) + " |")
    print("\n## Accumulation (Hopper fp8 tensor cores)")
    print("\n".join(dots))
    print("| variant | causal | kernel-emulation RMSE / emulation RMSE | identical | TFLOP/s |")
    print("|---|---|---|---|---|")
    print("\n".join(variants))
    print("\n## FA3 Table 3 (N = 4096, d = 128, RMSE vs float64 on the unquantized inputs)")
    print(PAPER)
    for name, e in t3:
        print(f"| {name} | {e:.2e} |")
    print("\n## Forward TFLOP/s (B·N = 16K, H = 16, d = 128; (x): vs sdpa-cudnn bf16)")
    print(
        "| provider | causal | " + " | ".join(f"N={n}" for n in sorted({t.n for t in times})) + " |"
    )
    ns = sorted({t.n for t in times})
    print("|---|---|" + "---|" * len(ns))
    by = {(t.provider, t.causal, t.n): t.tflops for t in times}
    for causal in (False, True):
        for p in ("triton-fp8", "triton-fp8 Vt", "triton-bf16", "sdpa-flash", "sdpa-cudnn"):
            cells = []
            for n in ns:
                v = by.get((p, causal, n))
                ref = by.get(("sdpa-cudnn", causal, n))
                cells.append(
                    "–" if v is None else f"{v:.0f}" + (f" ({v / ref:.2f}x)" if ref else "")
                )
            print(f"| {p} | {causal} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

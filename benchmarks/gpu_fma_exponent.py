"""The forward's exponent as one fused multiply-add per score (``LaunchConfig.fma_exponent``)
against the exact form, on one CUDA GPU.

    bash benchmarks/gpu_fma_exponent.sh        (stages flashcheck from this tree, 175 s cap)
    python benchmarks/gpu_fma_exponent.py [--reps 20] [--json out.json] [--dry-run]

bf16 and fp16, d = 64 and 128, causal and not, N = 1K, 4K, 16K (``B·N = 16K`` tokens,
``H·d = 2048``, as benchmarks/tune_hopper.py): the default launch configuration of each shape
with ``fma_exponent`` off and on, CUDA events, median of ``--reps`` runs after warm-up, the two
interleaved. Every output, off and on, is checked against float64 torch attention at 256 query
rows of every head (O in floored ulps of the input format, LSE relative to max(1, |LSE|)).
Then the saved cases whose scores reach ~1e12 (reports/samples/h200-triton/cases, FAIL-HARD
before the exact form) are judged by flashcheck with the fast path on. The prediction is
printed first, the table last.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
from pathlib import Path

from flashcheck.harness.bench.timing import time_interleaved

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "reports" / "samples" / "h200-triton" / "cases"
DEVICE = "cuda"  # "cpu" under TRITON_INTERPRET=1 for a dry run of the checks (no timing)
# Cases at scores ~1e12 (every key block takes the exact form): inf/NaN with the old
# contracted exponent; d758b16864aa8317 is a tf32 case.
REPLAYS = {"45ff678771b15e80": False, "a0b776c65a2e1719": False, "d758b16864aa8317": True}

# SASS of the mask-free key loop for sm_90 (benchmarks/ptx_count.py --sass [--fma], bf16,
# d = 128, Triton 3.9, the H100 tiles): (scores per thread, instructions per thread per key
# block off, on, and on's exact branch, which a fast block skips: 2 per score + 2).
SASS = {"non-causal": (64, 759, 867, 130), "causal": (32, 449, 518, 66)}
PREDICTION = (
    "prediction: the fast form saves one instruction per score (an fma for a sub and a mul)\n"
    "and adds per key block a reduction over the tile's rows (is every |m·c| < 2^14?): shuffles,\n"
    "a shared-memory round trip and one CTA barrier. SASS of the mask-free loop per score,\n"
    "off -> on (executed): "
    + "; ".join(f"{k} {a / n:.2f} -> {(b - x) / n:.2f}" for k, (n, a, b, x) in SASS.items())
    + ".\nExpect on/off time 0.97-1.00 non-causal (d = 128; d = 64 alike), 0.99-1.03 causal:\n"
    "the barrier may cost more than the ~3 % of instructions saved. The exact form cost 6-7 %\n"
    "against the unguarded fma (H200), the most the fast form could win back."
)


def _reference(q, k, v, causal, rows):
    """float64 attention at query ``rows`` of every head: (O, LSE, Σ p·|v|)."""
    import torch

    q64, k64, v64 = (t.double() for t in (q, k, v))
    s = q64[:, :, rows] @ k64.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        cols = torch.arange(k.shape[2], device=q.device)
        s = s.masked_fill(cols[None, :] > rows[:, None], float("-inf"))
    p = torch.softmax(s, -1)
    return p @ v64, torch.logsumexp(s, -1), p @ v64.abs()


def _check(out, ref, rows, mant):
    """(max floored ulps of O, max LSE error relative to max(1, |LSE|)); the ulp is that of the
    larger of |O| and W = Σ p·|v| (where a row's average cancels, the error is measured
    against the terms that made it), ``mant`` fraction bits (bf16 7, fp16 10)."""
    import torch

    o_ref, lse_ref, w = ref
    if not isinstance(out, tuple):  # a peer's O alone: no LSE to compare (reported as 0)
        out = (out, None)
    o = out[0][:, :, rows].double()
    mag = torch.maximum(o_ref.abs(), w).clamp_min(1e-30)
    ulp = torch.exp2(torch.floor(torch.log2(mag)) - mant)
    if out[1] is None:
        return ((o - o_ref).abs() / ulp).max().item(), 0.0
    lse = out[1][:, :, rows].double()
    return (
        ((o - o_ref).abs() / ulp).max().item(),
        ((lse - lse_ref).abs() / lse_ref.abs().clamp_min(1)).max().item(),
    )


def _untimed(fns, *, reps):
    """The dry run's timer: it checks the script on the CPU, not the speed (no CUDA events)."""
    return [1.0] * len(fns)


# Experiments only (the ceilings a cheaper design could reach; wrong at huge logits), as
# source patches of kernels/triton_flash.py: (text, replacement, fma_exponent flag).
PATCHES = {
    # The fast path without its per-block test: every block fast, whatever |m·c|.
    "fma-unguarded": ("if tl.max(tl.abs(mc), 0) < 16384.0:", "if True:", True),
    # The default path's exponent as one fma against fl(m·c), no residual state, no test:
    # what a per-program test (decided once, before the key loop) could reach.
    "fma-no-residual": (
        "x = (s - m_safe[:, None]) * qk_scale",
        "x = tl.fma(s, qk_scale, -(m_safe * qk_scale)[:, None])",
        False,
    ),
}


def load_patched(label: str, tmp: Path):
    """The forward with :data:`PATCHES`' ``label`` applied, as its own module (so Triton
    compiles and caches it apart): ``fn(q, k, v, causal) -> O`` at the default launch
    configuration."""
    old, new, fma = PATCHES[label]
    src = (ROOT / "kernels" / "triton_flash.py").read_text()
    assert src.count(old) == 1, f"{label}: the patched line moved; update PATCHES"
    name = "triton_flash_" + label.replace("-", "_")
    path = tmp / f"{name}.py"
    path.write_text(src.replace(old, new))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)

    def fn(q, k, v, causal):
        cfg = mod.launch_config(q, k, v, causal=causal)._replace(fma_exponent=fma)
        opts = {"window": None, "scale": q.shape[-1] ** -0.5, "allow_tf32": False}
        return mod.launch(q, k, v, causal=causal, config=cfg, **opts)[0]

    return fn


def load_peer(spec_text: str):
    """``PATH.py:FUNCTION``: a peer forward ``fn(q, k, v, *, causal) -> O`` to time beside
    (its folder goes on sys.path, so it may import its neighbours)."""
    path, _, name = spec_text.rpartition(":")
    folder = str(Path(path).resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    fn = getattr(mod, name)
    return getattr(fn, "fn", fn)  # a flashcheck.kernel-decorated function: the bare one


def _shape(tf, dt, d, causal, n, reps, timer, *, tokens=16384, width=2048, extra=()):
    """Time and check one shape with the fast path off and on (``B = tokens/N``,
    ``H = width/d``), then each of ``extra`` (``(label, fn(q, k, v, causal) -> O)``, timed in
    the same interleaved rounds, checked the same way, LSE not compared): a row for the
    table."""
    import torch

    b, h = max(1, tokens // n), max(1, width // d)
    g = torch.Generator(device=DEVICE).manual_seed(n + d + causal)
    q, k, v = (torch.randn(b, h, n, d, device=DEVICE, generator=g, dtype=dt) for _ in range(3))
    cfg = tf.launch_config(q, k, v, causal=causal)
    opts = {"causal": causal, "window": None, "scale": d**-0.5, "allow_tf32": False}
    fns = [
        lambda c=c: tf.launch(q, k, v, config=c, **opts)
        for c in (cfg, cfg._replace(fma_exponent=True))
    ]
    rows = torch.randperm(n, generator=torch.Generator().manual_seed(n))[:256].sort().values
    rows = rows.to(DEVICE)
    ref = _reference(q, k, v, causal, rows)
    mant = 7 if dt == torch.bfloat16 else 10
    outs, regs = [], []
    for f in fns:
        outs.append(f())
        kern = tf.last_compiled()  # registers and spills: did the branch cost the pipeline?
        regs.append(f"{getattr(kern, 'n_regs', '?')}/{getattr(kern, 'n_spills', '?')}")
    checks = [_check(o, ref, rows, mant) for o in outs]
    diff = (outs[0][0].float() - outs[1][0].float()).abs().max().item()
    labels = []
    for label, peer in extra:
        f = lambda peer=peer: peer(q, k, v, causal)  # noqa: E731
        o = f()
        checks.append(_check(o, ref, rows, mant))
        fns.append(f)
        labels.append(label)
    ok = all(u <= 4 and e <= 1e-4 for u, e in checks)
    ms = timer(fns, reps=reps)
    flops = 4 * b * h * n * n * d / (2 if causal else 1)
    return {
        "dtype": str(dt).split(".")[-1], "d": d, "causal": causal, "n": n,
        "config": f"{cfg.block_m}x{cfg.block_n} w{cfg.warps} s{cfg.stages}",
        "ms": ms, "tflops": [flops / t / 1e9 for t in ms], "checks": checks,
        "off_on_max_diff": diff, "ok": ok, "regs_spills": regs, "extra": labels,
    }  # fmt: skip


def _replays(tf, device="cuda", ids=None):
    """Each saved ~1e12 case judged by flashcheck with the fast path on: (id, verdict, why)."""
    import flashcheck

    out = []
    for cid, tf32 in (REPLAYS if ids is None else ids).items():
        case = flashcheck.load_case(cid, CASES)

        def fn(q, k, v, *, causal, window, scale, tf32=tf32):
            win = None if window is None else tuple(-1 if w is None else w for w in window)
            sc = q.shape[-1] ** -0.5 if scale is None else float(scale)
            cfg = tf.launch_config(q, k, v, causal=causal)._replace(fma_exponent=True)
            return tf.launch(
                q, k, v, causal=causal, window=win, scale=sc, allow_tf32=tf32, config=cfg
            )

        kern = flashcheck.kernel(
            fn, name="triton-fma", arithmetic="tf32" if tf32 else "flash", devices=(device,)
        )
        opts = case.options()
        res = flashcheck.check(kern, case.q, case.k, case.v, device=device, save="never", **opts)
        out.append((cid, str(res.verdict.verdict), "; ".join(res.verdict.reasons)[:160]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--sizes", default="1024,4096,16384")
    ap.add_argument("--json", default="")
    ap.add_argument(
        "--patched",
        action="append",
        default=[],
        choices=list(PATCHES),
        help="also time this experimental source patch (see PATCHES)",
    )
    ap.add_argument(
        "--peer",
        action="append",
        default=[],
        metavar="PATH.py:FUNCTION",
        help="also time this forward fn(q, k, v, *, causal) -> O (fp16 shapes only)",
    )
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="on CPU under TRITON_INTERPRET=1: fp16, tiny shapes, no timing (tests the script)",
    )
    args = ap.parse_args(argv)
    import torch

    global DEVICE
    named = {"bf16": torch.bfloat16, "fp16": torch.float16}
    dtypes, size, timer = tuple(named[x] for x in args.dtypes.split(",")), {}, time_interleaved
    if args.dry_run:
        DEVICE, dtypes, size = "cpu", (torch.float16,), {"tokens": 64, "width": 128}
        args.sizes = "64"
        timer = _untimed

    from flashcheck.kernels import triton_flash as tf

    print(PREDICTION, flush=True)
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (dry run)"
    print(f"device: {name}, torch {torch.__version__}", flush=True)
    extra = []
    if args.patched:
        import tempfile

        tmp = Path(tempfile.mkdtemp())
        extra += [(label, load_patched(label, tmp)) for label in args.patched]
    peers = []
    for spec in args.peer:
        fn = load_peer(spec)
        peers.append(
            (Path(spec.rpartition(":")[0]).stem, lambda q, k, v, c, fn=fn: fn(q, k, v, causal=c))
        )
    rows_out = []
    for dt in dtypes:
        for d in (int(x) for x in args.dims.split(",")):
            for causal in (False, True):
                for n in (int(x) for x in args.sizes.split(",")):
                    more = extra + (peers if dt == torch.float16 else [])
                    row = _shape(tf, dt, d, causal, n, args.reps, timer, extra=more, **size)
                    rows_out.append(row)
                    print(json.dumps(row), flush=True)
    # The interpreter has no tf32 and a broken bf16 dot: the dry run replays the fp32 case.
    dry = {"a0b776c65a2e1719": False}
    replays = _replays(tf, DEVICE, dry if args.dry_run else None)
    for r in replays:
        print("replay", *r, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows_out, "replays": replays}, indent=1))
    print(
        "\n| dtype | d | causal | N | config | off TFLOP/s | on TFLOP/s | on/off time "
        "| O ulps off, on | LSE err off, on | max abs(off − on) | regs/spills off, on | check |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows_out:
        (uo, eo), (un, en) = r["checks"][:2]
        print(
            f"| {r['dtype']} | {r['d']} | {'yes' if r['causal'] else 'no'} | {r['n']} | "
            f"{r['config']} | {r['tflops'][0]:.0f} | {r['tflops'][1]:.0f} | "
            f"{r['ms'][1] / r['ms'][0]:.3f} | {uo:.2f}, {un:.2f} | {eo:.1e}, {en:.1e} | "
            f"{r['off_on_max_diff']:.2e} | {', '.join(r['regs_spills'])} | "
            f"{'ok' if r['ok'] else 'FAILED'} |"
        )
    if any(r["extra"] for r in rows_out):
        print("\n| dtype | d | causal | N | kernel | TFLOP/s | time / off | time / on | O ulps |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in rows_out:
            for i, label in enumerate(r["extra"], start=2):
                print(
                    f"| {r['dtype']} | {r['d']} | {'yes' if r['causal'] else 'no'} | {r['n']} | "
                    f"{label} | {r['tflops'][i]:.0f} | {r['ms'][i] / r['ms'][0]:.3f} | "
                    f"{r['ms'][i] / r['ms'][1]:.3f} | {r['checks'][i][0]:.2f} |"
                )
    print("\n| saved case (scores ~1e12), fast path on | verdict | reasons |\n|---|---|---|")
    for cid, verdict, why in replays:
        print(f"| {cid} | {verdict} | {why or '-'} |")
    bad = sum(not r["ok"] for r in rows_out) + sum(v != "PASS" for _, v, _ in replays)
    print(f"\n{bad} check(s) failed" if bad else "\nall checks passed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

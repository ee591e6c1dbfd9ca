"""This tree's Triton forward and backward against another revision's, on one CUDA GPU: are the
bits the same, and how do the times compare, the two timed in turn.

    python3 benchmarks/gpu_ab_revision.py --old-dir DIR [--reps 20] [--json out.json]

``DIR`` holds the other revision's ``triton_flash.py`` and ``triton_flash_bwd.py`` (for example
``git show REV:kernels/triton_flash.py > DIR/triton_flash.py``; the GPU machine has no git
history). The other backward imports this tree's forward helpers, as its file does. Shapes:
forward fp16, d = 64 (H = 32) and d = 128 (H = 16), B·N = 16K, N = 1K, 4K, 16K, causal and not
(the tutorial race's shapes); backward bf16, d = 128, the same N, plain and soft-capped (cap 2,
the approximate tanh), deterministic. Per shape both revisions run on the same inputs; their
outputs are compared bit for bit (O and LSE; dQ, dK, dV), then timed with CUDA events, medians
of ``--reps`` runs, the two interleaved in a shuffled order each round
(:func:`~flashcheck.harness.bench.timing.time_interleaved`). Prints new / old per shape (below
1: this tree is faster) and exits 1 if any output differs in a bit.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
from functools import partial
from pathlib import Path

from flashcheck.harness.bench.timing import time_interleaved

ROOT = Path(__file__).resolve().parents[1]
TOKENS = 16384  # B·N


def load(path: Path, name: str):
    """The kernel file ``path`` imported as module ``name`` (its own name, so Triton compiles
    and caches it apart from this tree's)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def same_bits(xs, ys) -> bool:
    import torch

    return all(
        torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8))
        for x, y in zip(xs, ys, strict=True)
    )


def forward_rows(new, old, reps: int) -> list[dict]:
    import torch

    rows = []
    for d, h in ((128, 16), (64, 32)):
        for causal in (False, True):
            for n in (1024, 4096, 16384):
                b = TOKENS // n
                q, k, v = (
                    torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in "qkv"
                )
                # (launch takes allow_tf32 without a default; False is the strict setting,
                # and these inputs (here and in the backward below) are fp16 or bf16, for which
                # it changes nothing)
                kw = dict(causal=causal, window=None, scale=d**-0.5, allow_tf32=False)
                a, o = new.launch(q, k, v, **kw), old.launch(q, k, v, **kw)
                t_new, t_old = time_interleaved(
                    [partial(new.launch, q, k, v, **kw), partial(old.launch, q, k, v, **kw)],
                    reps=reps,
                )
                rows.append(
                    dict(pass_="fwd", dtype="fp16", d=d, n=n, causal=causal, option="none",
                         same=same_bits(a, o), new_ms=t_new, old_ms=t_old)
                )  # fmt: skip
                print(_line(rows[-1]), flush=True)
    return rows


def backward_rows(fwd, new, old, reps: int) -> list[dict]:
    import torch

    rows = []
    d, h = 128, 16
    for cap in (None, 2.0):
        for causal in (False, True):
            for n in (1024, 4096, 16384):
                b = TOKENS // n
                q, k, v, do = (
                    torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in "qkvd"
                )
                fkw = dict(causal=causal, window=None, scale=d**-0.5, allow_tf32=False)
                o, lse = fwd.launch(q, k, v, softcap=cap, approx_tanh=cap is not None, **fkw)[:2]
                kw = dict(fkw, softcap=cap, approx_tanh=cap is not None)
                a = new.launch_backward(q, k, v, o, lse, do, **kw)
                z = old.launch_backward(q, k, v, o, lse, do, **kw)
                t_new, t_old = time_interleaved(
                    [
                        partial(new.launch_backward, q, k, v, o, lse, do, **kw),
                        partial(old.launch_backward, q, k, v, o, lse, do, **kw),
                    ],
                    reps=reps,
                )
                rows.append(
                    dict(pass_="bwd", dtype="bf16", d=d, n=n, causal=causal,
                         option="none" if cap is None else "softcap 2 (approx tanh)",
                         same=same_bits(a, z), new_ms=t_new, old_ms=t_old)
                )  # fmt: skip
                print(_line(rows[-1]), flush=True)
    return rows


def _line(r: dict) -> str:
    return (
        f"| {r['pass_']} | {r['dtype']} | {r['d']} | {r['n']} | {'yes' if r['causal'] else 'no'} "
        f"| {r['option']} | {'yes' if r['same'] else 'NO'} | {r['old_ms']:.3f} | "
        f"{r['new_ms']:.3f} | {r['new_ms'] / r['old_ms']:.3f} |"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old-dir", type=Path, required=True, help="the other revision's kernels")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", type=Path, help="write the rows here")
    ap.add_argument("--skip", choices=("fwd", "bwd"), help="leave one pass out")
    args = ap.parse_args(argv)
    for f in ("triton_flash.py", "triton_flash_bwd.py"):
        if not (args.old_dir / f).is_file():
            ap.error(f"--old-dir must hold {f}; {args.old_dir / f} is missing")
    import torch

    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    from flashcheck.kernels import triton_flash, triton_flash_bwd

    tmp = Path(tempfile.mkdtemp())
    olds = {}
    for f, name in (("triton_flash.py", "fwd_old"), ("triton_flash_bwd.py", "bwd_old")):
        (tmp / f"{name}.py").write_text((args.old_dir / f).read_text())
        olds[name] = load(tmp / f"{name}.py", name)
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    print("| pass | dtype | d | N | causal | option | same bits | old ms | new ms | new/old |")
    print("|---|---|---|---|---|---|---|---|---|---|", flush=True)
    rows = []
    if args.skip != "fwd":
        rows += forward_rows(triton_flash, olds["fwd_old"], args.reps)
    if args.skip != "bwd":
        rows += backward_rows(triton_flash, triton_flash_bwd, olds["bwd_old"], args.reps)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    bad = [r for r in rows if not r["same"]]
    print(f"{len(rows)} shapes, {len(bad)} with different bits")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())

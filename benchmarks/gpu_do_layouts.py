"""The Triton backward's gradients with dO expanded (stride 0) and strided, against the same
values of dO contiguous, bit for bit, for this tree's kernel and an earlier copy of it:

    python3 benchmarks/gpu_do_layouts.py --against-file OLD_triton_flash_bwd.py [--budget S]

(``PYTHONPATH`` holding flashcheck, e.g. after ``python3 benchmarks/source_tree.py /tmp/fc``.)
On a GPU (CPU: ``--device cpu`` under ``TRITON_INTERPRET=1``). Shapes: the H200 report's failing
case (B = 2, Hq = 4, Hk = 2, N = 64, d = 40, causal, fp16) and a few beside it. Prints, per
configuration and kernel, how many elements of dQ, dK, dV differ from the contiguous run; exits
1 if this tree's kernel differs anywhere. Past ``--budget`` seconds no new configuration starts.
"""

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bitwise_forward import load_module  # noqa: E402


def _layouts(do, dev):
    """``{name: dO in that layout}`` holding the values of ``do`` (contiguous)."""
    import torch

    big = torch.full((*do.shape[:-1], do.shape[-1] + 24), float("nan"), dtype=do.dtype, device=dev)
    big[..., 8 : 8 + do.shape[-1]] = do
    return {"strided": big[..., 8 : 8 + do.shape[-1]], "expanded": do[:1, :1, :1].expand(do.shape)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against-file", type=Path, help="an earlier kernels/triton_flash_bwd.py")
    ap.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    ap.add_argument("--budget", type=float, default=150.0)
    args = ap.parse_args(argv)
    import torch

    from flashcheck.kernels.triton_flash import flash_attention

    kernels = {"this": load_module(ROOT / "kernels" / "triton_flash_bwd.py", "bwd_this")}
    if args.against_file is not None:
        kernels["old"] = load_module(args.against_file, "bwd_old")
    dev = args.device
    configs = [  # (dtype, b, hq, hk, n, d, causal)
        (torch.float16, 2, 4, 2, 64, 40, True),
        (torch.float16, 2, 4, 2, 64, 40, False),
        (torch.bfloat16, 2, 4, 2, 64, 40, True),
        (torch.float16, 2, 4, 2, 64, 128, True),
        (torch.bfloat16, 2, 4, 2, 1000, 64, False),
        (torch.bfloat16, 2, 4, 4, 1000, 128, True),
    ]
    if dev == "cpu":
        configs = [(torch.float16, 2, 4, 2, 33, 16, True), (torch.float32, 2, 2, 2, 40, 24, False)]
    t0 = time.monotonic()
    print("| dtype | B, Hq, Hk, N, d | causal | kernel | expanded: dQ, dK, dV | strided |")
    print("|---|---|---|---|---|---|")
    bad = 0
    for dt, b, hq, hk, n, d, causal in configs:
        if time.monotonic() - t0 > args.budget:
            print(f"(budget of {args.budget:.0f} s spent: later configurations not run)")
            break
        g = torch.Generator().manual_seed(n * d)
        q = torch.randn(b, hq, n, d, generator=g).to(dt).to(dev)
        k = torch.randn(b, hk, n, d, generator=g).to(dt).to(dev)
        v = torch.randn(b, hk, n, d, generator=g).to(dt).to(dev)
        do = torch.randn(b, hq, n, d, generator=g).to(dt).to(dev)
        do = do[:1, :1, :1].expand(do.shape).contiguous()  # one row's values everywhere
        o, lse = flash_attention(q, k, v, causal=causal)
        for name, mod in kernels.items():
            cells = []
            base = mod.flash_attention_backward(q, k, v, o, lse, do, causal=causal)
            for x in _layouts(do, dev).values():
                got = mod.flash_attention_backward(q, k, v, o, lse, x, causal=causal)
                same = [(a == c) | (a.isnan() & c.isnan()) for a, c in zip(base, got, strict=True)]
                diff = [int((~m).sum()) for m in same]
                cells.append(", ".join(map(str, diff)))
                bad += name == "this" and any(diff)
            shape = f"{b}, {hq}, {hk}, {n}, {d}"
            print(f"| {str(dt)[6:]} | {shape} | {causal} | {name} | {cells[0]} | {cells[1]} |")
    verdict = "differs" if bad else "bitwise equal"
    print(f"{time.monotonic() - t0:.0f} s; this tree's kernel: {verdict}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

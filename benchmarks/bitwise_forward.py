"""Is this tree's Triton forward bit for bit the one of another revision?

    TRITON_INTERPRET=1 python benchmarks/bitwise_forward.py --against REV
    python benchmarks/bitwise_forward.py --against-file OLD.py --device cuda

loads ``kernels/triton_flash.py`` as of git revision ``REV`` (or the file ``OLD.py``, on a
machine without the git history) beside this tree's and runs both with their default launch
configurations. On the CPU (interpreter): 240 small configurations: fp16 and fp32; ragged
lengths (Nq ≠ Nk, tails that are not a multiple of the tile); causal, sliding windows (left,
right, both) and neither; a positive and a negative scale; no option, a soft-cap, sinks; one
query row NaN; three query heads on one key head for every other shape (grouped heads); in the
second batch entry inf and NaN in V's first two columns, which reach rows that keep no key
(causal with Nq > Nk, windows) as 0·inf and 0·NaN in P·V. On a GPU (``--device cuda``, the compiled
kernels with the GPU's own launch tables): fp16 and bf16, d = 64 and 128 (or ``--dims``), Nq =
1000 and 2048 against Nk = 2048, the same masks, positive scale, no option (with ``--options``
also a soft-cap of 2 and sinks). Prints the configurations whose O or LSE differ in any bit,
and exits 1 if any does. For changes meant to move no bit (a cheaper mask, a refactor).
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_module(path: Path, name: str):
    """The Python file ``path`` imported as a module named ``name`` (a kernel file of another
    revision beside this tree's)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--against", help="git revision to compare with")
    which.add_argument("--against-file", type=Path, help="a copy of the other triton_flash.py")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--dims", default="64,128", help="with --device cuda: the head dims")
    ap.add_argument(
        "--options", action="store_true", help="with --device cuda: also a soft-cap and sinks"
    )
    args = ap.parse_args(argv)
    import numpy as np
    import torch

    tmp = Path(tempfile.mkdtemp()) / "triton_flash_other.py"
    if args.against_file is not None:
        tmp.write_text(args.against_file.read_text())
    else:
        src = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{args.against}:kernels/triton_flash.py"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        tmp.write_text(src)
    new = load_module(ROOT / "kernels" / "triton_flash.py", "triton_flash_this")
    old = load_module(tmp, "triton_flash_other")
    torch.manual_seed(0)
    dev = args.device
    if dev == "cuda":
        shapes = [(nq, 2048, int(d)) for nq in (1000, 2048) for d in args.dims.split(",")]
        dtypes, scales = (torch.float16, torch.bfloat16), (None,)
        options = [(None, None)]
        if args.options:
            options += [(2.0, None), (None, torch.randn(3))]
    else:
        shapes = [(37, 53, 16), (64, 40, 32), (33, 33, 16), (70, 130, 16)]
        dtypes, scales = (torch.float16, torch.float32), (None, -0.3)
        options = [(None, None), (2.0, None), (None, torch.randn(3))]
    n = bad = 0
    for i, (nq, nk, d) in enumerate(shapes):
        hk = 1 if dev == "cpu" and i % 2 else 3
        for dt in dtypes:
            q = (torch.randn(2, 3, nq, d) * 3).to(dt).to(dev)
            k = (torch.randn(2, hk, nk, d) * 3).to(dt).to(dev)
            v = torch.randn(2, hk, nk, d).to(dt).to(dev)
            q[0, 0, 5] = float("nan")
            if dev == "cpu":
                # whole columns, so that every row block's keys carry them; only those two
                # columns of O lose their bits to inf and NaN
                v[1, :, :, 0] = float("inf")
                v[1, :, :, 1] = float("nan")
            for causal, window in [
                (True, None), (False, (5, 3)), (True, (7, -1)), (False, (-1, 2)), (False, None)
            ]:  # fmt: skip
                for scale in (d**-0.5 if sc is None else sc for sc in scales):
                    for cap, sinks in options:
                        if sinks is not None:
                            sinks = sinks.to(dev)
                        kw = dict(
                            causal=causal, window=window, scale=scale, allow_tf32=False,
                            softcap=cap, sinks=sinks,
                        )  # fmt: skip
                        with np.errstate(all="ignore"), warnings.catch_warnings():
                            warnings.simplefilter("ignore", RuntimeWarning)
                            a, b = new.launch(q, k, v, **kw), old.launch(q, k, v, **kw)
                        n += 1
                        same = all(
                            torch.equal(
                                x.cpu().contiguous().view(torch.uint8),
                                y.cpu().contiguous().view(torch.uint8),
                            )
                            for x, y in zip(a, b, strict=True)
                        )
                        if not same:
                            bad += 1
                            print("differs:", dict(nq=nq, nk=nk, d=d, dtype=dt, **kw))
    print(f"{n} configurations, {bad} differ in some bit of O or LSE")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

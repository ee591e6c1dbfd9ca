"""Can a kernel keep one tensor-core product in flight while the softmax of another runs, in
Triton's lower-level Gluon dialect? A probe compiled for sm_90 on a machine without a GPU.

    python benchmarks/gluon_wait_probe.py

The kernel issues Sᵀ = k·qᵀ and dPᵀ = v·doᵀ asynchronously (``warpgroup_mma(..., is_async=True)``),
waits for Sᵀ alone (``warpgroup_mma_wait(num_outstanding=1)``), takes exp2 of it, and only then
waits for dPᵀ (``num_outstanding=0``, with the exponentials passed through the wait as ``deps``).
This is the overlap the soft-capped backward needs (benchmarks/RESULTS.md). The script prints
where the two waits (``WARPGROUP.DEPBAR.LE gsb0, N``) land among the exponentials
(``MUFU.EX2``) in the SASS: if the second wait comes after all of them, the source order
survived ``ptxas``. Needs Triton >= 3.6 (Gluon with ``warpgroup_mma``) and its bundled tools.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)


@gluon.jit
def probe(K, Q, V, DO, Out, N, num_warps: gl.constexpr):
    BN: gl.constexpr = 64
    BM: gl.constexpr = 128
    D: gl.constexpr = 128
    blk: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    mma: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 128, 16]
    )
    sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    rn = gl.arange(0, BN, layout=gl.SliceLayout(1, blk))
    rm = gl.arange(0, BM, layout=gl.SliceLayout(1, blk))
    cd = gl.arange(0, D, layout=gl.SliceLayout(0, blk))
    k_s = gl.allocate_shared_memory(
        gl.bfloat16, [BN, D], sl, gl.load(K + rn[:, None] * D + cd[None, :])
    )
    v_s = gl.allocate_shared_memory(
        gl.bfloat16, [BN, D], sl, gl.load(V + rn[:, None] * D + cd[None, :])
    )
    q_s = gl.allocate_shared_memory(gl.bfloat16, [BM, D], sl)
    do_s = gl.allocate_shared_memory(gl.bfloat16, [BM, D], sl)
    acc = gl.zeros([BN, BM], gl.float32, layout=mma)
    for start in range(0, N, BM):
        q_s.store(gl.load(Q + (start + rm)[:, None] * D + cd[None, :]))
        do_s.store(gl.load(DO + (start + rm)[:, None] * D + cd[None, :]))
        fence_async_shared()
        zero = gl.zeros([BN, BM], gl.float32, layout=mma)
        s = warpgroup_mma(k_s, q_s.permute((1, 0)), zero, use_acc=False, is_async=True)
        dp = warpgroup_mma(v_s, do_s.permute((1, 0)), zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
        p = gl.exp2(s * 0.0883883 - 1.0)
        dp, p = warpgroup_mma_wait(num_outstanding=0, deps=(dp, p))
        acc = acc + p * dp
    ro = gl.arange(0, BN, layout=gl.SliceLayout(1, mma))
    co = gl.arange(0, BM, layout=gl.SliceLayout(0, mma))
    gl.store(Out + ro[:, None] * BM + co[None, :], acc)


def main() -> int:
    from triton.tools.disasm import get_sass

    sig = {
        "K": "*bf16", "Q": "*bf16", "V": "*bf16", "DO": "*bf16", "Out": "*fp32", "N": "i32",
        "num_warps": "constexpr",
    }  # fmt: skip
    src = GluonASTSource(probe, sig, constexprs={"num_warps": 4})
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    ex2 = 0
    waits = []
    for line in get_sass(ck.asm["cubin"]).splitlines():
        if "MUFU.EX2" in line:
            ex2 += 1
        elif "WARPGROUP.DEPBAR.LE" in line:
            waits.append((line.split("DEPBAR.LE")[1].strip().rstrip(";"), ex2))
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    version = subprocess.run([ptxas, "--version"], capture_output=True, text=True).stdout
    release = version.strip().splitlines()[-2] if version.strip() else "ptxas version unknown"
    print(f"triton {triton.__version__} ({release}): {ex2} exponentials in the loop body")
    for arg, before in waits:
        print(f"  wait {arg}: after {before} of them")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

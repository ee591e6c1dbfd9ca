"""The call times an autotuned Triton kernel shows the contract probe (run on a GPU):
first and repeated calls of the shapes a compiling kernel's probe uses, then what the probe
itself infers. ``python benchmarks/probe_autotuned_times.py`` (PYTHONPATH as for
benchmarks/gpu_autotuned.sh)."""

import time

import torch
import user_triton_autotuned as u

from flashcheck.harness.adapters.probe import probe
from flashcheck.harness.adapters.registry import as_kernel

DT = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def call(dtype, nq, nk, d, dv=None):
    dv = dv or d
    q = torch.randn(1, 1, nq, d, device="cuda", dtype=DT[dtype])
    k = torch.randn(1, 1, nk, d, device="cuda", dtype=DT[dtype])
    v = torch.randn(1, 1, nk, dv, device="cuda", dtype=DT[dtype])
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    u.attn(q, k, v)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


torch.zeros(1, device="cuda")  # the CUDA context outside the timings
shapes = [
    ("fp16", 16, 16, 64),
    ("fp16", 16, 16, 64),
    ("bf16", 16, 16, 64),
    ("fp32", 16, 16, 64),
    ("fp16", 16, 17, 64),
    ("fp16", 17, 16, 64),
    ("fp16", 16, 16, 64, 128),
    ("fp16", 16, 16, 128),
    ("fp16", 64, 64, 64),
    ("fp16", 129, 129, 128),
    ("fp16", 129, 129, 128),
]
for s in shapes:
    print("shape", s, f"{call(*s):.3f} s", flush=True)
t0 = time.perf_counter()
k = probe(as_kernel("user_triton_autotuned:attn_batch_bug"), "cuda")
print(
    f"probe (in process, warm) {time.perf_counter() - t0:.1f} s:", k.compile_keys, k.compile_seconds
)

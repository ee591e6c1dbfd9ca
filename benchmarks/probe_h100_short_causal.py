"""One test case of tests/test_triton_flash.py (1x2x1, Nq 40, Nk 17, d 72, dv 24, causal, fp16)
under the forward's launch configurations for short causal keys, against the oracle: which
configuration breaks it, and how (run on a GPU)."""

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import flashcheck
from flashcheck.kernels.triton_flash import LaunchConfig, launch, launch_config

g = torch.Generator().manual_seed(1 + 2 + 1 + 40 + 17 + 72 + 24)
q = torch.randn(1, 2, 40, 72, generator=g).half()
k = torch.randn(1, 1, 17, 72, generator=g).half()
v = torch.randn(1, 1, 17, 24, generator=g).half()
print(
    torch.cuda.get_device_name(),
    "default:",
    launch_config(q.cuda(), k.cuda(), v.cuda(), causal=True),
)
for cfg in (
    LaunchConfig(128, 64, 8, 2, maxnreg=128),
    LaunchConfig(64, 64, 4, 3),
    LaunchConfig(64, 64, 4, 3, split=False),
    LaunchConfig(64, 64, 4, 2),
    LaunchConfig(128, 64, 4, 3),
):
    o, lse = launch(
        q.cuda(),
        k.cuda(),
        v.cuda(),
        causal=True,
        window=None,
        scale=72**-0.5,
        allow_tf32=False,
        config=cfg,
    )

    def fn(q, k, v, *, causal=False, cfg=cfg):
        return launch(
            q, k, v, causal=causal, window=None, scale=72**-0.5, allow_tf32=False, config=cfg
        )

    res = flashcheck.check(
        flashcheck.kernel(fn, arithmetic="flash", name=str(tuple(cfg)[:4])),
        q.cuda(),
        k.cuda(),
        v.cuda(),
        causal=True,
        save="never",
    )
    bad = np.argwhere(~np.isfinite(o.float().cpu().numpy()))
    print(tuple(cfg), res.verdict.verdict, res.verdict.reasons[:2], "nonfinite", len(bad))

"""Run the probe case once with one launch configuration given on the command line."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashcheck.kernels.triton_flash import launch

cfg = tuple(int(x) for x in sys.argv[1].split(","))
g = torch.Generator().manual_seed(0)
q = torch.randn(1, 2, 40, 72, generator=g).half().cuda()
k = torch.randn(1, 1, 17, 72, generator=g).half().cuda()
v = torch.randn(1, 1, 17, 24, generator=g).half().cuda()
o, _ = launch(q, k, v, causal=True, window=None, scale=72**-0.5, allow_tf32=False, config=cfg)
torch.cuda.synchronize()
kk, vv = k.double().repeat_interleave(2, 1), v.double().repeat_interleave(2, 1)
s = (q.double() @ kk.transpose(-1, -2)) * 72**-0.5
i, j = torch.arange(40, device="cuda")[:, None], torch.arange(17, device="cuda")[None, :]
s = s.masked_fill(~(j <= i - 23), float("-inf"))
p = torch.softmax(s, -1).nan_to_num(0.0)
err = float((o.double() - p @ vv).abs().max())
print(cfg, "max abs err vs float64:", err)

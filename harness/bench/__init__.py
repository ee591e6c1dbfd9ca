"""``flashcheck bench``: GPU speed and memory of attention forwards, side by side, checked.

:mod:`~flashcheck.harness.bench.timing` (CUDA-event timing),
:mod:`~flashcheck.harness.bench.providers` (the forwards compared),
:mod:`~flashcheck.harness.bench.ceilings` (matmul and copy rates of the
machine),
:mod:`~flashcheck.harness.bench.check` (oracle check of sampled outputs),
:mod:`~flashcheck.harness.bench.suite` (the plan and the resumable run),
:mod:`~flashcheck.harness.bench.summary` (results read back,
verdicts), :mod:`~flashcheck.harness.bench.render` and
:mod:`~flashcheck.harness.bench.figures` (bench.md, bench.json, PNGs). docs/bench.md is the user
guide.
"""

"""``flashcheck bench``: GPU speed and memory of attention forwards, side by side, checked.

:mod:`~harness.bench.timing` (CUDA-event timing), :mod:`~harness.bench.providers` (the
forwards compared), :mod:`~harness.bench.ceilings` (matmul and copy rates of the machine),
:mod:`~harness.bench.check` (oracle check of sampled outputs), :mod:`~harness.bench.suite`
(the plan and the resumable run), :mod:`~harness.bench.summary` (results read back,
verdicts), :mod:`~harness.bench.render` and
:mod:`~harness.bench.figures` (bench.md, bench.json, PNGs). docs/bench.md is the user guide.
"""

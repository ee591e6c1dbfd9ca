"""``flashcheck bench``: GPU speed and memory of attention forwards and backwards, side by side
with their peers, checked against the oracle.

:mod:`~flashcheck.harness.bench.timing` (CUDA-event timing),
:mod:`~flashcheck.harness.bench.providers` (the kernels compared),
:mod:`~flashcheck.harness.bench.ceilings` (matmul and copy rates of the machine),
:mod:`~flashcheck.harness.bench.check` and :mod:`~flashcheck.harness.bench.grad_check` (oracle
checks of sampled outputs and gradients), :mod:`~flashcheck.harness.bench.shapes` (the shapes
of a run), :mod:`~flashcheck.harness.bench.measure` (one shape on every provider),
:mod:`~flashcheck.harness.bench.suite` (the resumable run),
:mod:`~flashcheck.harness.bench.benchrecords` (the results file's records as types),
:mod:`~flashcheck.harness.bench.summary` (ratios to the peers, the correctness tally),
:mod:`~flashcheck.harness.bench.render`, :mod:`~flashcheck.harness.bench.tables`,
:mod:`~flashcheck.harness.bench.backward_tables` and :mod:`~flashcheck.harness.bench.figures`
(bench.md, bench.json, PNGs). docs/bench.md is the user guide.
"""

"""Attention implementations judged by the harness (imports nothing from harness/properties).

- :mod:`flashcheck.kernels.recurrence`: numpy online-softmax recurrence with a declared precision
policy;
- :mod:`flashcheck.kernels.naive`: standard attention, same-precision baselines (numpy emulation,
torch).

See docs/kernels.md for each kernel's algorithm, arithmetic class and limits.
"""

"""Attention inputs: the exact :class:`~flashcheck.harness.cases.case.Case`, the adversarial
input families, and the case files failures are saved to."""

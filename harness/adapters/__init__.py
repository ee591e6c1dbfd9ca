"""Kernels as the harness sees them: the contract, built-in and library kernels, the registry
of specs, contract probing, and the isolated worker that runs a kernel under a time limit."""

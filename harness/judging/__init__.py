"""Judging a kernel's output: error metrics, a-priori bounds, verdicts, the check every test and
report runs, structural properties and replay of saved cases."""

"""The mpmath oracle: exact attention outputs with certified bounds, in strict (interval mpmath)
and fast (exact products, compensated sums, Ziv fallback) modes (docs/oracle.md)."""

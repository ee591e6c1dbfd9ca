"""Hypothesis strategies and property tests of attention kernels (the property-suite issue)."""

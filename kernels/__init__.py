"""Attention implementations judged by the harness (imports nothing from harness/properties).

The kernels themselves arrive with the kernels issue; this package exists so the distribution
layout (harness, kernels, properties) is in place from the start.
"""

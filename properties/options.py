"""The command-line options and ini settings the plugin adds to pytest (group ``flashcheck``).

``--flashcheck-kernel SPEC`` (repeatable; ini ``flashcheck_kernels``) names the kernels under
test; ``--flashcheck-dtype`` and ``--flashcheck-device`` narrow what runs;
``--flashcheck-nan-inputs`` sets the NaN policy of kernels that declare none, and
``--flashcheck-arithmetic`` their arithmetic class;
``--flashcheck-budget`` runs the properties that find bugs first within a time budget;
``--flashcheck-timeout`` limits each call of a kernel under test;
``--flashcheck-palette`` sets the compile keys per dtype of kernels that compile per shape;
``--flashcheck-profile`` (ini ``flashcheck_profile``) picks the Hypothesis profile.
"""

from __future__ import annotations

import pytest

from ..harness.judging.classes import WIDE_CLASSES
from .profiles import PROFILES

__all__ = ["DEFAULT_TIMEOUT", "add_options"]

DEFAULT_TIMEOUT = 300.0  # seconds per kernel call, as `flashcheck report --timeout`


def add_options(parser: pytest.Parser) -> None:
    """Add flashcheck's options to ``parser`` (pytest's ``pytest_addoption`` hook)."""
    group = parser.getgroup("flashcheck", "flashcheck: attention-kernel numerics")
    group.addoption(
        "--flashcheck-kernel",
        action="append",
        dest="flashcheck_kernels",
        metavar="SPEC",
        help="kernel under test: a built-in name, 'builtin' (the project's own kernels), an "
        "entry point of group flashcheck.kernels or package.module:function; repeatable",
    )
    group.addoption(
        "--flashcheck-dtype",
        action="append",
        dest="flashcheck_dtypes",
        choices=("fp16", "bf16", "fp32"),
        help="only this input format; repeatable (default: the kernel's)",
    )
    group.addoption(
        "--flashcheck-device",
        dest="flashcheck_device",
        choices=("cpu", "cuda"),
        help="device for kernels that run on several (default: cuda if available)",
    )
    group.addoption(
        "--flashcheck-nan-inputs",
        dest="flashcheck_nan_inputs",
        choices=("propagate", "any"),
        help="NaN policy of kernels declaring none: 'any' accepts finite outputs where a NaN "
        "input is involved as a convention (default: propagate)",
    )
    group.addoption(
        "--flashcheck-arithmetic",
        dest="flashcheck_arithmetic",
        choices=WIDE_CLASSES,
        help="arithmetic class of kernels declaring none, so that its error bounds apply "
        "(default: unknown, held to the input format's precision)",
    )
    group.addoption(
        "--flashcheck-budget",
        dest="flashcheck_budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="a time budget: the properties that find bugs first run first; those not started "
        "when it is spent are skipped with that reason",
    )
    group.addoption(
        "--flashcheck-timeout",
        dest="flashcheck_timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help="seconds one call of a kernel under test may take before it is stopped and its "
        f"property fails with TIMEOUT, the case saved (default {DEFAULT_TIMEOUT:g})",
    )
    group.addoption(
        "--flashcheck-palette",
        dest="flashcheck_palette",
        type=int,
        default=None,
        metavar="N",
        help="compile keys per dtype for kernels that compile per shape: their lengths, head "
        "dims and causal flag come from N combinations (default 4)",
    )
    group.addoption(
        "--flashcheck-profile",
        dest="flashcheck_profile",
        choices=PROFILES,
        help="Hypothesis profile for the run (default: $FLASHCHECK_PROFILE, else Hypothesis' own)",
    )
    parser.addini(
        "flashcheck_kernels",
        type="args",
        default=[],
        help="kernels under test when --flashcheck-kernel is not given",
    )
    parser.addini(
        "flashcheck_profile",
        type="string",
        default="",
        help="Hypothesis profile when neither --flashcheck-profile nor "
        "$FLASHCHECK_PROFILE is given",
    )

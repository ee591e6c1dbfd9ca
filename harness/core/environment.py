"""The version of flashcheck and of everything that can change a numerical result.

Recorded in case files, result logs and reports, so a result can be traced to the libraries and
the machine that produced it.
"""

from __future__ import annotations

import importlib
import os
import platform
import sys
from typing import Any

__all__ = ["__version__", "environment", "environment_record"]

__version__ = "0.2.0"


def environment() -> dict[str, str]:
    """Versions of everything that can change a numerical result, for reports and case files."""
    env = {"flashcheck": __version__, "python": platform.python_version()}
    for mod in ("numpy", "mpmath", "gmpy2", "ml_dtypes", "hypothesis", "torch", "triton"):
        try:
            env[mod] = getattr(importlib.import_module(mod), "__version__", "?")
        except ImportError:
            env[mod] = "not installed"
    import mpmath.libmp

    env["mpmath backend"] = mpmath.libmp.BACKEND
    env["machine"] = f"{platform.system()} {platform.machine()}"
    return env


def environment_record(device: str) -> dict[str, Any]:
    """:func:`environment` plus the device, the GPU and the command line: what a report prints."""
    env: dict[str, Any] = dict(environment())
    env["device"] = device
    env["triton interpreter"] = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    try:
        import torch

        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name()
            env["cuda"] = torch.version.cuda
            env["cudnn"] = str(torch.backends.cudnn.version())
    except ImportError:  # torch is optional for the oracle alone
        pass
    env["cpu count"] = os.cpu_count()
    env["argv"] = " ".join(sys.argv)
    return env

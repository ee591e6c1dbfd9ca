"""Which version of each kernel's source a campaign's results came from, so that resuming a
campaign after a kernel was edited does not pass off the old code's results as the new code's.

Each run of a campaign records, in its session record, a digest of the file that defines each
kernel's function. A resumed run compares them with the files as they are now and refuses to go
on when one changed (``--fresh`` recomputes, ``--name`` starts a report beside it).
"""

from __future__ import annotations

import hashlib
import inspect
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..adapters.adapter import Kernel
from ..core.resultlog import ResultLogError

__all__ = ["ENV_KEY", "check_unchanged", "source_digests"]

# The key of the session record's environment that holds {kernel spec: "file digest"}.
ENV_KEY = "kernel sources"


def _source_file(kernel: Kernel) -> Path | None:
    """The file that defines the kernel's function (through decorators), or None (a builtin,
    a function made at run time)."""
    fn = getattr(kernel.fn, "fn", kernel.fn)  # a Triton JITFunction wraps its Python function
    try:
        found = inspect.getsourcefile(inspect.unwrap(fn))
    except TypeError:
        return None
    return Path(found) if found else None


def source_digests(kernels: Mapping[str, Kernel]) -> dict[str, str]:
    """``{spec: "FILE sha256:HEX16"}`` for each kernel whose defining file can be read."""
    out = {}
    for spec, kernel in kernels.items():
        path = _source_file(kernel)
        try:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path else None
        except OSError:
            digest = None
        if digest is not None:
            out[spec] = f"{path.name} sha256:{digest}"
    return out


def check_unchanged(records: Sequence[Mapping[str, Any]], digests: Mapping[str, str], path) -> None:
    """Raise :class:`ResultLogError` when a kernel's source differs from the one the last run
    recorded in ``records`` (a results file's; files without the record resume as before)."""
    recorded: dict[str, str] = {}
    for r in records:
        if r.get("type") == "session":
            recorded.update((r.get("env") or {}).get(ENV_KEY) or {})
    changed = [s for s, d in digests.items() if s in recorded and recorded[s] != d]
    if not changed:
        return
    # Results carry a status; contracts and case files name a kernel too but are not results.
    counts = Counter(r.get("kernel") for r in records if "status" in r)
    which = "; ".join(
        f"{s} ({counts[s]} results; {recorded[s]} then, {digests[s]} now)" for s in changed
    )
    raise ResultLogError(
        f"{path} holds results of a kernel whose source has changed since: {which}. "
        "They would not describe the code as it is now: pass --fresh to recompute the "
        "campaign, or --name NAME for a new report beside it"
    )

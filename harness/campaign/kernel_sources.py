"""Which version of each kernel's source a campaign's results came from, so that resuming a
campaign after a kernel was edited does not pass off the old code's results as the new code's.

Each run of a campaign records, in its session record, a digest of every source file of each
kernel: the file that defines its function and the modules loaded from the same project (the
folder of its top-level package, or of its own module when it has none; for flashcheck's own
kernels, the ``kernels`` folder). A resumed run compares the files both runs know with the
files as they are now and refuses to go on when one changed (``--fresh`` recomputes,
``--name`` starts a report beside it). It compares before probing the kernels and again after
(a module the kernel imports on its first call is loaded only then).
"""

from __future__ import annotations

import hashlib
import inspect
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..adapters.adapter import Kernel
from ..core.resultlog import ResultLogError, read_records

__all__ = ["ENV_KEY", "check_results_file", "check_unchanged", "checked_digests", "source_digests"]

# The key of the session record's environment: {kernel spec: {file: "sha256:HEX16"}}.
ENV_KEY = "kernel sources"
_OWN = Path(__file__).resolve().parents[2]  # the flashcheck package


def _defining_file(kernel: Kernel) -> tuple[Path, str] | None:
    """The file that defines the kernel's function (through decorators) and its module's name,
    or None (a builtin, a function made at run time)."""
    fn = inspect.unwrap(getattr(kernel.fn, "fn", kernel.fn))  # (a Triton JIT function's)
    try:
        found = inspect.getsourcefile(fn)
    except TypeError:
        return None
    if not found:
        return None
    return Path(found).resolve(), getattr(fn, "__module__", "") or ""


def _project(path: Path, module: str) -> Path:
    """The folder whose loaded modules count as the kernel's sources."""
    if path.is_relative_to(_OWN):
        return _OWN / "kernels"
    top = sys.modules.get(module.split(".")[0])
    init = getattr(top, "__file__", None)
    if init and Path(init).name == "__init__.py":
        return Path(init).resolve().parent
    return path.parent


def _files(path: Path, module: str) -> tuple[Path, list[Path]]:
    """(the folder names are shown relative to, the kernel's source files)."""
    root = _project(path, module)
    files = {path}
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None)
        if f and f.endswith(".py"):
            p = Path(f).resolve()
            if p.is_relative_to(root):
                files.add(p)
    # Names relative to the folder holding the package (or to the module's own folder).
    base = root if root == path.parent and not (root / "__init__.py").exists() else root.parent
    return base, sorted(files)


def _name(p: Path, base: Path) -> str:
    return str(p.relative_to(base)) if p.is_relative_to(base) else p.name


def source_digests(kernels: Mapping[str, Kernel]) -> dict[str, dict[str, str]]:
    """``{spec: {file: "sha256:HEX16"}}`` for each kernel whose defining file can be read."""
    out: dict[str, dict[str, str]] = {}
    for spec, kernel in kernels.items():
        found = _defining_file(kernel)
        if found is None:
            continue
        base, files = _files(*found)
        digests = {}
        # (the defining file first: a refusal tells it from the other files of its folder)
        for p in sorted(files, key=lambda f: f != found[0]):
            try:
                digest = hashlib.sha256(p.read_bytes()).hexdigest()[:16]
            except OSError:
                continue
            digests[_name(p, base)] = f"sha256:{digest}"
        if digests:
            out[spec] = digests
    return out


def check_unchanged(
    records: Sequence[Mapping[str, Any]], digests: Mapping[str, Mapping[str, str]], path
) -> None:
    """Raise :class:`ResultLogError` when a source file of a kernel differs from the one the
    last run recorded in ``records`` (a results file's; files without the record, and files
    only one of the two runs loaded, are not compared)."""
    recorded: dict[str, dict[str, str]] = {}
    for r in records:
        if r.get("type") == "session":
            for spec, files in ((r.get("env") or {}).get(ENV_KEY) or {}).items():
                if isinstance(files, Mapping):  # (a string: this record's first form)
                    recorded[spec] = dict(files)
    changed: dict[str, list[str]] = {}
    others = False  # a changed file is not the kernel's own but one of its folder's
    for spec, files in digests.items():
        old = recorded.get(spec, {})
        own = next(iter(files), None)
        diff = []
        for f, d in files.items():
            if f in old and old[f] != d:
                mine = "its own file " if f == own else "its folder's "
                others |= f != own
                diff.append(f"{mine}{f} ({old[f]} then, {d} now)")
        if diff:
            changed[spec] = diff
    if not changed:
        return
    # Results carry a status; contracts and case files name a kernel too but are not results.
    counts = Counter(r.get("kernel") for r in records if "status" in r)
    which = "; ".join(
        f"{spec} ({counts[spec]} results): {', '.join(diff)}" for spec, diff in changed.items()
    )
    # (a user's unchanged kernel was refused for a neighbour's edit, and read that its own
    # source had changed)
    why = (
        " (a kernel's sources are its file and the modules loaded from its folder or package, "
        "which it may import at any time; a kernel in a folder of its own is compared with its "
        "own modules alone)"
        if others
        else ""
    )
    raise ResultLogError(
        f"{path} holds results of a kernel whose sources have changed since: {which}{why}. "
        "They would not describe the code as it is now: pass --fresh to recompute the "
        "campaign, or --name NAME for a new report beside it"
    )


def check_results_file(path: Path, kernels: Mapping[str, Kernel], *, fresh: bool) -> None:
    """:func:`check_unchanged` on the results file at ``path``, if there is one to resume
    (before the kernels are probed, so that a refusal costs no probing)."""
    if not fresh and path.exists() and path.stat().st_size:
        check_unchanged(read_records(path), source_digests(kernels), path)


def checked_digests(log: Any, kernels: Mapping[str, Kernel]) -> dict[str, dict[str, str]]:
    """:func:`source_digests` for the session record of a run writing to ``log`` (a
    ``ResultLog``), checked against the runs on file: again after the probe, since a module
    the kernel imports on its first call is loaded only then."""
    digests = source_digests(kernels)
    check_unchanged(log.records, digests, log.path)
    return digests

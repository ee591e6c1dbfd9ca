"""Saved failing cases: ``<dir>/<id>.json`` (the record) + ``<id>.npz`` (exact bit patterns).

A case is saved before its failure propagates, so nothing is lost if the run is interrupted.
Both files are written to a temporary name in the same directory and renamed into place
(atomic on POSIX); the ``.npz`` goes first and the ``.json`` records its SHA-256, so a record
always points at complete, verified data. The id is a hash of the kernel, the inputs and the
options: saving the same failure twice writes the same files.

The directory is ``$FLASHCHECK_CASE_DIR`` if set, else ``reports/cases`` under the current
directory. Replaying needs only these two files, numpy and the kernel: not Hypothesis, not its
example database.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..core.environment import environment
from ..core.fp8 import DESCALES
from .case import CASE_DTYPES, Case

__all__ = [
    "SCHEMA",
    "CaseFileError",
    "atomic_write",
    "case_dir",
    "case_id",
    "case_path",
    "load_case",
    "save_case",
    "saved_case",
]

SCHEMA = "flashcheck-case/1"


class CaseFileError(ValueError):
    """A case file is missing, corrupted, or not a flashcheck case."""


def case_dir(directory: str | os.PathLike | None = None) -> Path:
    if directory is not None:
        return Path(directory)
    return Path(os.environ.get("FLASHCHECK_CASE_DIR", "reports/cases"))


def _options_json(case: Case) -> dict[str, Any]:
    out = {
        "causal": bool(case.causal),
        "window": None if case.window is None else list(case.window),
        "scale": case.scale,
        "has_mask": case.mask is not None,
    }
    # Only where set, so that the cases without them keep their ids (float32 values are
    # exact as JSON numbers: Python writes the shortest repr that reads back to the double).
    if case.softcap is not None:
        out["softcap"] = case.softcap
    if case.sinks is not None:
        out["sinks"] = [float(x) for x in case.sinks]
    for name, d in case.descales.items():  # FP8 cases: float32 values, exact as JSON numbers
        out[name] = [[float(x) for x in row] for row in d]
    return out


def case_id(case: Case, kernel: str, prop: str | None = None) -> str:
    """Content hash of (kernel, dtype, input bits, mask, options) and of the property that
    saved it, if not the accuracy check: 16 hex digits. (One case failing two properties is
    two files, each replaying its own check.)"""
    h = hashlib.sha256()
    if prop not in (None, "accuracy"):  # (accuracy cases keep the ids they always had)
        h.update(b"property" + prop.encode())
    h.update(kernel.encode())
    h.update(case.dtype.encode())
    for name in ("q", "k", "v"):
        x = case.bits(name)
        h.update(str(x.shape).encode())
        h.update(x.tobytes())
    if case.mask is not None:
        h.update(np.packbits(case.mask).tobytes() + str(case.mask.shape).encode())
    if case.do is not None:  # (cases without dO keep the ids they always had)
        h.update(b"do" + np.ascontiguousarray(case.do).tobytes())
    if case.do_layout != "contiguous":
        h.update(b"do_layout" + case.do_layout.encode())
    h.update(json.dumps(_options_json(case), sort_keys=True).encode())
    return h.hexdigest()[:16]


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file renamed into place."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # mkstemp creates the file 0600; a case file is shared like any other (0666 - umask).
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_case(
    case: Case,
    *,
    kernel: str,
    device: str,
    verdict: dict[str, Any] | None = None,
    context: dict[str, Any] | None = None,
    directory: str | os.PathLike | None = None,
) -> str:
    """Write the case atomically and return its id (see the module docstring)."""
    out = case_dir(directory)
    out.mkdir(parents=True, exist_ok=True)
    cid = case_id(case, kernel, (context or {}).get("property"))
    buf = io.BytesIO()
    arrays = {name: case.bits(name) for name in ("q", "k", "v")}
    if case.mask is not None:
        arrays["mask"] = np.ascontiguousarray(case.mask)
    if case.do is not None:
        arrays["do"] = np.ascontiguousarray(case.do).view(case.bits("q").dtype)
    np.savez_compressed(buf, **arrays)
    data = buf.getvalue()
    atomic_write(out / f"{cid}.npz", data)
    record = {
        "schema": SCHEMA,
        "id": cid,
        "kernel": kernel,
        "device": device,
        "dtype": case.dtype,
        "shape": dict(zip(("B", "Hq", "Hk", "Nq", "Nk", "d", "dv"), case.shape, strict=True)),
        "options": _options_json(case),
        "do_layout": case.do_layout,
        "family": case.family,
        "seed": case.seed,
        "params": case.params,
        "description": case.describe(),
        "verdict": verdict,
        "context": context or {},
        "environment": environment(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "npz_sha256": hashlib.sha256(data).hexdigest(),
        "replay": f"flashcheck replay {cid}",
    }
    text = json.dumps(record, indent=2, sort_keys=False, default=repr)
    atomic_write(out / f"{cid}.json", text.encode())
    return cid


def case_path(ref: str, directory: str | os.PathLike | None) -> Path:
    """The ``.json`` record of case ``ref``: an id under :func:`case_dir`, or a path. With no
    directory given, an id not found there is looked for in the reports' own case folders
    (``reports/<name>/cases``, where ``flashcheck report`` saves them): if it is in one, that
    is the case; in several, :class:`CaseFileError` names them."""
    p = Path(ref)
    if p.suffix in (".json", ".npz") or p.exists():
        return p.with_suffix(".json")
    path = case_dir(directory) / f"{ref}.json"
    if not path.exists() and directory is None and "FLASHCHECK_CASE_DIR" not in os.environ:
        found = sorted(Path("reports").glob(f"*/cases/{ref}.json"))
        if len(found) == 1:
            return found[0]
        if found:
            # (a user read "no case file" for an id saved by three reports)
            dirs = ", ".join(str(f.parent) for f in found)
            raise CaseFileError(
                f"case {ref} was saved by {len(found)} reports ({dirs}): pick one with --dir, "
                f"e.g. --dir {found[0].parent} (in Python: load_case({ref!r}, directory))"
            )
    return path


def load_case(ref: str, directory: str | os.PathLike | None = None) -> tuple[Case, dict[str, Any]]:
    """Load a case by id or path; raise :class:`CaseFileError` with the reason if it is bad."""
    path = case_path(ref, directory)
    if not path.exists():
        where = str(case_dir(directory))
        if directory is None and "FLASHCHECK_CASE_DIR" not in os.environ:
            where += " or reports/<name>/cases"  # (case_path looks there too)
        raise CaseFileError(
            f"no case file {path}: pass an id saved under {where} (or set FLASHCHECK_CASE_DIR "
            "/ --dir), or a path to <id>.json"
        )
    try:
        record = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CaseFileError(f"{path} is not a flashcheck case file (invalid JSON: {err})") from None
    if not isinstance(record, dict) or record.get("schema") != SCHEMA:
        found = record.get("schema") if isinstance(record, dict) else type(record).__name__
        raise CaseFileError(
            f"{path} is not a flashcheck case file: schema {found!r}, expected {SCHEMA!r}"
        )
    for key in ("id", "kernel", "dtype", "options", "npz_sha256", "shape"):
        if key not in record:
            raise CaseFileError(f"{path} lacks the field {key!r}; the record is incomplete")
    npz = path.with_suffix(".npz")
    if not npz.exists():
        raise CaseFileError(f"{npz} is missing: a case needs both its .json and its .npz")
    data = npz.read_bytes()
    if hashlib.sha256(data).hexdigest() != record["npz_sha256"]:
        raise CaseFileError(
            f"{npz} does not match the checksum in {path.name}: the data is corrupted or from "
            "another case"
        )
    if record["dtype"] not in CASE_DTYPES:
        raise CaseFileError(f"{path}: unknown dtype {record['dtype']!r}")
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = {name: z[name] for name in z.files}
        opts = record["options"]
        case = Case.from_bits(
            record["dtype"],
            arrays["q"],
            arrays["k"],
            arrays["v"],
            causal=bool(opts["causal"]),
            window=None if opts["window"] is None else tuple(opts["window"]),
            mask=arrays.get("mask"),
            scale=opts["scale"],
            softcap=opts.get("softcap"),
            sinks=None if opts.get("sinks") is None else np.array(opts["sinks"], np.float32),
            **{n: np.array(opts[n], np.float32) for n in DESCALES if opts.get(n) is not None},
            family=record.get("family", "manual"),
            seed=record.get("seed"),
            params=record.get("params") or {},
        )
        if "do" in arrays:
            case.do = np.ascontiguousarray(arrays["do"]).view(CASE_DTYPES[record["dtype"]])
        case.do_layout = record.get("do_layout", "contiguous")
        case.__post_init__()  # checks dO's shape, dtype and layout
    except (KeyError, ValueError, OSError) as err:
        raise CaseFileError(f"{npz}: cannot rebuild the case ({err})") from None
    shape = dict(zip(("B", "Hq", "Hk", "Nq", "Nk", "d", "dv"), case.shape, strict=True))
    if shape != record["shape"]:
        raise CaseFileError(f"{path}: arrays have shape {shape}, the record says {record['shape']}")
    return case, record


def saved_case(ref: str, directory: str | os.PathLike | None = None) -> Case:
    """The case saved as ``ref`` (an id, or a path to ``<id>.json``), rebuilt bit for bit:
    ``flashcheck.load_case``. Its record (kernel, verdict, environment, the replay command) is
    in ``<id>.json``; ``flashcheck replay <id>`` re-runs the check it was saved for."""
    return load_case(ref, directory)[0]

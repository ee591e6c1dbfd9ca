"""Saved ragged cases: ``<id>.json`` (the record) + ``<id>.npz`` (exact bit patterns and index
tensors), written and verified as dense cases are (:mod:`flashcheck.harness.cases.store`).

The ``.npz`` holds each float input's bit patterns as unsigned ints (its format in the record)
and each index tensor as int32; the record holds the layout, the options and the SHA-256 of the
``.npz``. The id is a hash of the kernel, the layout, every tensor and the options.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..core.environment import environment
from .case import DTYPES, Case
from .ragged import BITS, FLOATS, INDEX, RaggedCase, format_name
from .store import CaseFileError, atomic_write, case_dir, case_path, saved_case

__all__ = [
    "RAGGED_SCHEMA",
    "is_ragged_case",
    "load_ragged_case",
    "ragged_case_id",
    "save_ragged_case",
    "saved_any_case",
]

RAGGED_SCHEMA = "flashcheck-ragged-case/1"


def _options_json(case: RaggedCase) -> dict[str, Any]:
    return {
        "causal": bool(case.causal),
        "window": None if case.window is None else list(case.window),
        "scale": case.scale,
    }


def _formats(case: RaggedCase) -> dict[str, str]:
    return {name: format_name(x) for name, x in case.tensors.items()}


def ragged_case_id(case: RaggedCase, kernel: str) -> str:
    """Content hash of (kernel, layout, tensors' bits and formats, index tensors, options)."""
    h = hashlib.sha256()
    h.update(f"{kernel}\0{case.layout}".encode())
    for name in FLOATS[case.layout]:
        x = case.bits(name)
        h.update(f"{name}{x.shape}{_formats(case)[name]}".encode() + x.tobytes())
    for name in INDEX[case.layout]:
        x = np.ascontiguousarray(case.index[name], dtype=np.int32)
        h.update(f"{name}{x.shape}".encode() + x.tobytes())
    h.update(json.dumps(_options_json(case), sort_keys=True).encode())
    return h.hexdigest()[:16]


def save_ragged_case(
    case: RaggedCase,
    *,
    kernel: str,
    device: str,
    verdict: dict[str, Any] | None = None,
    context: dict[str, Any] | None = None,
    directory: str | os.PathLike | None = None,
    gradient_verdict: dict[str, Any] | None = None,
) -> str:
    """Write ``case`` atomically (``.npz`` first, then the record) and return its id.
    ``verdict``: the accuracy check's; ``gradient_verdict``: the gradient check's.

    The same case failing several checks (one Hypothesis draw, several properties) is one
    file: a second save adds its property to the record's and keeps the verdicts recorded
    before (a user followed an accuracy failure's replay command and read "saved by
    sequence-independence", the last property saved)."""
    out = case_dir(directory)
    out.mkdir(parents=True, exist_ok=True)
    cid = ragged_case_id(case, kernel)
    context = dict(context or {})
    before = _record(out / f"{cid}.json")
    if isinstance(before, dict) and before.get("schema") == RAGGED_SCHEMA:
        old = before.get("context") or {}
        props = [p for p in str(old.get("property", "")).split(", ") if p]
        for p in str(context.get("property", "")).split(", "):
            if p and p not in props:
                props.append(p)
        if props:
            context["property"] = ", ".join(props)
        verdict = verdict if verdict is not None else before.get("verdict")
        if gradient_verdict is None:
            gradient_verdict = before.get("gradient_verdict")
    arrays = {name: case.bits(name) for name in FLOATS[case.layout]}
    arrays.update({name: np.asarray(x, dtype=np.int32) for name, x in case.index.items()})
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    data = buf.getvalue()
    atomic_write(out / f"{cid}.npz", data)
    record = {
        "schema": RAGGED_SCHEMA,
        "id": cid,
        "kernel": kernel,
        "device": device,
        "layout": case.layout,
        "formats": _formats(case),
        "shapes": {name: list(x.shape) for name, x in {**case.tensors, **case.index}.items()},
        "options": _options_json(case),
        "family": case.family,
        "seed": case.seed,
        "params": case.params,
        "description": case.describe(),
        "verdict": verdict,
        "gradient_verdict": gradient_verdict,
        "context": context,
        "environment": environment(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "npz_sha256": hashlib.sha256(data).hexdigest(),
        "replay": f"flashcheck replay {cid}",
    }
    text = json.dumps(record, indent=2, default=repr)
    atomic_write(out / f"{cid}.json", text.encode())
    return cid


def _record(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


def is_ragged_case(ref: str, directory: str | os.PathLike | None = None) -> bool:
    """Whether ``ref`` (an id or a path) names a saved ragged case."""
    record = _record(case_path(ref, directory))
    return isinstance(record, dict) and record.get("schema") == RAGGED_SCHEMA


def load_ragged_case(
    ref: str, directory: str | os.PathLike | None = None
) -> tuple[RaggedCase, dict[str, Any]]:
    """Load a ragged case by id or path, bit for bit; :class:`CaseFileError` says what is
    wrong with a missing, corrupted or foreign file."""
    path = case_path(ref, directory)
    record = _record(path)
    if not isinstance(record, dict) or record.get("schema") != RAGGED_SCHEMA:
        raise CaseFileError(f"{path} is not a ragged flashcheck case (schema {RAGGED_SCHEMA!r})")
    npz = path.with_suffix(".npz")
    if not npz.exists():
        raise CaseFileError(f"{npz} is missing: a case needs both its .json and its .npz")
    data = npz.read_bytes()
    if hashlib.sha256(data).hexdigest() != record.get("npz_sha256"):
        raise CaseFileError(
            f"{npz} does not match the checksum in {path.name}: the data is corrupted or from "
            "another case"
        )
    try:
        layout, formats, opts = record["layout"], record["formats"], record["options"]
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            tensors = {}
            for name in FLOATS[layout]:
                bits = np.ascontiguousarray(z[name])
                if bits.dtype != np.dtype(BITS[formats[name]]):
                    raise ValueError(f"{name} bits are {bits.dtype}, not {formats[name]}'s")
                tensors[name] = bits.view(DTYPES[formats[name]])
            index = {name: np.asarray(z[name], dtype=np.int32) for name in INDEX[layout]}
        case = RaggedCase(
            layout,
            tensors,
            index,
            causal=bool(opts["causal"]),
            window=None if opts["window"] is None else tuple(opts["window"]),
            scale=opts["scale"],
            family=record.get("family", "manual"),
            seed=record.get("seed"),
            params=record.get("params") or {},
        )
    except (KeyError, ValueError, TypeError, OSError) as err:
        raise CaseFileError(f"{npz}: cannot rebuild the case ({err})") from None
    return case, record


def saved_any_case(ref: str, directory: str | os.PathLike | None = None) -> Case | RaggedCase:
    """``flashcheck.load_case``: the case saved as ``ref`` (an id, or a path to
    ``<id>.json``), rebuilt bit for bit: a :class:`~flashcheck.harness.cases.case.Case`, or a
    :class:`RaggedCase` for a ragged layout or a merge."""
    if is_ragged_case(ref, directory):
        return load_ragged_case(ref, directory)[0]
    return saved_case(ref, directory)

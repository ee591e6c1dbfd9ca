"""An append-only JSONL file of campaign results that survives being killed at any instant.

Each record is one line of strict JSON (non-finite floats are written as the strings ``"nan"``,
``"inf"``, ``"-inf"``; :func:`num` reads them back), written with a single ``write`` and
flushed and fsynced before the campaign moves on. A process killed mid-write leaves at most
one torn last line; :meth:`ResultLog.open` drops it (truncating the file back to the last
complete line) and the campaign recomputes only that one result.

The first line is a header with the campaign's configuration. Re-opening a log with a different
configuration is refused: resuming must not mix two campaigns in one report.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

__all__ = ["SCHEMA", "ResultLog", "ResultLogError", "jsonable", "num", "read_records"]

SCHEMA = "flashcheck-results/1"


class ResultLogError(ValueError):
    """The results file cannot be used (not ours, corrupted, or another campaign's)."""


def jsonable(x: Any) -> Any:
    """``x`` with numpy scalars made Python and non-finite floats made strings."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [jsonable(v) for v in x]
    if hasattr(x, "item") and not isinstance(x, str):  # numpy scalar
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def num(x: Any) -> float:
    """A number written by :func:`jsonable` (``None`` reads as NaN)."""
    if x is None:
        return float("nan")
    return float(x)


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All complete records of a results file (a torn last line is ignored)."""
    records, _ = _scan(Path(path))
    if not records or records[0].get("schema") != SCHEMA:
        raise ResultLogError(f"{path} is not a flashcheck results file (schema {SCHEMA})")
    return records


def _scan(path: Path) -> tuple[list[dict[str, Any]], int]:
    """Records and the byte length of the complete lines."""
    data = path.read_bytes()
    records, good = [], 0
    for line in data.splitlines(keepends=True):
        if not line.endswith(b"\n"):
            break  # torn write: the process died mid-line
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            raise ResultLogError(
                f"{path}: line {len(records) + 1} is not JSON; the file is corrupted "
                "(use --fresh to start over)"
            ) from None
        good += len(line)
    return records, good


class ResultLog:
    """Append-only results; :attr:`records` holds everything read or written so far."""

    def __init__(self, path: Path, records: list[dict[str, Any]]) -> None:
        self.path = path
        self.records = records
        self._f = open(path, "ab")  # held open for the campaign's lifetime

    @classmethod
    def open(
        cls, path: str | os.PathLike, header: dict[str, Any], *, fresh: bool = False
    ) -> ResultLog:
        """Open (resume) or create the log at ``path``.

        ``header["config"]`` identifies the campaign; an existing file with another config is
        refused unless ``fresh`` (then it is replaced).
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if fresh or not path.exists() or path.stat().st_size == 0:
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(json.dumps(jsonable({"schema": SCHEMA, **header})) + "\n")
            os.replace(tmp, path)
        records, good = _scan(path)
        if good < path.stat().st_size:
            with open(path, "r+b") as f:
                f.truncate(good)
        _refuse_another(path, records, header)
        return cls(path, records)

    @staticmethod
    def check_resumable(
        path: str | os.PathLike, header: dict[str, Any], *, fresh: bool = False
    ) -> None:
        """Raise :class:`ResultLogError` now where :meth:`open` would refuse ``path`` (another
        campaign's results, or not a results file), so that a command can say so before its
        slow set-up (probing, compiling) rather than after."""
        path = Path(path)
        if fresh or not path.exists() or path.stat().st_size == 0:
            return
        _refuse_another(path, _scan(path)[0], header)

    def append(self, record: dict[str, Any]) -> None:
        """Write one record durably (one write, flush, fsync)."""
        rec = jsonable(record)
        line = (json.dumps(rec, separators=(",", ":")) + "\n").encode()
        self._f.write(line)
        self._f.flush()
        os.fsync(self._f.fileno())
        self.records.append(rec)

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> ResultLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _refuse_another(path: Path, records: list[dict[str, Any]], header: dict[str, Any]) -> None:
    if not records or records[0].get("schema") != SCHEMA:
        raise ResultLogError(f"{path} is not a flashcheck results file; use --fresh")
    old = records[0].get("config")
    new = jsonable(header.get("config"))
    if old != new:
        raise ResultLogError(
            f"{path} holds a campaign with another configuration ({_differences(old, new)}); "
            "re-run with the same options to resume it, or pass --name NAME for a new "
            "report beside it (--fresh replaces it)"
        )


def _differences(old: Any, new: Any) -> str:
    """``key: on file → asked`` for each setting that differs (the whole value otherwise)."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return f"{old!r} on file"
    keys = [k for k in dict.fromkeys([*old, *new]) if old.get(k) != new.get(k)]
    return "; ".join(f"{k}: {_shown(old.get(k))} on file, {_shown(new.get(k))} now" for k in keys)


def _shown(value: Any) -> str:
    """A setting as the refusal names it: ``None`` (not given) is the default."""
    return "the default" if value is None else repr(value)

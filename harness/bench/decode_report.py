"""The records of the decode benchmark and their markdown (``flashcheck bench --decode``).

One :class:`DecodeRecord` per (shape, provider): its median latency, the K/V bytes it had to
read and the bandwidth that makes, and the oracle verdicts of the sampled sequences; one
:class:`CopyCeiling` per measurement of the device copy bandwidth (before and after the
shapes). :func:`render_decode` turns a results file into ``bench-decode.md``.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..core.resultlog import read_records
from ..core.status import Status

__all__ = ["CopyCeiling", "DecodeRecord", "SequenceCheck", "load_decode", "render_decode"]


@dataclass(frozen=True)
class SequenceCheck:
    """The oracle verdict of one sampled sequence (its index, key count and query rows)."""

    sequence: int
    keys: int
    verdict: str
    max_ulp: float | None = None
    det_util: float | None = None
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class DecodeRecord:
    """One provider on one decode shape; ``status`` ``ok``, ``error`` or ``failed`` (a sampled
    sequence not PASS: its time is kept but does not count), with ``reason``."""

    TYPE = "decode"
    shape: str
    provider: str
    status: str
    kv_bytes: int
    lengths_sum: int
    reason: str = ""
    median_us: float | None = None
    spread: float | None = None
    checks: tuple[SequenceCheck, ...] = field(default=())
    note: str = ""
    # "in turn" (round after round with the shape's other providers) or "alone"; None in
    # results written before the decode bench timed in turn (one provider after the other).
    timing: str | None = None

    @property
    def gbs(self) -> float | None:
        """K/V bytes read per second, in GB/s (10⁹ bytes)."""
        if self.median_us is None or self.median_us <= 0:
            return None
        return self.kv_bytes / self.median_us / 1e3

    @property
    def counts(self) -> bool:
        return self.status == "ok" and all(c.verdict == Status.PASS for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["type"] = self.TYPE
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DecodeRecord:
        checks = tuple(
            SequenceCheck(**{**c, "reasons": tuple(c.get("reasons", ()))})
            for c in d.get("checks", ())
        )
        names = {
            "shape",
            "provider",
            "status",
            "kv_bytes",
            "lengths_sum",
            "reason",
            "note",
            "timing",
        }
        kw = {k: d[k] for k in names if k in d}
        return cls(**kw, median_us=d.get("median_us"), spread=d.get("spread"), checks=checks)


@dataclass(frozen=True)
class CopyCeiling:
    """The device-to-device copy bandwidth (read + write bytes per second), in TB/s."""

    TYPE = "decode-ceiling"
    copy_tbs: float

    def to_json(self) -> dict[str, Any]:
        return {"type": self.TYPE, "copy_tbs": self.copy_tbs}


@dataclass
class DecodeResults:
    """A results file read back: the header's config, the environment, the records."""

    config: dict[str, Any]
    env: dict[str, Any]
    records: list[DecodeRecord]
    ceilings: list[float]

    @property
    def copy_tbs(self) -> float | None:
        """The best copy bandwidth measured (the ceiling a kernel is held to)."""
        return max(self.ceilings) if self.ceilings else None


def load_decode(path: str | os.PathLike) -> DecodeResults:
    """Read a decode results file (``results.jsonl`` under ``--decode``'s report folder)."""
    recs = read_records(path)
    if not recs or recs[0].get("tool") != "flashcheck bench --decode":
        raise ValueError(f"{path} is not a results file of 'flashcheck bench --decode'")
    env: dict[str, Any] = {}
    out, ceil = [], []
    for r in recs[1:]:
        if r.get("type") == "session":
            env = r.get("env", {})
        elif r.get("type") == DecodeRecord.TYPE:
            out.append(DecodeRecord.from_json(r))
        elif r.get("type") == CopyCeiling.TYPE:
            ceil.append(float(r["copy_tbs"]))
    return DecodeResults(recs[0].get("config", {}), env, out, ceil)


def _cell(rec: DecodeRecord | None, copy_tbs: float | None) -> str:
    if rec is None:
        return "–"
    if rec.status == "error":
        return f"error: {rec.reason[:60]}"
    if rec.gbs is None:
        return "–"
    share = f", {100 * rec.gbs / (copy_tbs * 1e3):.0f}%" if copy_tbs else ""
    text = f"{rec.median_us:.1f} µs ({rec.gbs:.0f} GB/s{share})"
    return text if rec.counts else f"~~{text}~~ {rec.status}: {rec.reason[:60]}"


def _checked(recs: list[DecodeRecord]) -> str:
    cells = []
    for rec in recs:
        if rec.checks:
            worst = max((c.max_ulp or 0.0) for c in rec.checks)
            verdicts = "/".join(sorted({str(c.verdict) for c in rec.checks}))
            cells.append(f"{rec.provider} {verdicts} ({worst:.3g} ulp)")
    return "; ".join(cells) or "–"


def _order(records: list[DecodeRecord]) -> str:
    """How the providers of a shape were timed, by what the records say."""
    timed = [r for r in records if r.median_us is not None]
    if any(r.timing == "in turn" for r in timed):
        older = any(r.timing is None for r in timed)
        return (
            "the shape's providers taken in turn, one call each, round after round, so that "
            "all run at the clocks of the same moments"
            + (
                " (results written before the bench timed in turn: one after the other)"
                if older
                else ""
            )
            + ", "
        )
    return "each provider timed on its own, one after the other, "


def decode_markdown(data: DecodeResults) -> str:
    """The report: intro, method, one table row per shape (providers as columns)."""
    providers = list(dict.fromkeys(r.provider for r in data.records))
    shapes = list(dict.fromkeys(r.shape for r in data.records))
    env = data.env
    ceiling = f"{data.copy_tbs:.2f} TB/s" if data.copy_tbs else "not measured"
    lines = [
        "# Decode attention: paged split-KV kernel vs SDPA and FlexAttention",
        "",
        f"GPU {env.get('gpu', '?')}; torch {env.get('torch', '?')}, triton "
        f"{env.get('triton', '?')}; device copy bandwidth {ceiling} (read + write, measured "
        "in the same run). Command: `flashcheck bench --decode"
        + (" --quick" if data.config.get("quick") else "")
        + "`.",
        "",
        "Each cell: median GPU time of one decode step over CUDA-event-timed runs after "
        "warm-up, " + _order(data.records) + "the L2 cache overwritten before each run, "
        "then K/V bytes read per second (every key and value row a sequence owns, once) and "
        "that as a share of the copy bandwidth. Shape keys: `b` batch, `nk` longest cache "
        "(`r`: ragged lengths in [nk/4, nk], `c`: causal), `p` page size, `q` queries per "
        "sequence; 32 query heads on 8 key/value heads, d = 128. SDPA reads the keys gathered "
        "contiguous and padded to the longest sequence (gathered once, not timed); "
        "FlexAttention reads the page pool through torch's PagedAttention block mask. A "
        "struck-through time is that of an output that failed its oracle check.",
        "",
        "Checked: for every provider and shape, the first and the last sequence of the batch "
        "(the last is the longest), query heads 0 and Hq−1, every query row, against the "
        "certified oracle and the bounds of the provider's arithmetic class (flash for the "
        "Triton kernel, the loosest class for the others).",
        "",
        "| shape | K/V MB | " + " | ".join(providers) + " | checks |",
        "|---|---|" + "---|" * len(providers) + "---|",
    ]
    for key in shapes:
        recs = [r for r in data.records if r.shape == key]
        by = {r.provider: r for r in recs}
        mb = recs[0].kv_bytes / 1e6
        row = [f"`{key}`", f"{mb:.1f}"] + [_cell(by.get(p), data.copy_tbs) for p in providers]
        lines.append("| " + " | ".join([*row, _checked(recs)]) + " |")
    notes = sorted({(r.provider, r.note) for r in data.records if r.note})
    if notes:
        lines += ["", "How each provider ran:"] + [f"- {p}: {n}" for p, n in notes]
    return "\n".join(lines) + "\n"


def render_decode(results: str | os.PathLike, out_dir: str | os.PathLike | None = None) -> Path:
    """Write ``bench-decode.md`` beside ``results`` (or in ``out_dir``); returns its path."""
    path = Path(results)
    md = Path(out_dir or path.parent) / "bench-decode.md"
    md.write_text(decode_markdown(load_decode(path)))
    return md

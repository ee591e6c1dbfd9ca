"""The tables of ``bench.md``: per-shape TFLOP/s side by side with ratios to SDPA flash and
cuDNN, the model-width sweep, memory and wall-clock, fp32 with IEEE and tf32 dots, the Triton
kernel as compiled, and the forward's correctness checks; with the cell formatting the backward
sections (:mod:`flashcheck.harness.bench.backward_tables`) share."""

from __future__ import annotations

import statistics
from typing import Any

from ..core.status import Status
from .benchrecords import BenchResults, SpeedRecord
from .summary import BenchSummary, memory_line, ordered, ratio, shape_keys, user_providers

# The oracle check's verdicts, in the order the tallies list them.
JUDGED = tuple(s for s in Status if s.judged)

__all__ = [
    "JUDGED",
    "cell",
    "compiler_section",
    "fmt_ratio",
    "forward_sections",
    "grid_table",
    "kernel_line",
    "mib",
    "peer_lines",
    "providers",
    "short_key",
]


def cell(
    rec: SpeedRecord | None, field: str = "tflops", fmt: str = "{:.0f}", *, scale: float = 1.0
) -> str:
    if not rec:
        return ""
    if rec.status == "skipped":
        return "–"
    if rec.status == "error":
        return "err"
    val = getattr(rec, field)
    text = fmt.format(val * scale) if val is not None else "?"
    return text if rec.check is not None and rec.check.passed else f"{text} ✗"


def fmt_ratio(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}"


def providers(data: BenchResults, keys: list[str]) -> list[str]:
    """The providers with a record at ``keys``, built-ins first, then a user's kernels."""
    return ordered({p for k in keys for p in data.shapes[k]}, user_providers(data))


def grid_table(data: BenchResults, keys: list[str], lead: list[tuple[str, Any]]) -> list[str]:
    """One row per shape of ``keys``: the ``lead`` columns, each provider's TFLOP/s, and
    triton's over SDPA flash's, cuDNN's and each user kernel's."""
    provs = providers(data, keys)
    users = [p for p in user_providers(data) if p in provs]
    fused = "triton-atomic" in provs  # the backward's fused path beside the deterministic one
    head = [name for name, _ in lead] + provs + ["triton / flash", "triton / cuDNN"]
    head += [f"triton / {u}" for u in users]
    head += ["triton-atomic / triton"] if fused else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for k in keys:
        m, row = data.meta[k], data.shapes[k]
        cells = [str(fn(m)) for _, fn in lead] + [cell(row.get(p)) for p in provs]
        cells += [
            fmt_ratio(ratio(row.get("triton"), row.get("sdpa-flash"))),
            fmt_ratio(ratio(row.get("triton"), row.get("sdpa-cudnn"))),
        ]
        cells += [fmt_ratio(ratio(row.get("triton"), row.get(u))) for u in users]
        if fused:
            cells.append(fmt_ratio(ratio(row.get("triton-atomic"), row.get("triton"))))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def mib(x: float | None) -> str:
    return "" if x is None else f"{x / 2**20:,.1f}"


def peer_lines(summ: BenchSummary, memory: str | None) -> list[str]:
    """The Triton kernel beside its peers, from :func:`~flashcheck.harness.bench.summary.
    bench_summary`: its TFLOP/s over SDPA flash's (lowest, median, highest) and over cuDNN's
    at d = 128, N ≥ 4096, over each user kernel's, the ``memory`` line if any, and the shapes
    where it did not score."""
    L = []
    vf = summ.vs_flash
    if vf:
        (lo, lo_key), (hi, hi_key) = vf[0], vf[-1]
        med = statistics.median(r for r, _ in vf)
        L.append(
            f"- **Triton / SDPA flash** at {len(vf)} grid and width shapes: lowest "
            f"**{lo:.2f}×** at `{lo_key}`, median {med:.2f}×, highest {hi:.2f}× at `{hi_key}`."
        )
    if summ.vs_cudnn:
        L.append(
            "- **Triton / SDPA cuDNN** at d = 128, N ≥ 4096: "
            + ", ".join(f"{short_key(k)} {r:.2f}×" for r, k in summ.vs_cudnn)
            + "."
        )
    L += [kernel_line(name, rs) for name, rs in summ.vs_kernels.items()]
    if memory:
        L.append(memory)
    if summ.triton_unscored:
        L.append(
            "- Triton shapes that did not score (error, skip or failed check): "
            + ", ".join(f"`{k}`" for k in summ.triton_unscored)
        )
    return L


def kernel_line(name: str, ratios: list[tuple[float, str]]) -> str:
    """Triton beside a user's kernel: ``ratios`` is ``(triton / kernel, key)`` lowest first,
    at the grid and width shapes where both scored; lowest, median, highest, and the shapes
    where Triton is behind (below 1×)."""
    if not ratios:
        return (
            f"- **Triton / {name}**: no grid or width shape where both ran and passed their check."
        )
    (lo, lo_key), (hi, hi_key) = ratios[0], ratios[-1]
    med = statistics.median(r for r, _ in ratios)
    behind = [(r, k) for r, k in ratios if r < 1]
    where = (
        "Triton is behind it at " + ", ".join(f"`{k}` {r:.2f}×" for r, k in behind)
        if behind
        else "Triton is not behind it at any"
    )
    return (
        f"- **Triton / {name}** at {len(ratios)} grid and width shapes: lowest **{lo:.2f}×** "
        f"at `{lo_key}`, median {med:.2f}×, highest {hi:.2f}× at `{hi_key}`; {where}."
    )


PEERS_INTRO = (
    "The Triton kernel's TFLOP/s over those of SDPA's flash and cuDNN backends on the same "
    "inputs (above 1: Triton is faster); every table below gives them per shape."
)


def forward_sections(data: BenchResults, summ: BenchSummary) -> list[str]:
    """The peers, tables and checks of the forward records (``data``: a forward-only view)."""
    L = ["## Triton side by side with its peers", "", PEERS_INTRO, ""]
    L += peer_lines(summ, memory_line(data))
    L.append("")
    L += _grid_sections(data) + _width_section(data) + _memory_sections(data)
    L += _fp32_section(data) + compiler_section(data) + _correctness(summ)
    return L


def _grid_sections(data: BenchResults) -> list[str]:
    """One TFLOP/s table per dtype, head dim and causality."""
    L: list[str] = []
    for dt in ("bf16", "fp16"):
        for d in (64, 128, 256):
            for causal in (False, True):
                keys = shape_keys(data, "grid", dtype=dt, d=d, causal=causal)
                if not keys:
                    continue
                L += [f"## {dt}, d = {d}, {'causal' if causal else 'non-causal'}: TFLOP/s", ""]
                L += grid_table(
                    data,
                    keys,
                    [("N", lambda m: m.n), ("B × H", lambda m: f"{m.b} × {m.h}")],
                )
                L.append("")
    return L


def _width_section(data: BenchResults) -> list[str]:
    """The model-width sweep."""
    L: list[str] = []
    wk = sorted(shape_keys(data, "width"), key=lambda k: (data.meta[k].causal, data.meta[k].h))
    if wk:
        L += ["## Model width sweep: bf16, N = 4096, d = 128, B = 4: TFLOP/s", ""]
        L += grid_table(
            data,
            wk,
            [
                ("H·d", lambda m: m.h * m.d),
                ("H", lambda m: m.h),
                ("causal", lambda m: "yes" if m.causal else "no"),
            ],
        )
        L.append("")
    return L


def _memory_sections(data: BenchResults) -> list[str]:
    """Peak extra memory and wall-clock of one call vs N."""
    L: list[str] = []
    mk = shape_keys(data, "memory")
    if mk:
        provs = providers(data, mk)
        L += [
            "## Peak extra memory of one call: bf16, B = 1, H = 8, d = 128 (MiB)",
            "",
            "Extra = peak allocated during the call minus allocated before it (the inputs). "
            "The output O and the fp32 LSE are the floor for any forward that returns them.",
            "",
        ]
        head = ["N", "O + LSE", *provs]
        L += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for k in mk:
            row = data.shapes[k]
            any_rec = next(iter(row.values()))
            base = (any_rec.out_bytes or 0) + (any_rec.lse_bytes or 0)
            cells = [str(data.meta[k].n), mib(base)]
            for p in provs:
                cells.append(cell(row.get(p), "peak_extra_bytes", "{:,.1f}", scale=2**-20))
            L.append("| " + " | ".join(cells) + " |")
        L += ["", "## Wall-clock of one call vs N: bf16, B = 1, H = 8, d = 128 (ms)", ""]
        head = ["N", *provs]
        L += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for k in mk:
            row = data.shapes[k]
            L.append(
                "| "
                + " | ".join(
                    [str(data.meta[k].n)] + [cell(row.get(p), "ms", "{:.3g}") for p in provs]
                )
                + " |"
            )
        L.append("")
    return L


def _fp32_section(data: BenchResults) -> list[str]:
    """fp32 inputs: IEEE fp32 dots against tf32 dots."""
    L: list[str] = []
    fk = sorted(
        shape_keys(data, "fp32"),
        key=lambda k: (data.meta[k].d, data.meta[k].causal, data.meta[k].n),
    )
    if fk:
        provs = providers(data, fk)
        L += [
            "## fp32 inputs: IEEE fp32 dots (`triton`) and tf32 dots (`triton-tf32`)",
            "",
            '`triton` runs its two GEMMs with IEEE fp32 dots (`input_precision="ieee"`); '
            "`triton-tf32` with tf32 tensor-core dots (10-bit mantissa inputs). Max floored "
            "ULP of the checked rows, in fp32 ulps, shows what tf32 costs in accuracy.",
            "",
        ]
        head = (
            ["d", "causal", "N"]
            + [f"{p} TFLOP/s" for p in provs]
            + ["tf32 / IEEE speed", "IEEE max ulp", "tf32 max ulp"]
        )
        L += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for k in fk:
            m, row = data.meta[k], data.shapes[k]
            ieee, tf = row.get("triton"), row.get("triton-tf32")
            sp = (
                tf.tflops / ieee.tflops
                if ieee and tf and ieee.status == "ok" and tf.status == "ok"
                else None
            )
            cells = [str(m.d), "yes" if m.causal else "no", str(m.n)]
            cells += [cell(row.get(p), "tflops", "{:.1f}") for p in provs]
            cells += [fmt_ratio(sp), _ulp(ieee), _ulp(tf)]
            L.append("| " + " | ".join(cells) + " |")
        L.append("")
    return L


def _correctness(summ: BenchSummary) -> list[str]:
    """The tally of the oracle checks of the forward outputs."""
    L = [
        "## Correctness checks",
        "",
        "Each output was compared with the mpmath oracle on 12 sampled rows (first, last and "
        "10 seeded) of the first and last head of the last batch entry, and judged like an "
        "error-report result: a-priori bounds for the `flash` / `tf32` classes (triton, SDPA "
        "flash), and max(2 × same-precision naive + 1 ulp, probabilistic bound) for all.",
        "",
        "| provider | " + " | ".join(JUDGED) + " |",
        "|---|---|---|---|",
    ]
    for p in ordered(summ.checks, summ.vs_kernels):
        c = summ.checks[p]
        L.append(f"| {p} | " + " | ".join(str(c.get(s, 0)) for s in JUDGED) + " |")
    for key, p, v, reasons in summ.failures:
        L.append(f"- `{key}` {p}: {v}: {'; '.join(reasons)}")
    L.append("")
    return L


def short_key(key: str) -> str:
    _part, dt, shape, mask = key.split("/")[:4]
    n = shape.split("n")[1].split("d")[0]
    return f"{dt} N={n} {mask}"


def _ulp(rec: SpeedRecord | None) -> str:
    if not rec or rec.status != "ok" or rec.check is None:
        return ""
    return f"{rec.check.max_ulp:.3g}"


def compiler_section(data: BenchResults) -> list[str]:
    # One row per distinct compiled kernel: the launch configuration may depend on N
    # (short sequences take another tile at d = 128 on Hopper), so group the N it served.
    rows: dict[tuple, list[int]] = {}
    for k, m in data.meta.items():
        t = data.shapes[k].get("triton")
        if t and t.triton and m.part in ("grid", "fp32"):
            tt = t.triton
            got = tuple(tt.get(f) for f in ("warps", "stages", "registers", "spills"))
            key = (m.dtype, m.d, m.causal, *got, tt.get("shared_bytes"))
            rows.setdefault(key, []).append(m.n)
    if not rows:
        return []
    L = [
        "## The Triton kernel as compiled (compiler's report)",
        "",
        "| dtype | d | causal | N | warps | stages | registers / thread | spills | smem (KiB) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (dt, d, c, warps, stages, regs, spills, smem), ns in sorted(
        rows.items(), key=lambda kv: (kv[0][:3], min(kv[1]))
    ):
        n_text = f"{min(ns)}" if min(ns) == max(ns) else f"{min(ns)}–{max(ns)}"
        L.append(
            f"| {dt} | {d} | {'yes' if c else 'no'} | {n_text} | {warps} | {stages} "
            f"| {regs} | {spills} | {'' if smem is None else f'{smem / 1024:.0f}'} |"
        )
    return [*L, ""]

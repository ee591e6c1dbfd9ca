"""The sections of ``bench.md`` for a backward pass (``--pass bwd``, ``--pass fwd+bwd``):
the Triton kernel beside its peers, TFLOP/s tables, the backward by difference, its memory, and
the gradient checks; each drawn from that pass's records only."""

from __future__ import annotations

from collections import defaultdict

from .benchrecords import BenchResults
from .summary import BenchSummary, backward_memory_line, bench_summary, ordered, shape_keys
from .tables import JUDGED, PEERS_INTRO, cell, grid_table, mib, peer_lines, providers

__all__ = ["backward_sections"]

_PASS_LABEL = {"bwd": "Backward", "fwd+bwd": "Forward + backward"}
_PASS_METHOD = {
    "bwd": "Backward TFLOP/s count 2.5 × the forward's `4·N²·d` FLOPs per head (halved for "
    "causal). The time is the backward alone: `torch.autograd.grad(O, (Q, K, V), dO, "
    "retain_graph=True)` through a graph the forward built before the timing, as the "
    "FlashAttention and Triton tutorial benchmarks time it. The same run also timed the "
    "forward and forward + backward of each provider; `fwd+bwd − fwd` is shown in its own "
    "table. `triton` runs the Triton backward's bitwise reproducible two-kernel path "
    "(`deterministic=True`, its default), `triton-atomic` its fused path "
    "(`deterministic=False`: dQ summed with fp32 atomic adds inside the dK/dV kernel; the "
    "same forward).",
    "fwd+bwd": "TFLOP/s count 3.5 × the forward's `4·N²·d` FLOPs per head (halved for causal): "
    "one forward, then `torch.autograd.grad(O, (Q, K, V), dO)`, timed together.",
}


def backward_sections(data: BenchResults, pass_: str) -> list[str]:
    """The sections of one backward pass (``data``: that pass's view)."""
    label = _PASS_LABEL[pass_]
    summ = bench_summary(data)
    L = [f"## {label} (`--pass {pass_}`): side by side with its peers", "", _PASS_METHOD[pass_]]
    L += ["", PEERS_INTRO, ""]
    L += peer_lines(summ, backward_memory_line(data) if pass_ == "bwd" else None)
    L.append("")
    grid_lines, grid = _grid_sections(data, label)
    L += grid_lines
    if pass_ == "bwd":
        L += _difference_table(data, grid) + _memory_table(data)
    L += _gradient_checks(data, summ, label)
    return L


def _grid_sections(data: BenchResults, label: str) -> tuple[list[str], list[str]]:
    """The TFLOP/s tables of the grid (one per dtype, head dim and causality), the width and
    the fp32 parts; and the grid's shape keys."""
    L: list[str] = []
    grid = []
    for dt in ("bf16", "fp16", "fp32"):
        for d in (64, 128, 256):
            for causal in (False, True):
                keys = shape_keys(data, "grid", dtype=dt, d=d, causal=causal)
                if not keys:
                    continue
                grid += keys
                L += [
                    f"## {label}, {dt}, d = {d}, {'causal' if causal else 'non-causal'}: TFLOP/s",
                    "",
                ]
                L += grid_table(
                    data,
                    keys,
                    [("N", lambda m: m.n), ("B × H", lambda m: f"{m.b} × {m.h}")],
                )
                L.append("")
    for part in ("width", "fp32"):
        keys = sorted(
            shape_keys(data, part),
            key=lambda k: (
                data.meta[k].d,
                data.meta[k].causal,
                data.meta[k].h,
                data.meta[k].n,
            ),
        )
        if keys:
            L += [f"## {label}, {part} part: TFLOP/s", ""]
            L += grid_table(
                data,
                keys,
                [
                    ("N", lambda m: m.n),
                    ("d", lambda m: m.d),
                    ("H", lambda m: m.h),
                    ("causal", lambda m: "yes" if m.causal else "no"),
                ],
            )
            L.append("")
    return L, grid


def _difference_table(data: BenchResults, grid: list[str]) -> list[str]:
    """The backward's rate by difference, ``fwd+bwd − fwd``, at the grid's shapes."""
    L: list[str] = []
    if grid:
        provs = providers(data, grid)
        L += [
            "## Backward by difference, `fwd+bwd − fwd` (TFLOP/s, same run)",
            "",
            "The same backward FLOPs over the difference of the forward + backward and forward "
            "medians. It charges the backward with what the forward does only when a backward "
            "follows (saving activations); the retained-graph figures above do not.",
            "",
        ]
        head = ["dtype", "d", "causal", "N", *provs]
        L += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for k in grid:
            m, row = data.meta[k], data.shapes[k]
            cells = [m.dtype, str(m.d), "yes" if m.causal else "no", str(m.n)]
            cells += [cell(row.get(p), "diff_tflops") for p in provs]
            L.append("| " + " | ".join(cells) + " |")
        L.append("")
    return L


def _memory_table(data: BenchResults) -> list[str]:
    """Peak extra memory of the backward, and what the forward saved for it."""
    L: list[str] = []
    mk = shape_keys(data, "memory")
    if mk:
        provs = providers(data, mk)
        L += [
            "## Peak extra memory of the backward: bf16, B = 1, H = 8, d = 128 (MiB)",
            "",
            "Extra = peak allocated during `torch.autograd.grad` minus allocated before it "
            "(the inputs, O and what autograd saved). dQ + dK + dV is the floor for any "
            "backward. Saved: what the forward left for the backward, O included.",
            "",
        ]
        head = ["N", "dQ + dK + dV", *provs, *(f"{p} saved" for p in provs)]
        L += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for k in mk:
            row = data.shapes[k]
            grads = next(iter(row.values())).grad_bytes
            cells = [str(data.meta[k].n), mib(grads)]
            cells += [
                cell(row.get(p), "bwd_peak_extra_bytes", "{:,.1f}", scale=2**-20) for p in provs
            ]
            cells += [cell(row.get(p), "saved_bytes", "{:,.1f}", scale=2**-20) for p in provs]
            L.append("| " + " | ".join(cells) + " |")
        L.append("")
    return L


def _gradient_checks(data: BenchResults, summ: BenchSummary, label: str) -> list[str]:
    modes: dict[str, int] = defaultdict(int)
    for row in data.shapes.values():
        for r in row.values():
            if r.check is not None:
                modes[r.check.kv_mode or "?"] += 1
    L = [
        f"## {label}: gradient checks",
        "",
        "dQ: 12 sampled query rows (first, last, 10 seeded) of the first and last head of the "
        "last batch entry, against the certified gradient oracle on those rows. dK, dV: 12 "
        "sampled keys (first, last, 10 seeded) of the last head, every query row included: "
        "against the certified oracle and the a-priori bounds up to the run's "
        "`--grad-oracle-max-n`, beyond it against a float64 reference with the empirical rule "
        "only (docs/bench.md). Verdicts: deterministic bound of the provider's backward class "
        "(`flash`: triton, SDPA flash; `naive`: naive; the loosest class otherwise) for "
        "FAIL-HARD, max(2 × the naive backward's error + 1 ulp, probabilistic bound) for FAIL. "
        "dK/dV references used: "
        + ", ".join(f"{m} ({n} checks)" for m, n in sorted(modes.items()))
        + ".",
        "",
        "| provider | PASS | FAIL | FAIL-HARD | max floored ulp dQ / dK / dV |",
        "|---|---|---|---|---|",
    ]
    for p in ordered(summ.checks, summ.vs_kernels):
        c = summ.checks[p]
        worst = {g: 0.0 for g in ("dq", "dk", "dv")}
        for row in data.shapes.values():
            r = row.get(p)
            if r and r.check is not None and isinstance(r.check.max_ulp, dict):
                for g in worst:
                    x = r.check.max_ulp.get(g)
                    if isinstance(x, int | float) and x > worst[g]:
                        worst[g] = x
        L.append(
            f"| {p} | "
            + " | ".join(str(c.get(s, 0)) for s in JUDGED)
            + " | "
            + " / ".join(f"{worst[g]:.3g}" for g in ("dq", "dk", "dv"))
            + " |"
        )
    for key, p, v, reasons in summ.failures:
        L.append(f"- `{key}` {p}: {v}: {'; '.join(reasons)}")
    return [*L, ""]

"""The ``options`` part's section of ``bench.md``: what soft-capping and attention sinks cost
the Triton kernel, as the time of the kernel with the option over its time without it on the
same inputs in the same run (one table per pass)."""

from __future__ import annotations

from .benchrecords import BenchResults, SpeedRecord
from .summary import counts, only_pass, passes_in, shape_keys
from .tables import cell, fmt_ratio

__all__ = ["OVERHEAD_GOAL", "option_overheads", "option_sections"]

# The goal for an option's cost: its time at most this many times the plain kernel's.
OVERHEAD_GOAL = 1.10
VARIANTS = ("triton+softcap", "triton+softcap-approx", "triton+sinks")


def _time_ratio(a: SpeedRecord | None, b: SpeedRecord | None) -> float | None:
    """``a``'s time over ``b``'s, where both count (passed their oracle check)."""
    if counts(a) and counts(b) and a.ms and b.ms:
        return a.ms / b.ms
    return None


def option_overheads(data: BenchResults) -> dict[str, list[float]]:
    """``{variant: [time ratio to plain triton per shape]}`` over the ``options`` shapes of
    ``data`` (one pass's view), shapes where both passed their check only."""
    out: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for k in shape_keys(data, "options"):
        row = data.shapes[k]
        for v in VARIANTS:
            r = _time_ratio(row.get(v), row.get("triton"))
            if r is not None:
                out[v].append(r)
    return out


def _ratio(r: float) -> str:
    """``r`` to two decimals, or three where two would hide which side of the goal it is on
    (1.1036 is over a goal of 1.10 but reads 1.10)."""
    two = f"{r:.2f}"
    return f"{r:.3f}" if (float(two) <= OVERHEAD_GOAL) != (r <= OVERHEAD_GOAL) else two


def option_sections(everything: BenchResults) -> list[str]:
    """One table per pass holding ``options`` shapes: TFLOP/s of the plain kernel and of each
    variant, and each variant's time over the plain kernel's (the goal: ≤ 1.10)."""
    L: list[str] = []
    for pass_ in passes_in(everything):
        data = only_pass(everything, pass_)
        keys = sorted(
            shape_keys(data, "options"),
            key=lambda k: (-data.meta[k].d, data.meta[k].causal, data.meta[k].n),
        )
        if not keys:
            continue
        L += [
            f"## Soft-capping and sinks (`--pass {pass_}`): cost against the same kernel",
            "",
            f"`triton+softcap` runs with `softcap={_cap()}`, `triton+softcap-approx` the same "
            "with the GPU's approximate tanh (`approx_tanh=True`), `triton+sinks` with one sink "
            "logit per head; each is timed beside plain `triton` on the same inputs. Time ratio = "
            f"the variant's time over plain `triton`'s (goal: ≤ {OVERHEAD_GOAL:.2f}); every "
            "output passed its oracle check with the option applied, or is marked ✗.",
            "",
        ]
        head = ["d", "causal", "N", "triton", *VARIANTS] + [f"{v} time ratio" for v in VARIANTS]
        L += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for k in keys:
            m, row = data.meta[k], data.shapes[k]
            cells = [str(m.d), "yes" if m.causal else "no", str(m.n)]
            cells += [cell(row.get(p)) for p in ("triton", *VARIANTS)]
            cells += [fmt_ratio(_time_ratio(row.get(v), row.get("triton"))) for v in VARIANTS]
            L.append("| " + " | ".join(cells) + " |")
        worst = {v: max(rs) for v, rs in option_overheads(data).items() if rs}
        if worst:
            L += [
                "",
                "Worst time ratio: "
                + ", ".join(
                    f"{v} {_ratio(r)} ({'within' if r <= OVERHEAD_GOAL else 'over'} the goal)"
                    for v, r in worst.items()
                )
                + ".",
            ]
        L.append("")
    return L


def _cap() -> str:
    from .providers import BENCH_SOFTCAP

    return f"{BENCH_SOFTCAP:g}"

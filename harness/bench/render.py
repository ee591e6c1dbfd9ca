"""``reports/bench/<gpu>/bench.md``, ``bench.json`` and the figures, from ``results.jsonl`` only.

The markdown leads with the verdicts the benchmark exists for — the Triton kernel against SDPA
flash at every shape (floor) and against cuDNN at ``d = 128, N ≥ 4096`` (goal) — then one
side-by-side table per dtype × head dim × causality, the width sweep, the memory and
wall-clock tables, fp32 with IEEE and tf32 dots, the compiler's report on the Triton kernel,
the correctness checks, and the environment. Backward passes (``--pass bwd``, ``fwd+bwd``)
follow in sections of their own, drawn from their own records only.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from .summary import (
    FLOOR,
    GOAL,
    ORDER,
    STRETCH,
    backward_memory_verdict,
    bench_summary,
    ceiling_rows,
    load_results,
    memory_verdict,
    only_pass,
    passes_in,
    ratio,
    shape_keys,
)

__all__ = ["bench_summary", "render_bench"]


def _cell(
    rec: dict[str, Any] | None, field: str = "tflops", fmt: str = "{:.0f}", *, scale: float = 1.0
) -> str:
    if not rec:
        return ""
    if rec["status"] == "skipped":
        return "–"
    if rec["status"] == "error":
        return "err"
    text = fmt.format(rec[field] * scale) if rec.get(field) is not None else "?"
    verdict = rec.get("check", {}).get("verdict")
    return text if verdict == "PASS" else f"{text} ✗"


def _fmt_ratio(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}"


def _providers(data: dict[str, Any], keys: list[str]) -> list[str]:
    seen = {p for k in keys for p in data["shapes"][k]}
    return [p for p in ORDER if p in seen] + sorted(seen - set(ORDER))


def _grid_table(data: dict[str, Any], keys: list[str], lead: list[tuple[str, Any]]) -> list[str]:
    provs = _providers(data, keys)
    head = [name for name, _ in lead] + provs + ["triton / flash", "triton / cuDNN"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for k in keys:
        m, row = data["meta"][k], data["shapes"][k]
        cells = [str(fn(m)) for _, fn in lead] + [_cell(row.get(p)) for p in provs]
        cells += [
            _fmt_ratio(ratio(row.get("triton"), row.get("sdpa-flash"))),
            _fmt_ratio(ratio(row.get("triton"), row.get("sdpa-cudnn"))),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _mib(x: float | None) -> str:
    return "" if x is None else f"{x / 2**20:,.1f}"


def render_bench(
    results: str | Path, out_dir: str | Path | None = None, *, figures: bool = True
) -> Path:
    """Write bench.md, bench.json and the PNGs next to ``results`` (or into ``out_dir``)."""
    results = Path(results)
    out = Path(out_dir) if out_dir is not None else results.parent
    out.mkdir(parents=True, exist_ok=True)
    everything = load_results(results)
    # The forward sections below see forward records only; each backward pass gets its own.
    data = only_pass(everything, "fwd")
    summ = bench_summary(data)
    name = data["header"].get("name", out.name)
    env = data["sessions"][-1]["env"] if data["sessions"] else {}
    cfg = data["header"].get("config", {})
    cmd = f"flashcheck bench --name {name}"
    if cfg.get("quick"):
        cmd += " --quick"
    if cfg.get("parts") and list(cfg["parts"]) != ["grid", "width", "memory", "fp32"]:
        cmd += "".join(f" --part {p}" for p in cfg["parts"])
    if cfg.get("providers"):
        cmd += "".join(f" --provider {p}" for p in cfg["providers"])
    for opt, field in (("pass", "passes"), ("n", "ns"), ("d", "head_dims"), ("dtype", "dtypes")):
        cmd += "".join(f" --{opt} {x}" for x in cfg.get(field) or ())
    if cfg.get("passes") and cfg.get("oracle_max_n") is not None:
        cmd += f" --grad-oracle-max-n {cfg['oracle_max_n']}"
    L: list[str] = [f"# flashcheck bench: {name}", ""]
    L.append(
        f"Regenerate with `{cmd}` on the same GPU; re-render from the raw results without "
        f"running anything: `flashcheck bench --render-only --name {name}`. Raw results: "
        "[results.jsonl](results.jsonl); the same numbers as one JSON document: "
        "[bench.json](bench.json)."
    )
    L.append("")
    if not data["complete"]:
        L += [
            "> **Incomplete run**: the benchmark was interrupted; run the same command again "
            "to finish it. The tables hold what was measured so far.",
            "",
        ]
    L.append(
        f"GPU: **{env.get('gpu', '?')}**; torch {env.get('torch', '?')}, triton "
        f"{env.get('triton', '?')}, CUDA {env.get('cuda', '?')}, cuDNN "
        f"{env.get('cudnn', '?')}."
    )
    L.append("")
    L += [
        "## Ceilings measured in this run",
        "",
        "| when | bf16 matmul 8192³ (TFLOP/s) | device copy (TB/s) |",
        "|---|---|---|",
    ]
    for when, c in ceiling_rows(data["records"]):
        L.append(f"| {when} | {c['matmul_bf16_tflops']:.0f} | {c['copy_tbs']:.2f} |")
    L += [
        "",
        "TFLOP/s below count `4·N²·d` FLOPs per head (the two GEMMs), halved for causal. "
        "Timing: CUDA events around each call after warm-up, median of ≥ 20 runs (≥ 10 for "
        "the materializing `sdpa-math`, `naive` and for `sdpa-efficient`), inputs rotated "
        "through copies larger than L2 together. A cell marked ✗ failed its oracle check and "
        "does not count; – = not run (the reason is in the results); err = the provider "
        "raised.",
        "",
    ]

    backward = [p for p in passes_in(everything) if p != "fwd"]
    if data["shapes"] or not backward:
        L += _forward_sections(data, summ)
    for p in backward:
        L += _backward_sections(only_pass(everything, p), p)
    errs = [
        (k, p, r["reason"])
        for k, row in everything["shapes"].items()
        for p, r in row.items()
        if r["status"] != "ok"
    ]
    if errs:
        reasons: dict[tuple[str, str], list[str]] = defaultdict(list)
        for k, p, why in errs:
            reasons[(p, why)].append(k)
        L += ["## Not run", ""]
        for (p, why), ks in sorted(reasons.items()):
            L.append(f"- {p} ({len(ks)} shapes, e.g. `{ks[0]}`): {why}")
        L.append("")
    L += ["## Environment", "", "| | |", "|---|---|"]
    for k, v in env.items():
        if k != "argv":
            L.append(f"| {k} | {v} |")
    L.append("")
    if figures and data["shapes"]:
        from .figures import make_bench_figures

        made = make_bench_figures(data, out)
        if made:
            L += ["## Figures", ""] + [f"![{m}]({m}.png)" for m in made] + [""]
    md = out / "bench.md"
    md.write_text("\n".join(L))
    by_pass = {p: bench_summary(only_pass(everything, p)) for p in passes_in(everything)}
    _write_json(everything, summ, by_pass, out / "bench.json")
    return md


def _forward_sections(data: dict[str, Any], summ: dict[str, Any]) -> list[str]:
    """Verdicts, tables and checks of the forward records (``data``: a forward-only view)."""
    L: list[str] = ["## Verdicts", ""]
    fl = summ["floor_min"]
    if fl:
        ok = "met" if fl[0] >= FLOOR else "**not met**"
        L.append(
            f"- **Floor** (Triton ≥ {FLOOR:.1f}× SDPA flash at every grid and width shape): "
            f"{ok}; the lowest ratio is **{fl[0]:.2f}×** at `{fl[1]}` "
            f"({summ['floor_shapes']} shapes compared)."
        )
        for r, k in summ["floor_below"]:
            L.append(f"  - below the floor: `{k}`: {r:.2f}×")
    if summ["goal"]:
        g = summ["goal_min"]
        ok = "met" if g[0] >= GOAL else "**not met**"
        L.append(
            f"- **Goal** (≥ {GOAL}× SDPA cuDNN at d = 128, N ≥ 4096, causal and not): {ok}; "
            f"lowest **{g[0]:.2f}×** at `{g[1]}`. Stretch (≥ {STRETCH:.1f}×): "
            f"{'met' if g[0] >= STRETCH else 'not met'}. All ratios: "
            + ", ".join(f"{_short_key(k)} {r:.2f}" for r, k in summ["goal"])
            + "."
        )
    mem = memory_verdict(data)
    if mem:
        L.append(mem)
    if summ["triton_unscored"]:
        L.append(
            "- Triton shapes that did not score (error, skip or failed check): "
            + ", ".join(f"`{k}`" for k in summ["triton_unscored"])
        )
    L.append("")

    for dt in ("bf16", "fp16"):
        for d in (64, 128, 256):
            for causal in (False, True):
                keys = shape_keys(data, "grid", dtype=dt, d=d, causal=causal)
                if not keys:
                    continue
                L += [f"## {dt}, d = {d}, {'causal' if causal else 'non-causal'}: TFLOP/s", ""]
                L += _grid_table(
                    data,
                    keys,
                    [("N", lambda m: m["n"]), ("B × H", lambda m: f"{m['b']} × {m['h']}")],
                )
                L.append("")
    wk = sorted(
        shape_keys(data, "width"), key=lambda k: (data["meta"][k]["causal"], data["meta"][k]["h"])
    )
    if wk:
        L += ["## Model width sweep: bf16, N = 4096, d = 128, B = 4: TFLOP/s", ""]
        L += _grid_table(
            data,
            wk,
            [
                ("H·d", lambda m: m["h"] * m["d"]),
                ("H", lambda m: m["h"]),
                ("causal", lambda m: "yes" if m["causal"] else "no"),
            ],
        )
        L.append("")
    mk = shape_keys(data, "memory")
    if mk:
        provs = _providers(data, mk)
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
            row = data["shapes"][k]
            any_rec = next(iter(row.values()))
            base = (any_rec.get("out_bytes") or 0) + (any_rec.get("lse_bytes") or 0)
            cells = [str(data["meta"][k]["n"]), _mib(base)]
            for p in provs:
                cells.append(_cell(row.get(p), "peak_extra_bytes", "{:,.1f}", scale=2**-20))
            L.append("| " + " | ".join(cells) + " |")
        L += ["", "## Wall-clock of one call vs N: bf16, B = 1, H = 8, d = 128 (ms)", ""]
        head = ["N", *provs]
        L += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for k in mk:
            row = data["shapes"][k]
            L.append(
                "| "
                + " | ".join(
                    [str(data["meta"][k]["n"])] + [_cell(row.get(p), "ms", "{:.3g}") for p in provs]
                )
                + " |"
            )
        L.append("")
    fk = sorted(
        shape_keys(data, "fp32"),
        key=lambda k: (data["meta"][k]["d"], data["meta"][k]["causal"], data["meta"][k]["n"]),
    )
    if fk:
        provs = _providers(data, fk)
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
            m, row = data["meta"][k], data["shapes"][k]
            ieee, tf = row.get("triton"), row.get("triton-tf32")
            sp = (
                tf["tflops"] / ieee["tflops"]
                if ieee and tf and ieee["status"] == "ok" and tf["status"] == "ok"
                else None
            )
            cells = [str(m["d"]), "yes" if m["causal"] else "no", str(m["n"])]
            cells += [_cell(row.get(p), "tflops", "{:.1f}") for p in provs]
            cells += [_fmt_ratio(sp), _ulp(ieee), _ulp(tf)]
            L.append("| " + " | ".join(cells) + " |")
        L.append("")
    L += _compiler_section(data)
    L += [
        "## Correctness checks",
        "",
        "Each output was compared with the mpmath oracle on 12 sampled rows (first, last and "
        "10 seeded) of the first and last head of the last batch entry, and judged like an "
        "error-report result: a-priori bounds for the `flash` / `tf32` classes (triton, SDPA "
        "flash), and max(2 × same-precision naive + 1 ulp, probabilistic bound) for all.",
        "",
        "| provider | " + " | ".join(("PASS", "FAIL", "FAIL-HARD")) + " |",
        "|---|---|---|---|",
    ]
    for p in [x for x in ORDER if x in summ["checks"]]:
        c = summ["checks"][p]
        L.append(f"| {p} | {c.get('PASS', 0)} | {c.get('FAIL', 0)} | {c.get('FAIL-HARD', 0)} |")
    for key, p, v, reasons in summ["failures"]:
        L.append(f"- `{key}` {p}: {v}: {'; '.join(reasons)}")
    L.append("")
    return L


_PASS_LABEL = {"bwd": "Backward", "fwd+bwd": "Forward + backward"}
_PASS_METHOD = {
    "bwd": "Backward TFLOP/s count 2.5 × the forward's `4·N²·d` FLOPs per head (halved for "
    "causal). The time is the backward alone: `torch.autograd.grad(O, (Q, K, V), dO, "
    "retain_graph=True)` through a graph the forward built before the timing, as the "
    "FlashAttention and Triton tutorial benchmarks time it. The same run also timed the "
    "forward and forward + backward of each provider; `fwd+bwd − fwd` (the convention of the "
    "anchors in SPEC 7) is shown in its own table.",
    "fwd+bwd": "TFLOP/s count 3.5 × the forward's `4·N²·d` FLOPs per head (halved for causal): "
    "one forward, then `torch.autograd.grad(O, (Q, K, V), dO)`, timed together.",
}


def _backward_sections(data: dict[str, Any], pass_: str) -> list[str]:
    """Verdicts, TFLOP/s tables, backward memory and gradient checks of one backward pass
    (``data``: that pass's view)."""
    label = _PASS_LABEL[pass_]
    summ = bench_summary(data)
    L = [f"## {label} (`--pass {pass_}`): verdicts", "", _PASS_METHOD[pass_], ""]
    fl = summ["floor_min"]
    if fl:
        ok = "met" if fl[0] >= FLOOR else "**not met**"
        L.append(
            f"- **Floor** (Triton ≥ {FLOOR:.1f}× SDPA flash at every grid and width shape): "
            f"{ok}; the lowest ratio is **{fl[0]:.2f}×** at `{fl[1]}` "
            f"({summ['floor_shapes']} shapes compared)."
        )
        for r, k in summ["floor_below"]:
            L.append(f"  - below the floor: `{k}`: {r:.2f}×")
    if summ["goal"]:
        g = summ["goal_min"]
        ok = "met" if g[0] >= GOAL else "**not met**"
        L.append(
            f"- **Goal** (≥ {GOAL}× SDPA cuDNN at d = 128, N ≥ 4096, causal and not): {ok}; "
            f"lowest **{g[0]:.2f}×** at `{g[1]}`. All ratios: "
            + ", ".join(f"{_short_key(k)} {r:.2f}" for r, k in summ["goal"])
            + "."
        )
    mem = backward_memory_verdict(data) if pass_ == "bwd" else None
    if mem:
        L.append(mem)
    if summ["triton_unscored"]:
        L.append(
            "- Triton shapes that did not score (error, skip or failed check): "
            + ", ".join(f"`{k}`" for k in summ["triton_unscored"])
        )
    L.append("")
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
                L += _grid_table(
                    data,
                    keys,
                    [("N", lambda m: m["n"]), ("B × H", lambda m: f"{m['b']} × {m['h']}")],
                )
                L.append("")
    for part in ("width", "fp32"):
        keys = sorted(
            shape_keys(data, part),
            key=lambda k: (
                data["meta"][k]["d"],
                data["meta"][k]["causal"],
                data["meta"][k]["h"],
                data["meta"][k]["n"],
            ),
        )
        if keys:
            L += [f"## {label}, {part} part: TFLOP/s", ""]
            L += _grid_table(
                data,
                keys,
                [
                    ("N", lambda m: m["n"]),
                    ("d", lambda m: m["d"]),
                    ("H", lambda m: m["h"]),
                    ("causal", lambda m: "yes" if m["causal"] else "no"),
                ],
            )
            L.append("")
    if pass_ == "bwd" and grid:
        provs = _providers(data, grid)
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
            m, row = data["meta"][k], data["shapes"][k]
            cells = [m["dtype"], str(m["d"]), "yes" if m["causal"] else "no", str(m["n"])]
            cells += [_cell(row.get(p), "diff_tflops") for p in provs]
            L.append("| " + " | ".join(cells) + " |")
        L.append("")
    mk = shape_keys(data, "memory")
    if pass_ == "bwd" and mk:
        provs = _providers(data, mk)
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
            row = data["shapes"][k]
            grads = next(iter(row.values())).get("grad_bytes")
            cells = [str(data["meta"][k]["n"]), _mib(grads)]
            cells += [
                _cell(row.get(p), "bwd_peak_extra_bytes", "{:,.1f}", scale=2**-20) for p in provs
            ]
            cells += [_cell(row.get(p), "saved_bytes", "{:,.1f}", scale=2**-20) for p in provs]
            L.append("| " + " | ".join(cells) + " |")
        L.append("")
    L += _gradient_checks(data, summ, label)
    return L


def _gradient_checks(data: dict[str, Any], summ: dict[str, Any], label: str) -> list[str]:
    modes: dict[str, int] = defaultdict(int)
    for row in data["shapes"].values():
        for r in row.values():
            if "check" in r:
                modes[r["check"].get("kv_mode", "?")] += 1
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
    for p in [x for x in ORDER if x in summ["checks"]]:
        c = summ["checks"][p]
        worst = {g: 0.0 for g in ("dq", "dk", "dv")}
        for row in data["shapes"].values():
            r = row.get(p)
            if r and isinstance(r.get("check", {}).get("max_ulp"), dict):
                for g in worst:
                    x = r["check"]["max_ulp"].get(g)
                    if isinstance(x, int | float) and x > worst[g]:
                        worst[g] = x
        L.append(
            f"| {p} | {c.get('PASS', 0)} | {c.get('FAIL', 0)} | {c.get('FAIL-HARD', 0)} | "
            + " / ".join(f"{worst[g]:.3g}" for g in ("dq", "dk", "dv"))
            + " |"
        )
    for key, p, v, reasons in summ["failures"]:
        L.append(f"- `{key}` {p}: {v}: {'; '.join(reasons)}")
    return [*L, ""]


def _short_key(key: str) -> str:
    _part, dt, shape, mask = key.split("/")[:4]
    n = shape.split("n")[1].split("d")[0]
    return f"{dt} N={n} {mask}"


def _ulp(rec: dict[str, Any] | None) -> str:
    if not rec or rec["status"] != "ok" or "check" not in rec:
        return ""
    return f"{rec['check']['max_ulp']:.3g}"


def _compiler_section(data: dict[str, Any]) -> list[str]:
    # One row per distinct compiled kernel: the launch configuration may depend on N
    # (short sequences take another tile at d = 128 on Hopper), so group the N it served.
    rows: dict[tuple, list[int]] = {}
    for k, m in data["meta"].items():
        t = data["shapes"][k].get("triton")
        if t and t.get("triton") and m["part"] in ("grid", "fp32"):
            tt = t["triton"]
            got = tuple(tt.get(f) for f in ("warps", "stages", "registers", "spills"))
            key = (m["dtype"], m["d"], m["causal"], *got, tt.get("shared_bytes"))
            rows.setdefault(key, []).append(m["n"])
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


def _write_json(
    data: dict[str, Any], summ: dict[str, Any], by_pass: dict[str, Any], path: Path
) -> None:
    def clean(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [clean(v) for v in x]
        return x

    doc = {
        "header": data["header"],
        "environment": data["sessions"][-1]["env"] if data["sessions"] else {},
        "ceilings": data["ceilings"],
        "complete": data["complete"],
        "summary": summ,  # the forward's (the key bench.json had before backward passes)
        "summary_by_pass": by_pass,
        "results": [r for row in data["shapes"].values() for r in row.values()],
    }
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(clean(doc), indent=1))
    tmp.replace(path)


def summary_text(results: str | Path) -> str:
    """The verdicts and the bf16, d = 128 tables of the rendered ``bench.md`` next to
    ``results``: what ``flashcheck bench`` prints last."""
    md = (Path(results).parent / "bench.md").read_text()
    keep = []
    for sec in md.split("\n## ")[1:]:
        title = sec.splitlines()[0]
        lead = title.split(": ")[0]
        if title == "Verdicts" or title.endswith(": verdicts") or "bf16, d = 128," in lead:
            keep.append("## " + sec.strip())
    return "\n\n".join(keep)

"""``reports/bench/<gpu>/bench.md``, ``bench.json`` and the figures, from ``results.jsonl`` only.

The markdown leads with the Triton kernel side by side with its peers — its TFLOP/s over SDPA
flash's at every shape and over cuDNN's at ``d = 128, N ≥ 4096``, and its extra memory beside
what any kernel must return — then one side-by-side table per dtype × head dim × causality, the
width sweep, the memory and wall-clock tables, fp32 with IEEE and tf32 dots, the compiler's
report on the Triton kernel, the correctness checks, and the environment
(:mod:`flashcheck.harness.bench.tables`). Backward passes (``--pass bwd``, ``fwd+bwd``) follow
in sections of their own, drawn from their own records only
(:mod:`flashcheck.harness.bench.backward_tables`).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from .backward_tables import backward_sections
from .benchrecords import BenchResults
from .option_tables import option_sections
from .shapes import PARTS
from .summary import BenchSummary, bench_summary, load_results, only_pass, passes_in
from .tables import forward_sections

__all__ = ["bench_summary", "render_bench", "summary_text"]

_METHOD = (
    "TFLOP/s below count `4·N²·d` FLOPs per head (the two GEMMs), halved for causal. "
    "Timing: CUDA events around each call after warm-up, median of ≥ 20 runs (≥ 10 for "
    "the materializing `sdpa-math`, `naive` and for `sdpa-efficient`), inputs rotated "
    "through copies larger than L2 together.{turns} A cell marked ✗ failed its oracle check "
    "and does not count; – = not run (the reason is in the results); err = the provider "
    "raised."
)
_IN_TURN = (
    " The providers of a shape were timed in turn, one call each, round after round, so "
    "that all run at the clocks of the same moments (a GPU at its power limit lowers them "
    "as it warms); `sdpa-math`, `naive` and `sdpa-efficient` alone after them."
)
_ONE_BY_ONE = " Each provider was timed on its own, one after the other."
_MIXED = (
    " Results written before the bench timed in turn ({older}) were timed one provider after "
    "the other; the rest in turn, one call each, round after round, so that all run at the "
    "clocks of the same moments; `sdpa-math`, `naive` and `sdpa-efficient` alone after them."
)


def _timing_text(everything: BenchResults) -> str:
    """How the results of every pass were timed: in turn, one by one (records written before
    the bench timed in turn carry no ``timing``), or both, naming the older passes."""
    recs = [r for row in everything.shapes.values() for r in row.values() if r.status == "ok"]
    older = sorted({r.pass_ for r in recs if r.timing is None})
    if not any(r.timing == "in turn" for r in recs):
        return _ONE_BY_ONE
    return _MIXED.format(older=", ".join(older)) if older else _IN_TURN


def _command(name: str, cfg: dict[str, Any]) -> str:
    """The ``flashcheck bench`` command that reproduces the run."""
    cmd = f"flashcheck bench --name {name}"
    if cfg.get("quick"):
        cmd += " --quick"
    if cfg.get("parts") and tuple(cfg["parts"]) != PARTS:
        cmd += "".join(f" --part {p}" for p in cfg["parts"])
    if cfg.get("providers"):
        cmd += "".join(f" --provider {p}" for p in cfg["providers"])
    cmd += "".join(f" --kernel {k}" for k in cfg.get("kernels") or ())
    for opt, field in (("pass", "passes"), ("n", "ns"), ("d", "head_dims"), ("dtype", "dtypes")):
        cmd += "".join(f" --{opt} {x}" for x in cfg.get(field) or ())
    if cfg.get("passes") and cfg.get("oracle_max_n") is not None:
        cmd += f" --grad-oracle-max-n {cfg['oracle_max_n']}"
    return cmd


def _intro(
    data: BenchResults, everything: BenchResults, name: str, env: dict[str, Any]
) -> list[str]:
    """Title, how to regenerate, the GPU, the ceilings measured (``data``, the forward's view)
    and the method (``everything``: how each pass was timed)."""
    cmd = _command(name, data.header.get("config", {}))
    L: list[str] = [f"# flashcheck bench: {name}", ""]
    L.append(
        f"Regenerate with `{cmd}` on the same GPU; re-render from the raw results without "
        f"running anything: `flashcheck bench --render-only --name {name}`. Raw results: "
        "[results.jsonl](results.jsonl); the same numbers as one JSON document: "
        "[bench.json](bench.json)."
    )
    L.append("")
    if not data.complete:
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
    for when, c in data.ceilings:
        L.append(f"| {when} | {c.matmul_bf16_tflops:.0f} | {c.copy_tbs:.2f} |")
    return [*L, "", _METHOD.format(turns=_timing_text(everything)), ""]


def _not_run(everything: BenchResults) -> list[str]:
    """What did not run, and why, grouped by provider and reason."""
    reasons: dict[tuple[str, str], list[str]] = defaultdict(list)
    for k, row in everything.shapes.items():
        for p, r in row.items():
            if r.status != "ok":
                reasons[(p, r.reason)].append(k)
    if not reasons:
        return []
    L = ["## Not run", ""]
    for (p, why), ks in sorted(reasons.items()):
        L.append(f"- {p} ({len(ks)} shapes, e.g. `{ks[0]}`): {why}")
    return [*L, ""]


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
    name = data.header.get("name", out.name)
    env = data.env
    L = _intro(data, everything, name, env)
    backward = [p for p in passes_in(everything) if p != "fwd"]
    if data.shapes or not backward:
        L += forward_sections(data, summ)
    for p in backward:
        L += backward_sections(only_pass(everything, p), p)
    L += option_sections(everything)
    L += _not_run(everything)
    L += ["## Environment", "", "| | |", "|---|---|"]
    L += [f"| {k} | {v} |" for k, v in env.items() if k != "argv"]
    L.append("")
    if figures and data.shapes:
        from .figures import make_bench_figures

        made = make_bench_figures(data, out)
        if made:
            L += ["## Figures", ""] + [f"![{m}]({m}.png)" for m in made] + [""]
    md = out / "bench.md"
    md.write_text("\n".join(L))
    by_pass = {p: bench_summary(only_pass(everything, p)) for p in passes_in(everything)}
    _write_json(everything, summ, by_pass, out / "bench.json")
    return md


def _write_json(
    data: BenchResults, summ: BenchSummary, by_pass: dict[str, BenchSummary], path: Path
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
        "header": data.header,
        "environment": data.env,
        "ceilings": [c.to_json() for _, c in data.ceilings],
        "complete": data.complete,
        "summary": summ.to_json(),  # the forward's (the key bench.json had before backward passes)
        "summary_by_pass": {p: s.to_json() for p, s in by_pass.items()},
        "results": [r.to_json() for row in data.shapes.values() for r in row.values()],
    }
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(clean(doc), indent=1))
    tmp.replace(path)


def summary_text(results: str | Path) -> str:
    """The Triton kernel beside its peers and the bf16, d = 128 tables of the rendered
    ``bench.md`` next to ``results``: what ``flashcheck bench`` prints last."""
    md = (Path(results).parent / "bench.md").read_text()
    keep = []
    for sec in md.split("\n## ")[1:]:
        title = sec.splitlines()[0]
        lead = title.split(": ")[0]
        if (
            title.endswith("side by side with its peers")
            or "bf16, d = 128," in lead
            or title.startswith("Soft-capping and sinks")
        ):
            keep.append("## " + sec.strip())
    return "\n\n".join(keep)

"""Mutation check: plant classic attention bugs in copies of the kernels and see whether the
CI-profile suite catches each one.

For every mutant the working tree is copied to a temporary directory, one kernel file is edited
there (each edit must match exactly once), and the suite's tests that exercise that kernel run
under the ``ci`` Hypothesis profile (``TRITON_INTERPRET=1``, ``-x``). A mutant is *caught* when
pytest reports a failing test; the script then checks that a case file was written and that
``flashcheck replay`` in the mutant's tree reproduces the saved verdict.

    tox -e mutation                                # all mutants, markdown table at the end
    python benchmarks/mutation_check.py            # the same, with flashcheck installed
    python benchmarks/mutation_check.py --only wrong-scale off-by-one-causal

Takes about 2 minutes on 2 cores (each caught mutant also shrinks its failing example).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from source_tree import stage

ROOT = Path(__file__).resolve().parents[1]
TRITON = "kernels/triton_flash.py"
RECUR = "kernels/recurrence.py"
ARITH = "kernels/arith.py"  # the recurrence's shared arithmetic and masks
TRITON_TESTS = ["properties", "-k", "triton and not tf32", "tests/test_triton_flash.py"]
# The forward's fused multiply-add exponent runs only where a test turns it on.
RECUR_TESTS = ["properties", "tests/test_recurrence.py", "-k", "recurrence and not fa1"]
BUILTIN = "harness/adapters/builtin.py"
# The backward's mutants are judged by the gradient properties of the suite on recurrence-fa2.
BWD_TESTS = ["properties/test_gradients.py", "-k", "recurrence-fa2"]
TRITON_BWD = "kernels/triton_flash_bwd.py"
# The Triton backward's mutants: its file's tests, then the gradient properties on triton.
TRITON_BWD_TESTS = [
    "tests/test_triton_flash_bwd.py",
    "properties/test_gradients.py",
    "-k",
    "triton and not tf32",
]

# name: (description, file, [(old, new), ...], tests)
MUTANTS = {
    "wrong-scale": (
        "default softmax scale 1/d instead of 1/sqrt(d)",
        TRITON,
        [("sc = 1.0 / math.sqrt(d) if scale is None", "sc = 1.0 / d if scale is None")],
        TRITON_TESTS,
    ),
    "dropped-rescale-acc": (
        "O accumulator not multiplied by alpha when the running max grows",
        TRITON,
        [("v, acc * alpha[:, None], input_precision", "v, acc, input_precision")],
        TRITON_TESTS,
    ),
    "dropped-rescale-l": (
        "row sum l not multiplied by alpha",
        TRITON,
        [("l_i = l_i * alpha + tl.sum(p, 1)", "l_i = l_i + tl.sum(p, 1)")],
        TRITON_TESTS,
    ),
    "max-not-subtracted": (
        "exp2(t) instead of exp2(t - m) (exact in real arithmetic, overflows for large logits)",
        TRITON,
        [
            ("shift = (m_i - m_new) * qk_scale", "shift = (m_i * 0.0) * qk_scale"),
            ("x = (s - m_new[:, None]) * qk_scale", "x = s * qk_scale"),
            ("tl.where(has, m_i, 0.0) * qk_scale", "0.0 * qk_scale"),
        ],
        TRITON_TESTS,
    ),
    "off-by-one-causal": (
        "causal mask j < i + off instead of j <= i + off",
        TRITON,
        [
            (
                "last = tl.minimum(last, rows + off)",
                "last = tl.minimum(last, rows + off - 1)",
            )
        ],
        TRITON_TESTS,
    ),
    "unmasked-tail-block": (
        "keys past Nk in the last block not masked (they score 0 and join the softmax)",
        TRITON,
        [
            (
                "keep = (cols[None, :] < NK) & (rows[:, None] >= 0)",
                "keep = (cols[None, :] < NK + BLOCK_N) & (rows[:, None] >= 0)",
            ),
            (
                "last = tl.zeros_like(rows) + (NK - 1)",
                "last = tl.zeros_like(rows) + (NK - 1 + BLOCK_N)",
            ),
        ],
        TRITON_TESTS,
    ),
    "cross-batch-offset": (
        "K pointer ignores the batch index (every batch reads batch 0's keys)",
        TRITON,
        [("k_base = K + b * skb + hk * skh", "k_base = K + hk * skh")],
        TRITON_TESTS,
    ),
    "p-not-rounded": (
        "P kept in fp32 for P·V instead of being rounded to the input dtype",
        TRITON,
        [
            (
                "tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)",
                "tl.dot(p, v.to(tl.float32), acc * alpha[:, None], input_precision=PRECISION)",
            )
        ],
        TRITON_TESTS,
    ),
    "p-rounded-in-denominator": (
        "the row sum adds P rounded to the input dtype (rounded twice: numerator and denominator)",
        TRITON,
        [
            (
                "l_i = l_i * alpha + tl.sum(p, 1)",
                "l_i = l_i * alpha + tl.sum(p.to(q.dtype).to(tl.float32), 1)",
            )
        ],
        TRITON_TESTS,
    ),
    "cap-product-twice": (
        "soft-cap: the cap's product by cap·log2 e applied to the fused exponent's input too",
        TRITON,
        [
            (
                "        if not CAP_FMA:\n            s = s * c2",
                "        if True:\n            s = s * c2",
            )
        ],
        TRITON_TESTS,
    ),
    "lse-wrong-base": (
        "LSE returned in log2 units (the ln 2 factor dropped)",
        TRITON,
        [("* 0.6931471805599453,", "* 1.0,")],
        TRITON_TESTS,
    ),
    "recurrence-dropped-rescale": (
        "numpy recurrence: FA2 accumulator not rescaled",
        RECUR,
        [("acc = (alpha[:, None] * acc + pv).astype(da)", "acc = (acc + pv).astype(da)")],
        RECUR_TESTS,
    ),
    "recurrence-off-by-one-window": (
        "numpy recurrence: window's left edge off by one",
        ARITH,
        [("keep &= j >= i + off - left", "keep &= j > i + off - left")],
        RECUR_TESTS,
    ),
    "bwd-ds-not-rounded": (
        "backward: dS kept in fp32 for dQ and dK instead of being rounded to the input dtype",
        RECUR,
        [("dsp = dsc.astype(dp)", "dsp = dsc")],
        BWD_TESTS,
    ),
    "bwd-d-from-unrounded-o": (
        "backward: D = rowsum(dO * O) from the forward's fp32 O, not the rounded O it returned",
        BUILTIN,
        [
            (
                "bwd_policy = PrecisionPolicy.flash(format_of(q.dtype).name)",
                "bwd_policy = PrecisionPolicy(input=format_of(q.dtype).name, "
                "p=format_of(q.dtype).name, output='fp32')",
            ),
            (
                "q, k, v, o, lse, do, policy=bwd_policy, block_q=16,",
                "q, k, v, o, lse, do.astype(np.float32), policy=bwd_policy, block_q=16,",
            ),
        ],
        BWD_TESTS,
    ),
    "bwd-missing-dq-scale": (
        "backward: dQ not multiplied by the softmax scale",
        RECUR,
        [("dq = (dq_acc * sc_a).astype(da).astype(dout)", "dq = dq_acc.astype(dout)")],
        BWD_TESTS,
    ),
    "bwd-missing-dk-scale": (
        "backward: dK not multiplied by the softmax scale",
        RECUR,
        [
            (
                "dk[b, g, cols] = (dk_acc * sc_a).astype(da).astype(dout)",
                "dk[b, g, cols] = dk_acc.astype(dout)",
            )
        ],
        BWD_TESTS,
    ),
    "bwd-gqa-wrong-heads": (
        "backward: dK, dV of kv head g summed over query heads g..g+G-1 instead of its group",
        RECUR,
        [("for h in range(g * group, (g + 1) * group):", "for h in range(g, g + group):")],
        BWD_TESTS,
    ),
    "bwd-masked-ds-not-zeroed": (
        "backward: dS uses exp2(t - LSE) for masked entries too (P zeroed for dV only)",
        RECUR,
        [
            (
                "dsc = (p * (dpm - dsum_b[:, None]).astype(da)).astype(da)",
                "dsc = (_exp((t - np.where(live, lse_b, da.type(0))[:, None]).astype(da), "
                "policy.exp, da) * (dpm - dsum_b[:, None]).astype(da)).astype(da)",
            )
        ],
        BWD_TESTS,
    ),
    "triton-bwd-ds-not-rounded": (
        "Triton backward: dS kept in fp32 for dQ and dK instead of being rounded to the input",
        TRITON_BWD,
        [
            (
                "dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)",
                "dq += tl.dot(ds, k.to(tl.float32), input_precision=PRECISION)",
            ),
            (
                "dk += tl.dot(dst.to(q.dtype), q, input_precision=PRECISION)",
                "dk += tl.dot(dst, q.to(tl.float32), input_precision=PRECISION)",
            ),
        ],
        TRITON_BWD_TESTS,
    ),
    "triton-bwd-d-products-rounded": (
        "Triton backward: D summed from dO·O products rounded to the input dtype, not in fp32",
        TRITON_BWD,
        [
            (
                "delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)",
                "delta = tl.sum((do * o).to(tl.float32), 1)",
            )
        ],
        TRITON_BWD_TESTS,
    ),
    "triton-bwd-missing-dq-scale": (
        "Triton backward: dQ not multiplied by the softmax scale",
        TRITON_BWD,
        [("dq = dq * sm_scale", "dq = dq * 1.0")],
        TRITON_BWD_TESTS,
    ),
    "triton-bwd-missing-dk-scale": (
        "Triton backward: dK not multiplied by the softmax scale",
        TRITON_BWD,
        [("dk = dk * sm_scale", "dk = dk * 1.0")],
        TRITON_BWD_TESTS,
    ),
    "triton-bwd-gqa-wrong-heads": (
        "Triton backward: dK, dV of kv head g summed over query heads g..g+G-1, not its group",
        TRITON_BWD,
        [("h = hk * GROUP + hh", "h = hk + hh")],
        TRITON_BWD_TESTS,
    ),
    "triton-bwd-masked-ds-not-zeroed": (
        "Triton backward: dS uses exp2(S·c − lse2) at masked entries too (P zeroed for dV only)",
        TRITON_BWD,
        [
            (
                "ds = p * (dp - delta[:, None])",
                "ds = tl.math.exp2(s * qk_scale - lse2[:, None]) * (dp - delta[:, None])",
            ),
            (
                "dst = pt * (dpt - delta[None, :])",
                "dst = tl.math.exp2(st * qk_scale - lse2[None, :]) * (dpt - delta[None, :])",
            ),
        ],
        TRITON_BWD_TESTS,
    ),
}


def _copy_tree(dst: Path) -> None:
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for rel in files:
        src = ROOT / rel
        if src.is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)


# Mutants each caught within seconds by one narrow selection of tests: what the test suite runs
# (tests/test_mutants.py) to show the mutation check itself still catches bugs.
FAST = {
    "bwd-missing-dq-scale": [
        "properties/test_gradients.py",
        "-k",
        "recurrence-fa2 and backward_bugs_live_in and masked",
    ],
    "recurrence-dropped-rescale": [
        "properties/test_accuracy.py",
        "-k",
        "recurrence-fa2-fp16",
    ],
}


def run_mutant(name: str, timeout: int, tests: list[str] | None = None) -> dict:
    """Plant mutant ``name`` in a copy of the tree and run ``tests`` (default: the mutant's
    own) there; ``caught`` when pytest reports a failing test."""
    desc, rel, edits, own = MUTANTS[name]
    tests = own if tests is None else tests
    with tempfile.TemporaryDirectory(prefix=f"mutant-{name}-") as tmp:
        tree = Path(tmp)
        _copy_tree(tree)
        path = tree / rel
        text = path.read_text()
        for old, new in edits:
            if text.count(old) != 1:
                raise SystemExit(f"mutant {name}: pattern found {text.count(old)} times: {old!r}")
            text = text.replace(old, new)
        path.write_text(text)
        cases = tree / "cases"
        # The mutated tree's code shadows the installed flashcheck (same import names).
        staged = stage(tree, tree / ".staged")
        env = dict(
            os.environ,
            FLASHCHECK_PROFILE="ci",
            TRITON_INTERPRET="1",
            FLASHCHECK_CASE_DIR=str(cases),
            PYTHONPATH=str(staged),
        )
        t0 = time.time()
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                cwd=tree,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            rc, out = proc.returncode, proc.stdout
        except subprocess.TimeoutExpired:
            rc, out = -1, ""
        secs = time.time() - t0
        failed = [ln for ln in out.splitlines() if ln.startswith("FAILED")]
        result = {
            "mutant": name,
            "description": desc,
            "rc": rc,
            "seconds": round(secs),
            "caught": rc == 1,
            "first_failure": failed[0][7:] if failed else "",
        }
        saved = sorted(cases.glob("*.json")) if cases.exists() else []
        result["case"] = saved[0].stem if saved else None
        if saved:
            rec = json.loads(saved[0].read_text())
            rep = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "flashcheck.harness.cli",
                    "replay",
                    saved[0].stem,
                    "--dir",
                    str(cases),
                ],
                cwd=tree,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            recorded = (rec.get("verdict") or {}).get("verdict")
            same = "(same verdict)" in rep.stdout
            prop = rec["context"].get("property")
            result["replay"] = (
                f"{recorded} -> same"
                if same
                else f"property {prop} (no verdict record), replay rc {rep.returncode}"
            )
        return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", default=None, help="mutant names (default: all)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per mutant")
    args = ap.parse_args()
    names = args.only or list(MUTANTS)
    for n in names:
        if n not in MUTANTS:
            raise SystemExit(f"unknown mutant {n!r}; choose from {', '.join(MUTANTS)}")
    rows = []
    for i, n in enumerate(names, 1):
        print(f"[{i}/{len(names)}] {n} ...", flush=True)
        r = run_mutant(n, args.timeout)
        print(
            f"    caught={r['caught']} rc={r['rc']} {r['seconds']} s {r['first_failure']}",
            flush=True,
        )
        rows.append(r)
    print("\n| mutant | planted bug | caught | first failing test | case replay | s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        mark = "yes" if r["caught"] else "NO"
        first = r["first_failure"] or "-"
        print(
            f"| {r['mutant']} | {r['description']} | {mark} | {first} | "
            f"{r.get('replay', '-')} | {r['seconds']} |"
        )
    caught = sum(r["caught"] for r in rows)
    print(f"\n{caught}/{len(rows)} planted bugs caught")
    return 0 if caught == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())

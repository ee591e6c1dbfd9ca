"""A synthetic ``flashcheck bench`` results file, for the renderer's tests (no GPU needed)."""

from flashcheck.harness.bench.suite import TOKENS, Shape
from flashcheck.harness.core.resultlog import ResultLog


def synthetic_results(path, *, complete=True, triton_verdict="PASS", kernels=None):
    """A results file as flashcheck bench writes it, with made-up speeds; ``kernels``: a
    user's kernels' grid TFLOP/s by name (``--kernel``), as ``{name: (at 1024, at 4096)}``."""
    config = {"parts": ["grid", "memory"], "quick": True, "seed": 0, "providers": None}
    if kernels:
        config["kernels"] = list(kernels)
    header = {"tool": "flashcheck bench", "name": "fake", "config": config}
    with ResultLog.open(path, header, fresh=True) as log:
        log.append({"type": "session", "env": {"gpu": "Fake GPU", "torch": "x"}})
        log.append(
            {
                "type": "ceilings",
                "matmul_bf16_tflops": 700.0,
                "matmul_n": 8192,
                "copy_tbs": 3.0,
                "copy_bytes": 2**30,
            }
        )
        speeds = {"triton": 500.0, "sdpa-flash": 350.0, "sdpa-cudnn": 600.0}
        compiled = {"stages": 2, "registers": 128, "spills": 0, "shared_bytes": 98304}
        for i, n in enumerate((1024, 4096)):
            shape = Shape("grid", "bf16", TOKENS // n, 16, n, 128, False)
            mine = {name: tfs[i] for name, tfs in (kernels or {}).items()}
            for prov, tf in {**speeds, **mine}.items():
                verdict = triton_verdict if prov == "triton" else "PASS"
                # The compiler's report, as on Hopper: short sequences take another tile.
                tile = {"warps": 8 if n <= 2048 else 16, **compiled}
                info = {"triton": tile} if prov == "triton" else {}
                log.append(
                    {
                        "type": "speed",
                        "key": shape.key,
                        "provider": prov,
                        **shape.as_dict(),
                        "status": "ok",
                        "ms": shape.flops / tf / 1e9,
                        "tflops": tf,
                        "runs": 20,
                        "spread": 0.01,
                        **info,
                        "check": {
                            "verdict": verdict,
                            "max_ulp": 0.5,
                            "naive_ulp": 0.5,
                            "det_util": 0.1,
                            "reasons": [],
                            "rows": 12,
                        },
                    }
                )
            log.append(
                {
                    "type": "speed",
                    "key": shape.key,
                    "provider": "sdpa-math",
                    **shape.as_dict(),
                    "status": "skipped",
                    "reason": "too big",
                }
            )
            log.append({"type": "shape-done", "key": shape.key})
        shape = Shape("memory", "bf16", 1, 8, 1024, 128, False)
        for prov, extra in (("triton", 2 * 2**20 + 32768), ("naive", 80 * 2**20)):
            log.append(
                {
                    "type": "speed",
                    "key": shape.key,
                    "provider": prov,
                    **shape.as_dict(),
                    "status": "ok",
                    "ms": 0.1,
                    "tflops": 10.0,
                    "runs": 20,
                    "spread": 0.0,
                    "peak_extra_bytes": extra,
                    "out_bytes": 2 * 2**20,
                    "lse_bytes": 32768,
                    "check": {
                        "verdict": "PASS",
                        "max_ulp": 0.5,
                        "naive_ulp": 0.5,
                        "det_util": 0.1,
                        "reasons": [],
                        "rows": 12,
                    },
                }
            )
        if complete:
            log.append({"type": "complete"})

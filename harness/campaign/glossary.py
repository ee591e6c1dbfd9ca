"""The words flashcheck's outputs use, defined once: the report's header folds them in, and
docs/glossary.md is this module's output (``python -m flashcheck.harness.campaign.glossary``;
a test keeps the two equal)."""

from __future__ import annotations

__all__ = ["GLOSSARY", "glossary_markdown"]

GLOSSARY: dict[str, str] = {
    "oracle": "the exact attention output and log-sum-exp, computed in multiple precision with a "
    "certified error bound, and correctly rounded to the kernel's format",
    "floored ULP error": "|kernel − exact| in units in the last place of the output format, "
    "where the unit is that of the larger of |exact value| and its floor W_c: an error "
    "relative to the size of the terms that made the value, not to a value that cancelled",
    "W_c (floor)": "Σ_j p_j |v_jc| for output column c: the magnitude of what the softmax "
    "averaged. When it and the exact value are both 0 or tiny, the unit is the format's "
    "smallest subnormal, and ULP errors become astronomically large (the tables mark them)",
    "deterministic bound": "the largest error a kernel of the declared arithmetic class can "
    "make on this input, proven from its roundings (docs/error-bounds.md). An error above it "
    "is FAIL-HARD: no rounding explains it",
    "probabilistic bound": "the error such a kernel stays below with overwhelming probability "
    "when its rounding errors behave like independent random variables (much tighter)",
    "bound utilization": "max |error| / bound over the elements of one output; above 1 for the "
    "deterministic bound is FAIL-HARD; ∞ when the kernel returned NaN/Inf where the exact value "
    "is finite",
    "naive kernel, E_naive": "the textbook softmax(QKᵀ)V computed in the input format (the "
    "same-precision baseline), emulated exactly; E_naive is its largest floored ULP error on "
    "the same case",
    "naive ratio": "the kernel's largest floored ULP error / E_naive: how much worse than the "
    "plain same-precision formula it is",
    "empirical rule": "FAIL when an error exceeds both 2·E_naive + 1 floored ulp and the "
    "probabilistic bound",
    "arithmetic class": "how a kernel rounds: flash (FlashAttention-2: S in fp32, P rounded to "
    "the input format before P·V, fp32 accumulation), flash-fa1, naive, tf32 (fp32 inputs with "
    "tf32 products), or unknown (judged against the loosest class at its format's precision)",
    "precision floor": "a kernel that declares no class is held to the classes at or above its "
    "input format's precision; errors that fit only a lower one (tf32 products for fp32 inputs) "
    "are FAIL-HARD unless that class is declared",
    "conformance": "a flash-class kernel compared, on one key block, with an exact emulation of "
    "that class's roundings; a difference means the kernel computes differently from what it "
    "declares (often: more precisely, e.g. P kept in fp32)",
    "PASS / FAIL / FAIL-HARD": "within the bounds and the empirical rule / above the empirical "
    "rule / above the deterministic bound, or NaN/Inf where the exact value is finite",
    "BAD-OUTPUT / ERROR / TIMEOUT": "the kernel returned the wrong shape or type / raised / did "
    "not return within the time limit, on an input inside its contract",
    "SKIP / NOT-APPLICABLE": "the input lies outside the kernel's contract, or the property has "
    "nothing to test on it; never counted as a pass",
    "convention difference": "the output departs from flashcheck's conventions (e.g. NaN for a "
    "row that keeps no key, where flashcheck and FlashAttention give O = 0), not a numerical "
    "error",
    "contract": "what a kernel accepts and promises (dtypes, head dims, masks, GQA, lengths, "
    "determinism, batch invariance, NaN policy), declared with flashcheck.kernel or probed on "
    "tiny inputs; every generated input lies inside it",
    "batch invariance": "a sequence's outputs bitwise the same computed alone and inside "
    "batches; measured for every kernel, gated only when declared",
    "integrity": "a call leaves its inputs (and dO) bitwise unchanged, and a returned result "
    "does not change when the kernel is called again",
    "case file, replay": "the exact bits of a failing input and its record, saved under "
    "reports/cases/<id>; flashcheck replay <id> re-runs the check it was saved for",
}


def glossary_markdown() -> list[str]:
    """The glossary as markdown lines: one bullet per term."""
    return [f"- **{term}**: {text}." for term, text in GLOSSARY.items()]


if __name__ == "__main__":  # writes docs/glossary.md
    print("# Glossary\n")
    print("The words of flashcheck's reports, terminal output and replays.\n")
    print("\n".join(glossary_markdown()))

"""Tables, figures, replays and the headline never show a NaN/Inf failure as a small number,
and numbers past any sane range carry their reason (checked through the data the report and
the figures are drawn from, not through pixels)."""

import math

import numpy as np

import flashcheck
from flashcheck.harness.campaign.figures import unbinned, utilization_points
from flashcheck.harness.campaign.logrecords import CampaignConfig, Header, ResultsFile
from flashcheck.harness.campaign.render import render_report
from flashcheck.harness.campaign.resultrecords import (
    AccuracyResult,
    CaseOptions,
    CaseShape,
    Metrics,
    StructuralResult,
)
from flashcheck.harness.campaign.tables import HUGE_MARK, HUGE_NOTE, verdict_table
from flashcheck.harness.cases.families import Recipe
from flashcheck.harness.core.resultlog import ResultLog
from flashcheck.harness.core.status import Status


def _res(status, cls=AccuracyResult, kernel="k", **kw):
    return cls(
        key=f"{kernel}-{status}-{len(kw)}",
        part="structural" if cls is StructuralResult else "grid",
        tag="t",
        kernel=kernel,
        dtype="fp16",
        device="cpu",
        family="randn",
        recipe=Recipe("fp16", "randn", 1, 1, 1, 4, 4, 8, 8, 0),
        shape=CaseShape(1, 1, 1, 4, 4, 8, 8),
        options=CaseOptions(),
        status=Status(status),
        **kw,
    )


def _data(*rows):
    config = CampaignConfig("t", "smoke", 0, ("k",), ("fp16",), "cpu")
    acc = tuple(r for r in rows if isinstance(r, AccuracyResult))
    struct = tuple(r for r in rows if isinstance(r, StructuralResult))
    return ResultsFile(Header(config, "flashcheck report"), results=acc, structural=struct)


# A FAIL-HARD for NaN outputs whose finite elements are well within the bound (as files
# written before the verdict recorded an infinite utilization carry it), and a PASS.
NAN_CASE = Metrics(
    max_ulp=math.nan, det_util=0.27, naive_ratio=None, nonfinite_mismatches=944, count=2064
)
FINE = Metrics(max_ulp=0.8, det_util=0.05, naive_ratio=0.5, nonfinite_mismatches=0, count=64)


def test_a_nan_output_is_an_infinite_utilization_in_tables_and_figures():
    data = _data(
        _res("FAIL-HARD", metrics=NAN_CASE, reasons=("NaN",)),
        _res("PASS", metrics=FINE, reasons=()),
    )
    row = verdict_table(data, ["k"], ["fp16"])[2]
    cells = [c.strip() for c in row.split("|")]
    assert cells[11] == "NaN" and cells[12] == "∞", row  # max ULP, max bound util.
    ((finite, n_inf),) = utilization_points(data, ["k"], ["fp16"])["fp16"].values()
    assert finite == [0.05] and n_inf == 1
    assert unbinned(data, "fp16") == (944, 1)


def test_the_verdict_records_an_infinite_utilization_for_nan_outputs():
    def half_nan(q, k, v, *, causal=False, scale=None):
        o = flashcheck.oracle(q.numpy(), k.numpy(), v.numpy()).o.rounded.astype(np.float16)
        o[..., 0] = np.nan
        import torch

        return torch.from_numpy(o)

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, 8, 8)).astype(np.float16) for _ in range(3))
    res = flashcheck.check(half_nan, q, k, v, save="never")
    assert res.verdict.verdict == "FAIL-HARD" and math.isinf(res.verdict.det_util)
    text = str(res)
    assert "bound utilization det ∞, prob ∞" in text, text
    assert "NaN/Inf where the exact value is finite: 8 of 64 elements; over the other" in text
    assert "RMSE 0," not in text.split("over the other elements")[0]


def test_the_empirical_reason_gives_its_own_elements_largest_error_beside_a_nan():
    # One element off by far more than the naive error and one NaN: the FAIL reason reports
    # the off element's error, not the NaN (a user read "(max nan ulp vs naive 1.1)").
    def off_and_nan(q, k, v, *, causal=False, scale=None):
        import torch

        o = flashcheck.oracle(q.numpy(), k.numpy(), v.numpy()).o.rounded.astype(np.float32)
        o[0, 0, 0, 0] += 1e-4
        o[0, 0, 1, 1] = np.nan
        return torch.from_numpy(o)

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, 8, 8)).astype(np.float32) for _ in range(3))
    res = flashcheck.check(off_and_nan, q, k, v, save="never")
    fail = [r for r in res.verdict.reasons if r.startswith("FAIL: ")]
    assert fail and "max nan" not in fail[0] and "max inf" not in fail[0], res.verdict.reasons


def test_nonfinite_pairs_on_nonfinite_inputs_are_told_apart_from_failures():
    # An inf input: the exact O of its rows is NaN (the NaN rule); a kernel that gives +inf
    # there is counted apart, as what the NaN rule judges, not as NaN/Inf where the exact
    # value is finite.
    def inf_for_nan(q, k, v, *, causal=False, scale=None):
        import torch

        ref = flashcheck.oracle(q.numpy(), k.numpy(), v.numpy()).o.rounded.astype(np.float16)
        return torch.from_numpy(np.where(np.isnan(ref), np.float16(np.inf), ref))

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, 8, 8)).astype(np.float16) for _ in range(3))
    v[0, 0, 3, 2] = np.inf
    text = str(flashcheck.check(inf_for_nan, q, k, v, save="never"))
    assert "where the exact value is finite" not in text, text
    assert "8 of 64 elements where the exact value is NaN/Inf and the kernel's is another" in text


def test_huge_magnitudes_carry_their_reason():
    huge = Metrics(max_ulp=3.05e45, det_util=0.5, naive_ratio=1.33e61, nonfinite_mismatches=0)
    lines = verdict_table(_data(_res("PASS", metrics=huge, reasons=())), ["k"], ["fp16"])
    assert f"3.05e+45{HUGE_MARK}" in lines[2] and f"1.33e+61{HUGE_MARK}" in lines[2], lines[2]
    assert lines[-1] == HUGE_NOTE
    plain = verdict_table(_data(_res("PASS", metrics=FINE, reasons=())), ["k"], ["fp16"])
    assert HUGE_NOTE not in plain


def test_the_headline_counts_each_kind_of_result_as_the_tables_do(tmp_path):
    data = _data(
        _res("PASS", metrics=FINE, reasons=()),
        _res("FAIL", cls=StructuralResult, property="nan-rule", reasons=("leak",)),
    )
    path = tmp_path / "results.jsonl"
    with ResultLog.open(path, data.header.to_json()) as log:
        for r in data.every_result:
            log.append(r.to_json())
    md = render_report(path, figures=False).read_text()
    assert "**2 results**: accuracy 1 (1 PASS); structural 1 (1 FAIL)." in md, md[:800]


def test_a_report_without_matplotlib_is_written_and_says_its_figures_are_left_out(
    tmp_path, monkeypatch
):
    import sys

    data = _data(_res("PASS", metrics=FINE, reasons=()))
    path = tmp_path / "results.jsonl"
    with ResultLog.open(path, data.header.to_json()) as log:
        for r in data.every_result:
            log.append(r.to_json())
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what find_spec sees uninstalled
    md = render_report(path).read_text()
    assert "*Figures left out: matplotlib is not installed (pip install 'flashcheck[report]'" in md
    assert not list(tmp_path.glob("*.png"))


def test_the_glossary_in_the_docs_is_the_one_the_report_prints(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    from flashcheck.harness.campaign.glossary import GLOSSARY

    docs = Path(__file__).resolve().parents[1] / "docs" / "glossary.md"
    out = subprocess.run(
        [sys.executable, "-m", "flashcheck.harness.campaign.glossary"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert docs.read_text() == out, "regenerate: python -m flashcheck.harness.campaign.glossary"
    for term in ("W_c (floor)", "bound utilization", "naive ratio", "conformance"):
        assert term in GLOSSARY

"""`flashcheck report` on FP8 kernels defined outside the package (tests/user/user_fp8.py), run
as a user runs it: the installed command, in a folder holding nothing but the user's module."""

import json
import shutil
from pathlib import Path

import pytest
from cli_helpers import run_flashcheck

pytestmark = pytest.mark.slow  # a subprocess per campaign: a few seconds each

HERE = Path(__file__).parent / "user"


@pytest.fixture
def user_dir(tmp_path):
    shutil.copy(HERE / "user_fp8.py", tmp_path / "user_fp8.py")
    return tmp_path


def _report(kernel, user_dir):
    out = run_flashcheck(
        ["report", "--kernel", f"user_fp8:{kernel}", "--preset", "smoke"], user_dir
    )
    return out, out.stdout + out.stderr


def test_correct_fp8_kernel_exits_0_with_table3(user_dir):
    out, text = _report("good", user_dir)
    assert out.returncode == 0, text
    report = (user_dir / "reports/user_fp8-good/error-report.md").read_text()
    assert "| FAIL" not in report and "| PASS |" in report
    assert "## FP8: FlashAttention-3's Table 3" in report and "| user_fp8:good | e4m3 |" in report
    assert "FP8 baseline: 0.024" in report
    # Written case by case: the same command resumes (nothing judged twice); another
    # configuration under the same name is refused.
    results = user_dir / "reports/user_fp8-good/results.jsonl"
    lines = results.read_text().splitlines()
    assert sum('"fp8-result"' in x for x in lines) > 0
    again, text = _report("good", user_dir)
    assert again.returncode == 0, text
    assert results.read_text().splitlines() == lines
    other = run_flashcheck(
        ["report", "--kernel", "user_fp8:good", "--preset", "cpu", "--name", "user_fp8-good"],
        user_dir,
    )
    assert other.returncode == 2 and "another configuration" in other.stderr


def test_kernel_written_to_the_docs_gets_all_three_descales(user_dir):
    # docs/api.md promises three float32 descales; the families that set only descale_k
    # (fp8_flush, fp8_p_ties, fp8_uniform_long) handed this kernel None for the others, and
    # `descale_q.float()` raised: three ERRORs and exit 1 for a correct kernel.
    out, text = _report("docs_style", user_dir)
    assert out.returncode == 0, text
    assert "ERROR" not in text
    report = (user_dir / "reports/user_fp8-docs_style/error-report.md").read_text()
    for family in ("fp8_flush", "fp8_p_ties", "fp8_uniform_long"):
        assert f"| {family} |" in report
    assert "| FAIL" not in report and "| ERROR" not in report


def test_p_in_e5m2_exits_1_with_the_precision_reason_and_replays(user_dir):
    out, text = _report("p_e5m2", user_dir)
    assert out.returncode == 1, text
    assert "precision below flash-fp8: the errors fit the bounds of P quantized to e5m2" in text
    saved = sorted((user_dir / "reports/user_fp8-p_e5m2/cases").glob("*.json"))
    record = json.loads(saved[0].read_text())
    assert record["dtype"] == "e4m3" and record["kernel"] == "user_fp8:p_e5m2"
    rep = run_flashcheck(["replay", record["id"], "--dir", str(saved[0].parent)], user_dir)
    assert "(same verdict)" in rep.stdout, rep.stdout + rep.stderr


def test_descale_applied_twice_exits_1_naming_the_descale(user_dir):
    out, text = _report("descale_twice", user_dir)
    assert out.returncode == 1, text
    assert "consistent with descale_v applied twice" in text


def test_descales_never_applied_are_named_on_every_family(user_dir):
    # A user's kernel ignoring all three descales was read as descale_v left out on one
    # family, descale_v applied twice (the opposite) on two, descale_k left out on two.
    out, text = _report("ignores_descales", user_dir)
    assert out.returncode == 1, text
    failed = [x for x in text.splitlines() if x.startswith("FAIL")]
    # (fp8_uniform_long sets no descale: there ignoring them is right)
    assert len(failed) == 5, text
    for line in failed:
        assert "all three descales left out" in line, line
        assert "applied twice" not in line, line


def test_property_suite_refuses_fp8_kernels_with_the_command_to_run(user_dir):
    out = run_flashcheck(["test", "user_fp8:good"], user_dir)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "flashcheck report --kernel user_fp8:good" in out.stderr


def test_fp8_kernel_modifying_its_input_fails_hard(user_dir):
    out, text = _report("scales_v_in_place", user_dir)
    assert out.returncode == 1, text
    assert "FAIL-HARD: the kernel modified its input(s) v" in text


def test_fp8_kernel_without_descale_keywords_is_a_usage_error(user_dir):
    out, text = _report("no_descales", user_dir)
    assert out.returncode == 2, text
    assert "takes no descale_k, descale_q, descale_v keyword" in text


def test_a_hanging_fp8_kernel_is_stopped_and_the_report_goes_on(user_dir):
    args = ["report", "--kernel", "user_fp8:hangs_when_long", "--preset", "smoke"]
    out = run_flashcheck([*args, "--timeout", "2"], user_dir)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "TIMEOUT user_fp8:hangs_when_long e4m3 fp8_uniform_long" in text
    report = (user_dir / "reports/user_fp8-hangs_when_long/error-report.md").read_text()
    # Table 3's sequence hangs too: its row says so, and the table goes on
    assert "| user_fp8:hangs_when_long | e4m3 | – | – | KernelHung: " in report
    assert "| flash-fp8-numpy | e4m3 | 0." in report
    saved = sorted((user_dir / "reports/user_fp8-hangs_when_long/cases").glob("*.json"))
    rep = run_flashcheck(
        ["replay", saved[0].stem, "--dir", str(saved[0].parent), "--timeout", "2"], user_dir
    )
    assert rep.returncode == 1 and "replayed: TIMEOUT (same verdict)" in rep.stdout, rep.stdout

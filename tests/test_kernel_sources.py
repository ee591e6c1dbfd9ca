"""A campaign resumed after its kernel's source changed is refused, not finished with the old
code's results under the new code's name."""

import importlib
import textwrap
from dataclasses import replace

import pytest

from flashcheck.harness.adapters.adapter import Kernel
from flashcheck.harness.campaign.kernel_sources import ENV_KEY, check_unchanged, source_digests
from flashcheck.harness.campaign.report import ReportOptions, run_report
from flashcheck.harness.core.resultlog import ResultLogError, read_records

KERNEL = textwrap.dedent(
    """
    import torch


    def good(q, k, v, *, causal=False, scale=None):
        d = q.shape[-1]
        s = (q.float() @ k.float().transpose(-1, -2)) * (d ** -0.5 if scale is None else scale)
        if causal:
            nq, nk = q.shape[2], k.shape[2]
            keep = torch.arange(nk)[None, :] <= torch.arange(nq)[:, None] + (nk - nq)
            s = s.masked_fill(~keep, float("-inf"))
        p = torch.softmax(s, -1)
        if causal:  # a row that keeps no key is 0; NaN inputs still give NaN
            p = torch.where(keep.any(-1, keepdim=True), p, torch.zeros_like(p))
        return (p @ v.float()).to(q.dtype)
    """
)


def _quiet(*args, **kwargs) -> None:
    """An ``echo`` that prints nothing."""


def test_the_digests_follow_the_defining_file_and_its_projects_modules(tmp_path, monkeypatch):
    pkg = tmp_path / "digest_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helper.py").write_text("def twice(x):\n    return 2 * x\n")
    (pkg / "entry.py").write_text(
        "from digest_pkg.helper import twice\n\n\ndef fn(q, k, v):\n    return twice(q)\n"
    )
    monkeypatch.syspath_prepend(tmp_path)
    from digest_pkg import entry

    kern = {"digest_pkg.entry:fn": Kernel("k", entry.fn)}
    first = source_digests(kern)["digest_pkg.entry:fn"]
    assert set(first) == {"digest_pkg/__init__.py", "digest_pkg/entry.py", "digest_pkg/helper.py"}
    assert all(d.startswith("sha256:") for d in first.values())
    (pkg / "helper.py").write_text("def twice(x):\n    return x + x\n")
    second = source_digests(kern)["digest_pkg.entry:fn"]
    assert second["digest_pkg/helper.py"] != first["digest_pkg/helper.py"]
    assert second["digest_pkg/entry.py"] == first["digest_pkg/entry.py"]
    # A function with no file (a builtin) has no digest and is never refused.
    assert source_digests({"b": Kernel("b", len)}) == {}
    # flashcheck's own kernels: the adapter's file and the loaded modules of the kernels
    # folder, named from the package.
    from flashcheck.harness.adapters.registry import resolve

    importlib.import_module("flashcheck.kernels.naive")  # (else loaded on a first call)

    own = source_digests({"naive-numpy": resolve("naive-numpy")})["naive-numpy"]
    assert {"harness/adapters/builtin.py", "kernels/naive.py"} <= set(own)
    assert all(f.startswith(("harness/adapters/", "kernels/")) for f in own)


def test_check_unchanged_names_the_kernel_its_results_and_the_changed_file():
    files = {"m.py": "sha256:aaaa", "h.py": "sha256:1111"}
    records = [
        {"type": "header"},
        {"type": "session", "env": {ENV_KEY: {"m:f": files, "m:g": {"m.py": "sha256:aaaa"}}}},
        {"type": "contract", "kernel": "m:f"},
        {"type": "result", "kernel": "m:f", "status": "PASS"},
        {"type": "result", "kernel": "m:f", "status": "FAIL"},
        {"type": "result", "kernel": "m:g", "status": "PASS"},
    ]
    check_unchanged(records, {"m:f": files}, "r.jsonl")
    check_unchanged(records, {"other:h": {"h.py": "sha256:0"}}, "r.jsonl")  # not on file
    # A file only one run loaded is not compared; older files (no record) resume.
    check_unchanged(records, {"m:f": {**files, "lazy.py": "sha256:9"}}, "r.jsonl")
    check_unchanged(records[:1] + records[2:], {"m:f": {"m.py": "x"}}, "r.jsonl")
    with pytest.raises(ResultLogError) as err:
        check_unchanged(records, {"m:f": {**files, "h.py": "sha256:2222"}}, "r.jsonl")
    msg = str(err.value)
    # (h.py is another module of m.py's folder: said so, and why it counts; a user read that
    # an unchanged kernel's own source had changed)
    assert "m:f (2 results): its folder's h.py (sha256:1111 then, sha256:2222 now)" in msg
    assert "modules loaded from its folder or package" in msg
    assert "m:g" not in msg and "--fresh" in msg and "--name" in msg
    with pytest.raises(ResultLogError) as err:
        check_unchanged(records, {"m:f": {**files, "m.py": "sha256:bbbb"}}, "r.jsonl")
    assert "m:f (2 results): its own file m.py (sha256:aaaa then" in str(err.value)
    assert "loaded from its folder" not in str(err.value)


def test_a_report_resumed_after_its_kernel_was_edited_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "edited_kernel.py"
    path.write_text(KERNEL)
    monkeypatch.syspath_prepend(tmp_path)
    opts = ReportOptions(
        name="r",
        preset="smoke",
        kernels=("edited_kernel:good",),
        dtypes=("fp16",),
        out=str(tmp_path / "out"),
        isolate=False,
        render=False,
    )
    assert run_report(opts, echo=_quiet) == 0
    results = tmp_path / "out" / "r" / "results.jsonl"
    sessions = [r for r in read_records(results) if r.get("type") == "session"]
    assert sessions[0]["env"][ENV_KEY]["edited_kernel:good"]["edited_kernel.py"].startswith(
        "sha256:"
    )
    assert run_report(opts, echo=_quiet) == 0  # the same source: resumes
    path.write_text(KERNEL + "\n# a fix\n")
    with pytest.raises(
        ResultLogError, match=r"edited_kernel:good \(\d+ results\): its own file edited_kernel"
    ):
        run_report(opts, echo=_quiet)
    assert run_report(replace(opts, fresh=True), echo=_quiet) == 0

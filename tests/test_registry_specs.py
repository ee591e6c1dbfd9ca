"""What ``resolve`` says about a kernel spec it cannot use as written: a misspelled name, a
dotted path, a function of another layout or with too few arguments (usage errors, before any
probe calls the function); and ``flashcheck kernels SPEC``, which shows a spec's contract."""

import sys
import textwrap

import pytest

from flashcheck.harness.adapters.registry import resolve

USER = """
def attn(q, k, v, *, causal=False, scale=None):
    return q

def two_args(q, k):
    return q

def causal_required(q, k, v, causal):
    return q

def varlen_fn(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False):
    return q

def paged_fn(q, k_cache, v_cache, *, cache_seqlens, block_table):
    return q

def merge_fn(out_partial, lse_partial):
    return out_partial

def crashes_on_odd(q, k, v, *, causal=False, scale=None):
    if q.shape[2] % 2:
        import os

        os._exit(3)
    return q
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "specmod.py").write_text(textwrap.dedent(USER))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "specmod"
    sys.modules.pop("specmod", None)


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("specmod:atn", "has no attribute 'atn' (did you mean specmod:attn?)"),
        ("specmod.attn", "unknown kernel 'specmod.attn' (did you mean 'specmod:attn'?)"),
        ("specmod:two_args", "specmod:two_args(q, k) cannot be called as a kernel"),
        ("specmod:causal_required", "(causal has no default, and flashcheck passes only the"),
        ("specmod:varlen_fn", 'flashcheck.kernel(fn, layout="varlen")'),
        ("specmod:paged_fn", 'flashcheck.kernel(fn, layout="paged")'),
        ("specmod:merge_fn", 'flashcheck.kernel(fn, op="combine")'),
    ],
)
def test_a_spec_that_cannot_be_used_says_how_to_fix_it(user_module, spec, said):
    with pytest.raises(ValueError) as err:
        resolve(spec)
    assert said in str(err.value)


def test_a_plain_dense_function_resolves(user_module):
    assert resolve("specmod:attn").name == "specmod:attn"


def test_kernels_with_specs_prints_each_contract_probed(user_module, capsys):
    # `flashcheck kernels mypkg:fn` was refused by the parser; it now shows the contract the
    # probe finds (a built-in's declared one without probing), and exits 2 on a bad spec.
    from flashcheck.harness.cli import main

    assert main(["kernels", "specmod:attn", "naive-numpy"]) == 0
    out = capsys.readouterr().out
    assert "probing the contract of specmod:attn on cpu ..." in out
    assert "specmod:attn:\n  arithmetic unknown; dtypes" in out
    assert "naive-numpy:\n  arithmetic naive" in out
    assert "probing the contract of naive-numpy" not in out
    assert main(["kernels", "specmod:atn"]) == 2
    assert "has no attribute 'atn' (did you mean specmod:attn?)" in capsys.readouterr().err


def test_kernels_probes_in_a_worker_a_kernel_that_kills_its_process(user_module, capsys):
    # `flashcheck kernels` probed in its own process: a kernel that died on a probe input
    # ended the command silently, exit 3. A crash keeps the input class in the contract.
    from flashcheck.harness.cli import main

    assert main(["kernels", "specmod:crashes_on_odd"]) == 0
    out = capsys.readouterr().out
    assert "specmod:crashes_on_odd:\n  arithmetic unknown; dtypes fp16, bf16, fp32" in out
    assert "sequence lengths multiple of 1" in out, out

"""The decode benchmark's code that needs no GPU: its shape table, lengths and byte counts,
records read back, the markdown rendered from a saved results file, and the CLI's answer on
a machine without CUDA."""

from __future__ import annotations

from dataclasses import replace

import pytest

from flashcheck.harness.bench.decode_bench import DecodeOptions, _timed, run_decode_bench
from flashcheck.harness.bench.decode_report import (
    CopyCeiling,
    DecodeRecord,
    SequenceCheck,
    decode_markdown,
    load_decode,
    render_decode,
)
from flashcheck.harness.bench.decode_shapes import (
    DECODE_SHAPES,
    QUICK_SHAPES,
    DecodeShape,
    kv_bytes,
    lengths_of,
)
from flashcheck.harness.bench.timing import Timing
from flashcheck.harness.cli import main
from flashcheck.harness.core.resultlog import ResultLog


def test_shape_table_keys_lengths_and_bytes():
    for table in (DECODE_SHAPES, QUICK_SHAPES):
        keys = [s.key for s in table]
        assert len(keys) == len(set(keys))
    assert {s.page for s in DECODE_SHAPES} == {16, 256} and max(
        s.nk for s in DECODE_SHAPES
    ) == 131072
    assert {s.b for s in DECODE_SHAPES} >= {1, 64}
    shape = DecodeShape(8, 1000, 16, ragged=True)
    lens = lengths_of(shape, seed=3)
    assert lens == lengths_of(shape, seed=3) and lens != lengths_of(shape, seed=4)
    assert lens[-1] == 1000 and all(250 <= n <= 1000 for n in lens) and len(lens) == 8
    assert lengths_of(DecodeShape(3, 64, 16)) == [64, 64, 64]
    # Every owned key and value row once: 8 heads of 128 bf16 for K and for V.
    assert kv_bytes(DecodeShape(2, 64, 16), [64, 10]) == 74 * 8 * 2 * 128 * 2
    assert DecodeShape(1, 64, 16, dtype="fp32").itemsize == 4
    with pytest.raises(ValueError, match="multiple"):
        DecodeShape(1, 64, 16, hq=6, hk=4)
    with pytest.raises(ValueError, match="one length per sequence"):
        kv_bytes(DecodeShape(2, 64, 16), [64])
    with pytest.raises(ValueError, match="unknown decode provider"):
        DecodeOptions(providers=("nope",)).chosen()


def _saved(tmp_path):
    path = tmp_path / "decode" / "results.jsonl"
    header = {"tool": "flashcheck bench --decode", "name": "decode", "config": {"quick": True}}
    ok = SequenceCheck(0, 8192, "PASS", 0.5, 0.1)
    shape = "b1-nk8192-p16-q1-d128-bf16"
    recs = [
        DecodeRecord(shape, "triton-decode-paged", "ok", 33554432, 8192, "", 20.0, 0.02, (ok,)),
        DecodeRecord(
            shape,
            "sdpa",
            "failed",
            33554432,
            8192,
            "sequence 0: FAIL",
            30.0,
            0.1,
            (SequenceCheck(0, 8192, "FAIL", 90.0, 2.0, ("too far",)),),
        ),
        DecodeRecord(shape, "flex-paged", "error", 33554432, 8192, "RuntimeError: no", note="n"),
    ]
    with ResultLog.open(path, header) as log:
        log.append({"type": "session", "env": {"gpu": "NVIDIA H100", "torch": "2.11"}})
        log.append(CopyCeiling(3.0).to_json())
        for r in recs:
            log.append(r.to_json())
        log.append(CopyCeiling(2.9).to_json())
    return path, recs


def test_records_read_back_and_render(tmp_path):
    path, recs = _saved(tmp_path)
    data = load_decode(path)
    assert data.records == recs and data.copy_tbs == 3.0
    assert recs[0].gbs == pytest.approx(33554432 / 20e-6 / 1e9)
    assert recs[0].counts and not recs[1].counts and not recs[2].counts
    md = decode_markdown(data)
    assert "| shape | K/V MB | triton-decode-paged | sdpa | flex-paged | checks |" in md
    assert "20.0 µs (1678 GB/s, 56%)" in md  # 1678 GB/s of the 3.0 TB/s copy bandwidth
    assert "~~30.0 µs" in md and "error: RuntimeError: no" in md
    assert "triton-decode-paged PASS (0.5 ulp)" in md and "NVIDIA H100" in md
    assert "- flex-paged: n" in md
    assert render_decode(path).read_text() == md
    # Records without a timing field predate timing in turn.
    assert "each provider timed on its own, one after the other" in md


@pytest.mark.parametrize("older", [False, True])
def test_the_method_says_the_providers_were_timed_in_turn(tmp_path, older):
    path, _ = _saved(tmp_path)
    data = load_decode(path)
    data.records[0] = replace(data.records[0], timing="in turn")
    if not older:
        data.records[1] = replace(data.records[1], timing="in turn")
    md = decode_markdown(data)
    assert "the shape's providers taken in turn, one call each, round after round" in md
    assert "timed on its own" not in md
    assert ("before the bench timed in turn: one after the other" in md) == older


def test_a_shapes_providers_are_timed_in_turn_and_one_that_raises_alone():
    base = DecodeRecord("s", "", "ok", 1000, 10)
    recs = [replace(base, provider=p) for p in ("a", "b", "c", "broken")]
    fns = ["fa", "fb", "fc", None]  # "broken" raised on its first call: nothing to time
    timed = []

    def in_turn(group):
        timed.append(group)
        if "fc" in group:
            raise RuntimeError("c cannot run beside the others")
        return [Timing((float(len(f)),)) for f in group]

    def alone(fn):
        if fn == "fc":
            raise RuntimeError("out of resources")
        return Timing((0.5,))

    got = _timed(recs[:2], fns[:2], timer=in_turn)
    assert [(r.median_us, r.timing) for r in got] == [(2000.0, "in turn")] * 2
    assert timed == [["fa", "fb"]]
    got = _timed(recs, fns, timer=in_turn, alone=alone)
    assert [r.timing for r in got] == ["alone", "alone", None, None]
    assert [r.median_us for r in got[:2]] == [500.0, 500.0]
    assert got[2].status == "error" and "out of resources" in got[2].reason
    assert got[3] == recs[3]
    (one,) = _timed(recs[:1], fns[:1], timer=in_turn)
    assert one.timing == "alone"


def test_cli_decode_needs_cuda_and_renders_saved_results(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the no-GPU answer is not reachable")
    assert run_decode_bench(DecodeOptions(out=str(tmp_path))) == 2
    assert main(["bench", "--decode", "--out", str(tmp_path)]) == 2
    assert "no CUDA GPU is visible to torch" in capsys.readouterr().err
    _saved(tmp_path)
    assert main(["bench", "--decode", "--render-only", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "decode" / "bench-decode.md").is_file()
    assert main(["bench", "--decode", "--render-only", "--name", "x", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no decode results at" in err and "--render-only --name x" in err
    (tmp_path / "decode" / "results.jsonl").unlink()
    assert main(["bench", "--decode", "--render-only", "--out", str(tmp_path)]) == 2
    assert "--name NAME (default: decode)" in capsys.readouterr().err


def test_triton_provider_and_the_oracle_check_on_the_interpreter():
    import os

    import torch

    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0") and not torch.cuda.is_available():
        pytest.skip("the Triton provider needs CUDA or TRITON_INTERPRET=1")
    from flashcheck.harness.bench.decode_bench import check_sequences
    from flashcheck.harness.bench.decode_providers import DECODE_PROVIDERS, gathered, make_batch

    batch = make_batch(
        [5, 140], nq=2, hq=4, hk=2, d=16, page=7, dtype="fp16", causal=True, seed=1, device="cpu"
    )
    k, v = gathered(batch)
    assert k.shape == v.shape == (2, 2, 140, 16) and (k[0, :, 5:] == 0).all()
    assert torch.equal(k[1, 1, 139], batch.k_cache[batch.block_table[1, 139 // 7], 139 % 7, 1])
    fn = DECODE_PROVIDERS["triton-decode-paged"](batch)
    o = fn()
    checks = check_sequences(batch, o, "flash")
    assert [(c.sequence, c.keys, c.verdict) for c in checks] == [(0, 5, "PASS"), (1, 140, "PASS")]
    assert "keys per split" in fn.note
    sizes = {"nq": 1, "hq": 4, "hk": 2, "d": 16, "page": 4, "dtype": "fp32", "causal": False}
    uniform = make_batch([9, 9], seed=2, device="cpu", **sizes)
    sdpa = DECODE_PROVIDERS["sdpa"](uniform)  # the flash backend runs on the CPU too
    assert all(c.verdict == "PASS" for c in check_sequences(uniform, sdpa(), "unknown"))
    bad = o.clone()
    bad[1, 1, 3] += 0.05  # the last sequence, last query, last head: a sampled row
    assert check_sequences(batch, bad, "flash")[1].verdict != "PASS"

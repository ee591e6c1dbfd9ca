"""The simulator's numbers: standard attention's as the original notebook printed them; flash
attention's two loop orders as the closed-form counts give them."""

import re
from pathlib import Path

import pytest

from flashcheck.harness.iomodel import (
    BlockTooLarge,
    GPUSpec,
    Profiler,
    flash_attention,
    flash_bytes,
    largest_flash_block,
    standard_attention,
)
from flashcheck.harness.iomodel.attention import flash_working_set

ROOT = Path(__file__).resolve().parents[1]


def _run(fn, n, d, **kw):
    prof = Profiler(GPUSpec.sim_a100(), fn.__name__)
    fn(prof, n, d, **kw)
    return prof


def test_standard_attention_a100_4096_64():
    p = _run(standard_attention, 4096, 64)
    assert p.total_hbm_reads == 153_092_096
    assert p.total_hbm_writes == 33_816_576
    assert p.hbm_traffic == 186_908_672
    assert p.peak_hbm_usage == 34_340_864
    assert p.peak_sram_usage == p.spec.sram_size  # 100 %
    assert round(p.cycles_compute) == 29_192_356
    assert round(100 * p.hbm_fraction, 1) == 86.5


def test_flash_attention_a100_4096_64_blocks_of_64():
    std = _run(standard_attention, 4096, 64)
    fa1 = _run(flash_attention, 4096, 64, block_size=64, schedule="fa1")
    fa2 = _run(flash_attention, 4096, 64, block_size=64, schedule="fa2")
    nd, t = 4096 * 64, 64
    assert fa1.total_hbm_reads == nd * (1 + 2 * t) + 2 * 4096 * (t - 1) == 34_332_672
    assert fa1.total_hbm_writes == nd * t + 2 * 4096 * (t - 1) == 17_293_312
    assert fa1.hbm_traffic == 51_625_984
    assert fa2.total_hbm_reads == nd * (1 + 2 * t) and fa2.total_hbm_writes == nd
    assert fa2.hbm_traffic == 34_078_720
    assert fa1.peak_hbm_usage == 4 * nd + 2 * 4096 and fa2.peak_hbm_usage == 4 * nd
    assert round(100 * (1 - fa1.hbm_traffic / std.hbm_traffic), 1) == 72.4
    assert round(100 * (1 - fa2.hbm_traffic / std.hbm_traffic), 1) == 81.8
    for fl in (fa1, fa2):
        assert fl.cycles_compute == pytest.approx(std.cycles_compute, rel=1e-12)
        assert fl.peak_sram_usage == 20_608 and not fl.sram_overflowed
    assert round(100 * fa1.hbm_fraction, 1) == 63.9
    assert round(100 * fa2.hbm_fraction, 1) == 53.9


SHAPES = [(4096, 64, 64), (256, 64, 64), (100, 16, 32), (130, 8, 7), (64, 32, 200), (1, 4, 1)]


@pytest.mark.parametrize(("n", "d", "block"), SHAPES)
@pytest.mark.parametrize("schedule", ["fa1", "fa2", None])
def test_simulated_flash_traffic_equals_the_closed_form_count(n, d, block, schedule):
    # The simulator and the roofline formula once modelled different schedules (67·N·d
    # against 131·N·d at N = 4096, B = 64); None: both defaults must be the same schedule.
    kw = {"schedule": schedule} if schedule else {}
    fl = _run(flash_attention, n, d, block_size=block, **kw)
    assert fl.hbm_traffic == flash_bytes(n, d, block=block, bytes_per_element=1, **kw)
    assert not fl.sram_overflowed


def _reads(prof):
    """(name, floats in SRAM, state floats written so far) at each HBM read of the trace; the
    state is each query row's accumulator O_i and its running max and sum m_i, l_i."""
    in_sram = written = 0
    for kind, name, n in prof.log:
        in_sram += n if kind == "sram_push" else -n if kind == "sram_pop" else 0
        if kind == "hbm_write" and name.startswith(("O", "m")):
            written += n
        if kind == "hbm_read":
            yield name, in_sram, written


@pytest.mark.parametrize(("n", "d", "block"), [(4096, 64, 64), (256, 16, 32), (200, 8, 64)])
def test_kv_outer_keeps_every_rows_state_in_sram_or_in_hbm(n, d, block):
    # K/V blocks outer: after each K/V block every query row holds O_i, m_i, l_i (d + 2 floats)
    # that the next K/V block updates. What was not written to HBM must still be in SRAM.
    # Writing O once at the end kept 262,144 floats of O "on chip" beside a reported peak
    # SRAM of 20,480 floats (N = 4096, d = 64, B = 64).
    fl = _run(flash_attention, n, d, block_size=block, schedule="fa1")
    passes, written_before = 0, 0
    for name, in_sram, written in _reads(fl):
        if name.startswith("K[") and not name.startswith("K[0:"):  # a K/V block begins
            passes += 1
            assert in_sram + (written - written_before) >= n * (d + 2), name
            written_before = written
    assert passes == -(-n // block) - 1


@pytest.mark.parametrize(("n", "d", "block"), [(4096, 64, 64), (256, 16, 32), (200, 8, 64)])
def test_q_outer_keeps_its_query_blocks_state_in_sram_through_the_kv_loop(n, d, block):
    fl = _run(flash_attention, n, d, block_size=block, schedule="fa2")
    rows = 0
    for name, in_sram, _ in _reads(fl):
        if name.startswith("Q["):
            a, b = map(int, re.findall(r"\d+", name))
            rows = b - a
        elif name.startswith("K["):
            assert in_sram >= 2 * rows * d + 2 * rows, name  # Q_i, O_i, m_i, l_i
    assert rows == n - (n - 1) // block * block  # the last query block was seen


@pytest.mark.parametrize("schedule", ["fa1", "fa2", None])
def test_peak_sram_holds_the_whole_flash_tile(schedule):
    # Q, K, V, O blocks, the score tile and the row max and sum: the row statistics were left
    # out (20,480 floats reported for 20,608 at B = 64, d = 64).
    kw = {"schedule": schedule} if schedule else {}
    for n, d, block in SHAPES:
        fl = _run(flash_attention, n, d, block_size=block, **kw)
        b = min(block, n)
        assert fl.peak_sram_usage >= b * b + 4 * b * d + 2 * b == flash_working_set(b, d)


def test_a_block_whose_tile_overflows_the_sram_is_refused():
    spec = GPUSpec.sim_a100()
    for gpu in (spec, GPUSpec.sim_v100(), GPUSpec.h100_sxm()):
        for d in (16, 64, 128, 256):
            b = largest_flash_block(gpu, d)
            assert flash_working_set(b, d) <= gpu.sram_size < flash_working_set(b + 1, d)
    assert largest_flash_block(spec, 64) == 255
    with pytest.raises(BlockTooLarge, match="at most 255") as err:
        flash_attention(Profiler(spec), 4096, 64, block_size=100_000)
    assert err.value.largest == 255
    with pytest.raises(BlockTooLarge, match="at most 255"):
        flash_attention(Profiler(spec), 4096, 64, block_size=256, schedule="fa1")
    prof = Profiler(spec)
    flash_attention(prof, 4096, 64, block_size=255)
    assert not prof.sram_overflowed
    # a block longer than the sequence is the sequence: it fits when the sequence does
    flash_attention(Profiler(spec), 128, 64, block_size=100_000)
    with pytest.raises(BlockTooLarge, match="no block fits; use d <= 32767"):
        flash_attention(Profiler(spec), 64, 40_000)


def test_cli_refuses_an_overflowing_block_and_says_which_fits(capsys):
    from flashcheck.harness.cli import main

    assert main(["iomodel", "--gpu", "a100", "-n", "4096", "-d", "64", "--block", "100000"]) == 2
    out, err = capsys.readouterr()
    assert "saving" not in out and "%" not in out  # no savings claimed for it
    assert "at most 255 (--block 255)" in err


def test_report_sizes_are_mebibytes():
    report = _run(standard_attention, 4096, 64).report()
    # 34,340,864 floats × 2 bytes = 65.5 MiB = 68.7 MB
    assert "Peak HBM:   34,340,864 floats (65.5 MiB)" in report
    assert " MB)" not in report


def test_standard_attention_a100_256_fits_in_sram():
    p = _run(standard_attention, 256, 64)
    assert p.hbm_traffic == 327_680
    assert round(100 * p.hbm_fraction, 1) == 74.2
    assert round(100 * p.peak_sram_usage / p.spec.sram_size) == 62
    assert not p.sram_overflowed


def test_presets_tiles_and_argument_checks():
    assert [g.balance for g in (GPUSpec.sim_v100(), GPUSpec.sim_a100(), GPUSpec.sim_h100())] == [
        70.0,
        150.0,
        300.0,
    ]
    h100, h200 = GPUSpec.h100_sxm(), GPUSpec.h200()
    assert h100.hbm_bandwidth * 2 * 1e9 == pytest.approx(3.35e12)  # bytes/s at 1 ns per cycle
    assert 290 < h100.balance * 0.5 < 300  # ~295 FLOP/B, seed 000's quoted H100 balance
    assert h200.flop_rate == h100.flop_rate and h200.hbm_bandwidth > h100.hbm_bandwidth
    spec = GPUSpec.sim_a100()
    b = spec.tile_flash(64)
    assert 2 * b * b + 4 * b * 64 <= spec.sram_size < 2 * (b + 1) ** 2 + 4 * (b + 1) * 64
    t = spec.tile_2d(64)
    assert t * t + 3 * t * 64 <= spec.sram_size < (t + 1) ** 2 + 3 * (t + 1) * 64
    with pytest.raises(ValueError, match="positive"):
        GPUSpec("x", 2, 0, 1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="block_size"):
        flash_attention(Profiler(spec), 64, 8, block_size=0)
    with pytest.raises(ValueError, match="schedule must be one of fa2, fa1"):
        flash_attention(Profiler(spec), 64, 8, schedule="fa3")
    prof = Profiler(spec)
    prof.sram_push(spec.sram_size + 5, "too big")
    assert prof.sram_overflowed and prof.log[-1] == ("sram_overflow", "too big", 5)
    assert "Memory-bound" in _run(standard_attention, 4096, 64).report()


def test_analytic_counts_and_roofline():
    from flashcheck.harness.iomodel import Roofline, attention_flops, flash_bytes, naive_bytes

    assert attention_flops(2048, 64) == 4 * 2048**2 * 64
    assert attention_flops(2048, 64, causal=True) == 2 * 2048**2 * 64
    # fp32, N = 2048, d = 64, B = 64 (T = 32): ~16·N² bytes naive; flash N·d·(2 + 2T)·4 for
    # FA2 (~31 FLOP/B) and (N·d·(1 + 3T) + 4N·(T − 1))·4 for FA1 (~21 FLOP/B)
    nb = naive_bytes(2048, 64, bytes_per_element=4)
    fb = flash_bytes(2048, 64, block=64, bytes_per_element=4)
    assert nb == pytest.approx(16 * 2048**2, rel=0.04)
    assert fb == 2048 * 64 * 66 * 4 == flash_bytes(2048, 64, schedule="fa2", bytes_per_element=4)
    assert 30 < attention_flops(2048, 64) / fb < 32
    fb1 = flash_bytes(2048, 64, block=64, schedule="fa1", bytes_per_element=4)
    assert fb1 == (2048 * 64 * 97 + 4 * 2048 * 31) * 4
    assert 20 < attention_flops(2048, 64) / fb1 < 22
    from flashcheck.harness.iomodel.analytic import flash_fa2_bytes

    assert flash_fa2_bytes(2048, 64, block_m=64, bytes_per_element=4) == fb + 4 * 2048
    a100 = Roofline("A100", 312e12, 1.555e12)
    assert 190 < a100.ridge < 210
    assert a100.attainable(1.0) == 1.555e12 and a100.attainable(1e6) == 312e12
    with pytest.raises(ValueError, match="block"):
        flash_bytes(16, 16, block=0)
    with pytest.raises(ValueError, match="schedule"):
        flash_bytes(16, 16, schedule="fa3")


def test_cli_prints_the_comparison(capsys):
    from flashcheck.harness.cli import main

    assert main(["iomodel", "--gpu", "a100", "-n", "4096", "-d", "64"]) == 0
    out = capsys.readouterr().out
    assert "| HBM traffic (floats) | 186,908,672 | 51,625,984 | 72.4% | 34,078,720 | 81.8% |" in out
    assert "| compute cycles | 29,192,356 | 29,192,356 | 0.0% | 29,192,356 | 0.0% |" in out
    assert "N·d·(1 + 3T) + 4N·(T − 1) = 51,625,984 floats" in out
    assert "N·d·(2 + 2T) = 34,078,720 floats" in out


def test_every_number_in_the_docs_section_is_printed_by_its_commands(capsys):
    # The docs' table once came from a schedule that cannot exist (O written once with K/V
    # blocks outer) and disagreed with the formula beside it.
    from flashcheck.harness.cli import main

    doc = (ROOT / "docs" / "iomodel.md").read_text()
    section = doc[doc.index("## The command's numbers") : doc.index("## Roofline")]
    outputs, tables = [], 0
    for command in re.findall(r"`flashcheck (iomodel [^`]*)`", section):
        assert main(command.split()) == 0, command
        outputs.append(capsys.readouterr().out)
        after = section[section.index(command) :]
        table = re.match(r"[^|]*?\n\n(\| metric .*?)\n\n", after, re.DOTALL)
        if table:  # the table that follows a command is that command's
            tables += 1
            for row in table.group(1).splitlines():
                assert row in outputs[-1].splitlines(), (command, row)
    assert len(outputs) == 3 and tables == 2
    numbers = re.findall(r"\d{1,3}(?:,\d{3})+|\d+(?:\.\d)?%", section)
    assert len(numbers) > 40
    for number in numbers:
        assert any(number in out for out in outputs), number

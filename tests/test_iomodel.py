"""The seed notebook's numbers (seed 000), reproduced exactly by the simulator."""

import pytest

from flashcheck.harness.iomodel import GPUSpec, Profiler, flash_attention, standard_attention


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
    fl = _run(flash_attention, 4096, 64, block_size=64)
    assert fl.hbm_traffic == 17_563_648
    assert fl.peak_hbm_usage == 1_048_576
    assert round(100 * (1 - fl.hbm_traffic / std.hbm_traffic), 1) == 90.6
    assert round(100 * (1 - fl.peak_hbm_usage / std.peak_hbm_usage), 1) == 96.9
    assert fl.cycles_compute == pytest.approx(std.cycles_compute, rel=1e-12)
    assert fl.peak_sram_usage == 20_480
    assert round(100 * fl.hbm_fraction, 1) == 37.6


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
    prof = Profiler(spec)
    prof.sram_push(spec.sram_size + 5, "too big")
    assert prof.sram_overflowed and prof.log[-1] == ("sram_overflow", "too big", 5)
    assert "Memory-bound" in _run(standard_attention, 4096, 64).report()


def test_analytic_counts_and_roofline():
    from flashcheck.harness.iomodel import Roofline, attention_flops, flash_bytes, naive_bytes

    assert attention_flops(2048, 64) == 4 * 2048**2 * 64
    assert attention_flops(2048, 64, causal=True) == 2 * 2048**2 * 64
    # seed 002: fp32, N = 2048, d = 64, B_c = 64: ~16·N² bytes naive, N·d·67·4 flash (~30 FLOP/B)
    nb = naive_bytes(2048, 64, bytes_per_element=4)
    fb = flash_bytes(2048, 64, block=64, bytes_per_element=4)
    assert nb == pytest.approx(16 * 2048**2, rel=0.04)
    assert fb == 2048 * 64 * 67 * 4
    assert 29 < attention_flops(2048, 64) / fb < 32
    a100 = Roofline("A100", 312e12, 1.555e12)
    assert 190 < a100.ridge < 210
    assert a100.attainable(1.0) == 1.555e12 and a100.attainable(1e6) == 312e12
    with pytest.raises(ValueError, match="block"):
        flash_bytes(16, 16, block=0)


def test_cli_prints_the_comparison(capsys):
    from flashcheck.harness.cli import main

    assert main(["iomodel", "--gpu", "a100", "-n", "4096", "-d", "64"]) == 0
    out = capsys.readouterr().out
    assert "| HBM traffic (floats) | 186,908,672 | 17,563,648 | 90.6% |" in out
    assert "| compute cycles | 29,192,356 | 29,192,356 | 0.0% |" in out

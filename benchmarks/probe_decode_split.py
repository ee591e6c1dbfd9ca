"""Time the paged decode kernel at several fixed split sizes (a tuning probe, GPU only):

    PYTHONPATH=/tmp/fc python3 benchmarks/probe_decode_split.py [SPLIT ...]

For a few decode shapes of ``flashcheck bench --decode`` (bf16, 32 query heads on 8 key/value
heads, d = 128) it prints the median GPU time (L2 overwritten before each run) and the K/V
bandwidth of ``flash_decode_paged`` per split size (default 64, 128, 256, 512 keys). The
split size is fixed per call, so any of them is batch-invariant; the registered kernel and
the bench use ``DEFAULT_SPLIT``. Outputs are not checked here (the bench checks them).
"""

from __future__ import annotations

import sys

from flashcheck.harness.bench.decode_bench import time_flushed
from flashcheck.harness.bench.decode_providers import make_batch
from flashcheck.harness.bench.decode_shapes import DecodeShape, kv_bytes, lengths_of
from flashcheck.kernels.triton_decode import DEFAULT_SPLIT, flash_decode_paged

SHAPES = (
    DecodeShape(1, 1024, 16),
    DecodeShape(1, 32768, 16),
    DecodeShape(1, 131072, 256),
    DecodeShape(8, 32768, 16, ragged=True),
    DecodeShape(64, 8192, 16, ragged=True),
)


def main(splits: list[int]) -> None:
    print(f"default split {DEFAULT_SPLIT}; columns: split sizes {splits}")
    for shape in SHAPES:
        lengths = lengths_of(shape)
        sizes = {"nq": shape.nq, "hq": shape.hq, "hk": shape.hk, "d": shape.d}
        batch = make_batch(
            lengths, page=shape.page, dtype=shape.dtype, causal=shape.causal, seed=0, **sizes
        )
        cells = []
        for split in splits:

            def fn(split=split, batch=batch):
                return flash_decode_paged(
                    batch.q,
                    batch.k_cache,
                    batch.v_cache,
                    cache_seqlens=batch.cache_seqlens,
                    block_table=batch.block_table,
                    split_size=split,
                )

            us = time_flushed(fn).median_ms * 1e3
            cells.append(f"{us:8.1f} us {kv_bytes(shape, lengths) / us / 1e3:6.0f} GB/s")
        print(f"{shape.key:34s} " + " | ".join(cells))


if __name__ == "__main__":
    main([int(x) for x in sys.argv[1:]] or [64, 128, 256, 512])

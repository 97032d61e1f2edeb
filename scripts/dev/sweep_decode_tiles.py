"""Time INT2 decode attention at the bench's large shapes for DecodeConfig variants of the GPU default.

Run on the GPU box from the repo root. Each row changes a few fields of the point's default launch
(`kernels.decode.default_launch`, shown in the first column): the history loop (row-major or warp tiles) and its
tile, pipelining depth, the split density (programs_per_sm) and the inline-PTX field unpack. The rel err column
checks each variant against the reference (a wrong unpack shows as a large error).

    python scripts/dev/sweep_decode_tiles.py                      # Qwen3-8B attention (group 4, head_dim 128)
    python scripts/dev/sweep_decode_tiles.py --head-dim 64 --group 3 --points 8:32768,32:102400 --grid d64
    python scripts/dev/sweep_decode_tiles.py --head-dim 64 --group 3 --grid pairs   # token pairs (pairs.py)
    python scripts/dev/sweep_decode_tiles.py --head-dim 64 --group 16 --grid warp_rows  # 16 rows in 8-row programs
    python scripts/dev/sweep_decode_tiles.py --head-dim 64 --group 4 --points 1:8192,32:102400 --grid rows4
        # up to 4 query rows per KV head in 4-row programs against 8-row ones (`four_row_pairs`)
    python scripts/dev/sweep_decode_tiles.py --head-dim 64 --group 3 --points 1:1024,32:1024 --grid short  # split
        # depth, and the single-launch merge (DecodeConfig.single_launch: stage 1 merges, no second launch)
    python scripts/dev/sweep_decode_tiles.py --head-dim 128 --group 4 --points 1:1024,1:8192,1:32768 --grid splits
        # split count against merge cost between 1k and 64k (DecodeConfig.tile_merge_ratio)
    python scripts/dev/sweep_decode_tiles.py --head-dim 128 --group 4 --points 1:32768,1:102400,2:102400 --grid long1
        # small-grid tiles at long histories (batch 1-2): tile length, pipeline depth, split density
    python scripts/dev/sweep_decode_tiles.py --head-dim 128 --group 4 --points 1:102400,2:102400 --grid long1_narrow
        # the same with 64-token tiles, deeper pipelines and 2-warp programs
    python scripts/dev/sweep_decode_tiles.py --head-dim 64 --group 16 --points 1:1024,1:8192,2:8192 --grid rows16_small
        # more than 8 query rows per KV head on the small-grid tile: register cap, depth, 8-row programs, warps
    python scripts/dev/sweep_decode_tiles.py --head-dim 128 --group 16 --points 1:8192,1:102400 --grid warps2_small
        # 2-warp small-grid programs without the register cap: tile length, depth, split density
    python scripts/dev/sweep_decode_tiles.py --head-dim 128 --group 4 --points 3:8192,32:102400 --grid warps2_large
        # 2-warp programs on the large grid (batch >= 3)
    python scripts/dev/sweep_decode_tiles.py --head-dim 128 --group 4 --points 1:262144,4:32768 --grid warps2_bounds
        # where two warps stop paying: batch 1 beyond 128k, batch 2-16 (4 warps at batch 1; 2 elsewhere)
    python scripts/dev/sweep_decode_tiles.py --head-dim 64 --group 16 --points 1:1024,1:8192 --grid tiny_short
        # the tiny family at short histories: 8-row programs, depth, split density, fp-segment tile, merge
    python scripts/dev/sweep_decode_tiles.py --head-dim 128 --group 4 --points 1:32768,1:102400 --grid occupancy
        # register caps with deeper splits: more resident programs per SM (ncu: ~8 warps per SM, register-bound)
    python scripts/dev/sweep_decode_tiles.py --head-dim 64 --group 3 --points 1:8192,1:102400 --grid occupancy_d64
    python scripts/dev/sweep_decode_tiles.py --head-dim 64 --group 16 --points 8:1024,32:1024,32:4096 --grid short_large
        # short histories with as many units as SMs or more (batch 8-32 at 1k-4k): splits, tiles, rows, one launch
    python scripts/dev/sweep_decode_tiles.py --head-dim 64 --group 16 --points 32:1024,32:8192 --grid warps2_batch32
        # the same, two-warp 128-token programs only
    python scripts/dev/sweep_decode_tiles.py --head-dim 64 --group 16 --points 12:1024,16:8192 --grid wide_rows_large
        # more than 8 rows at batch 9-16: the default's two-warp 128-token programs against the large grid's tile
    python scripts/dev/sweep_decode_tiles.py --head-dim 128 --group 4 --points 26:102400,20:102400,32:102400 --grid waves
        # split density at large batches: does a filled last wave of programs pay? (results/bench/sweep_decode_waves.md)
    python scripts/dev/sweep_decode_tiles.py --head-dim 64 --group 16 --points 1:8192,32:102400 --grid fp_only --fp-only
        # BF16 on the harness's kernel (no packed history, `bf16+graph`'s calls): the history loops compiled out
        # (history_loops), fp-segment tile, warps, depth, split density

Each point starts with a BF16 SDPA row (torch, same shape, same timing), the baseline the INT2 rows (with --fp-only:
the BF16-kernel rows) must beat.

A variant that fails to compile or launch (e.g. too much shared memory) is printed with its error.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_kernels import (KV_HEADS, AttnShape, _decode_bytes, bf16_bytes, bf16_kernel_args,  # noqa: E402
                           bf16_kernel_call, copy_bandwidth, decode_call, decode_inputs, graph_ms, int_spec,
                           point_launch, sdpa_call)
from harness.cli_args import batch_ctx_points, positive_int  # noqa: E402
from kernels.decode import GRIDS as LAUNCH_GRIDS  # noqa: E402
from kernels.decode import DecodeConfig, decode_attention, default_config, default_launch  # noqa: E402
from kernels.decode.reference import decode_attention_reference  # noqa: E402

SHAPES = [(8, 32768), (32, 102400), (1, 131072)]
GRIDS = {
    "default": [{}, {"warp_tiles": False, "block_n": 128}, {"warp_tiles": False, "block_n": 128, "maxnreg": None},
                {"maxnreg": None}, {"block_n": 128}, {"num_stages": 2}, {"num_stages": 4}, {"programs_per_sm": 4},
                {"block_f": 64}, {"asm_unpack": True}],
    "d64": [{}, {"warp_tiles": False, "block_n": 128, "maxnreg": None}, {"warp_tiles": False, "block_n": 256},
            {"block_n": 128, "maxnreg": None}, {"block_n": 512, "num_warps": 8, "maxnreg": None},
            {"maxnreg": None, "num_stages": 4}, {"programs_per_sm": 2}],
    "pairs": [{}, {"token_pairs": False}, {"maxnreg": None}, {"block_n": 128}, {"block_n": 128, "maxnreg": None},
              {"block_n": 512, "num_warps": 8, "maxnreg": None}, {"num_stages": 4, "maxnreg": None},
              {"num_stages": 2}, {"programs_per_sm": 4}],
    "warp_rows": [{}, {"warp_rows": 8}, {"warp_rows": 8, "maxnreg": 168}, {"block_n": 128}],
    "rows4": [{}, {"warp_rows": 4}, {"warp_rows": 8}, {"warp_rows": 4, "maxnreg": None},
              {"warp_rows": 4, "maxnreg": 128}, {"warp_rows": 4, "maxnreg": 128, "programs_per_sm": 12}],
    "d256": [{}, {"warp_tiles": True, "block_n": 128, "num_warps": 4},
             {"warp_tiles": True, "block_n": 128, "num_warps": 8},
             {"warp_tiles": True, "block_n": 256, "num_warps": 8},
             {"warp_tiles": True, "block_n": 128, "num_warps": 4, "num_stages": 3},
             {"block_n": 128, "num_warps": 8}],
    "short": [{}, {"min_split_tiles": 1}, {"min_split_tiles": 2, "block_n": 128},
              {"min_split_tiles": 1, "block_n": 128}, {"min_split_tiles": 1, "block_n": 64},
              {"min_split_tiles": 1, "block_n": 128, "block_f": 16},
              {"min_split_tiles": 1, "block_n": 64, "block_f": 16},
              {"min_split_tiles": 1, "block_n": 128, "num_stages": 2}, {"min_split_tiles": 1, "block_n": 128,
                                                                        "programs_per_sm": 16},
              {"single_launch": True}, {"single_launch": True, "block_n": 64}, {"single_launch": True, "block_f": 16}],
    "splits": [{}, {"tile_merge_ratio": 8}, {"tile_merge_ratio": 16}, {"tile_merge_ratio": 32},
               {"min_split_tiles": 2, "block_n": 128}, {"block_n": 64, "tile_merge_ratio": 16},
               {"block_n": 64, "tile_merge_ratio": 32}],
    "long1": [{}, {"block_n": 256}, {"block_n": 256, "num_stages": 3}, {"block_n": 256, "num_stages": 3, "maxnreg": 168},
              {"num_stages": 3}, {"programs_per_sm": 2}, {"programs_per_sm": 8}, {"block_n": 256, "programs_per_sm": 2},
              {"block_n": 256, "num_warps": 8, "maxnreg": None}, {"block_n": 512, "num_warps": 8, "maxnreg": None},
              {"block_n": 256, "num_stages": 3, "maxnreg": 168, "programs_per_sm": 8, "block_f": 32},
              {"block_n": 256, "num_warps": 8, "programs_per_sm": 2}, {"block_n": 256, "num_warps": 8, "programs_per_sm": 3},
              {"block_n": 512, "num_warps": 16, "programs_per_sm": 1}, {"block_n": 256, "num_warps": 8, "programs_per_sm": 2,
                                                                         "num_stages": 3}],
    "long1_narrow": [{}, {"block_n": 64}, {"block_n": 64, "num_stages": 3}, {"block_n": 64, "num_stages": 4},
                     {"block_n": 64, "num_stages": 4, "maxnreg": None}, {"block_n": 64, "num_stages": 3,
                                                                         "programs_per_sm": 8},
                     {"num_warps": 2}, {"num_warps": 2, "num_stages": 3}, {"num_warps": 2, "programs_per_sm": 8},
                     {"maxnreg": None}, {"maxnreg": None, "num_stages": 3}, {"tile_merge_ratio": 0},
                     {"block_n": 64, "num_stages": 4, "tile_merge_ratio": 0}],
    "rows16": [{}, {"maxnreg": None}, {"block_n": 128}, {"block_n": 128, "maxnreg": None}, {"num_stages": 2},
               {"num_warps": 8, "maxnreg": None}],
    "rows16_small": [{}, {"maxnreg": None}, {"maxnreg": 168}, {"maxnreg": None, "num_stages": 3}, {"warp_rows": 8},
                     {"warp_rows": 8, "maxnreg": None}, {"programs_per_sm": 8, "maxnreg": None},
                     {"block_n": 128, "maxnreg": None}, {"num_warps": 2}, {"num_warps": 2, "maxnreg": None}],
    "warps2_small": [{}, {"num_warps": 2, "maxnreg": None}, {"num_warps": 2, "maxnreg": None, "num_stages": 3},
                     {"num_warps": 2, "maxnreg": None, "block_n": 64},
                     {"num_warps": 2, "maxnreg": None, "block_n": 256},
                     {"num_warps": 2, "maxnreg": None, "programs_per_sm": 8},
                     {"num_warps": 2, "maxnreg": None, "programs_per_sm": 2},
                     {"num_warps": 2, "maxnreg": None, "block_n": 128}, {"maxnreg": None, "num_stages": 3}],
    "warps2_bounds": [{}, {"num_warps": 4, "maxnreg": 128}, {"num_warps": 2, "maxnreg": None},
                      {"num_warps": 2, "block_n": 128, "programs_per_sm": 16}],
    "tiny_short": [{}, {"warp_rows": 8}, {"warp_rows": 8, "programs_per_sm": 8}, {"num_stages": 3},
                   {"num_stages": 1}, {"programs_per_sm": 8}, {"block_n": 64}, {"block_f": 32}, {"block_f": 128},
                   {"tile_merge_ratio": 8}, {"tile_merge_ratio": 32}, {"merge_block": 16}],
    "occupancy": [{}, {"maxnreg": 168}, {"maxnreg": 128}, {"programs_per_sm": 6, "maxnreg": 168},
                  {"programs_per_sm": 8, "maxnreg": 128}, {"programs_per_sm": 8, "maxnreg": 168},
                  {"programs_per_sm": 8, "maxnreg": 128, "num_stages": 3}],
    "occupancy_d64": [{}, {"programs_per_sm": 6}, {"programs_per_sm": 6, "maxnreg": 168},
                      {"programs_per_sm": 6, "maxnreg": 128}, {"programs_per_sm": 8, "maxnreg": 128}],
    "warps2_large": [{}, {"num_warps": 2, "block_n": 128}, {"num_warps": 2, "block_n": 128, "maxnreg": None},
                     {"num_warps": 2, "block_n": 128, "programs_per_sm": 16},
                     {"num_warps": 2, "block_n": 128, "maxnreg": None, "num_stages": 4}],
    "short_large": [{}, {"min_split_tiles": 1}, {"min_split_tiles": 2}, {"block_n": 128},
                    {"block_n": 128, "min_split_tiles": 1}, {"block_n": 128, "num_warps": 2, "min_split_tiles": 1},
                    {"block_n": 128, "num_warps": 2, "min_split_tiles": 1, "programs_per_sm": 16},
                    {"warp_rows": 8}, {"warp_rows": 8, "min_split_tiles": 1}, {"single_launch": True},
                    {"single_launch": True, "min_split_tiles": 1}, {"maxnreg": None}, {"num_stages": 2}],
    "warps2_batch32": [{}, {"block_n": 128, "num_warps": 2}, {"block_n": 128, "num_warps": 2, "min_split_tiles": 1}],
    "wide_rows_large": [{}, {"block_n": 256, "num_warps": 4}, {"block_n": 256, "num_warps": 4, "maxnreg": 168}],
    "waves": [{}, {"programs_per_sm": 4}, {"programs_per_sm": 6}, {"programs_per_sm": 10}, {"programs_per_sm": 12},
              {"programs_per_sm": 16}, {"programs_per_sm": 20}, {"programs_per_sm": 24}, {"programs_per_sm": 32},
              {"programs_per_sm": 40}],
    "fp_only": [{}, {"history_loops": False}, {"block_f": 64}, {"history_loops": False, "block_f": 64},
                {"history_loops": False, "block_f": 128}, {"history_loops": False, "block_f": 64, "num_warps": 8},
                {"history_loops": False, "block_f": 128, "num_warps": 8},
                {"history_loops": False, "block_f": 64, "num_stages": 4},
                {"history_loops": False, "block_f": 64, "programs_per_sm": 16},
                {"history_loops": False, "block_f": 64, "num_warps": 2},
                {"history_loops": False, "block_f": 64, "maxnreg": None}],
}


def check(cfg: DecodeConfig, shape: AttnShape, fp_only: bool = False) -> float:
    """Relative error against the reference at a small shape (a register cap must not change results); fp_only: the
    BF16 kernel's inputs (no packed history)."""
    if fp_only:
        args, spec = bf16_kernel_args(2, 4096, shape)
    else:
        args, spec, _ = decode_inputs(2, 4096, 2, shape)
    kw = dict(sm_scale=shape.head_dim ** -0.5, k_spec=spec, v_spec=spec)
    out = decode_attention(*args, **kw, config=cfg).float()
    ref = decode_attention_reference(*args, **kw).float()
    return ((out - ref).norm() / ref.norm()).item()


def fp_only_point_launch(batch: int, ctx: int, shape: AttnShape) -> DecodeConfig:
    """The launch a BF16 call on the harness kernel (no packed history, ctx fp rows) takes by default on GPU 0."""
    spec = int_spec(2, shape.head_dim)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return default_launch(shape.head_dim, spec, spec, shape.rows, batch * shape.kv_heads, sms, 0, ctx)


def sweep_row(batch: int, ctx: int, change: dict, shape: AttnShape, copy_tbs: float, fp_only: bool = False) -> str:
    """One Markdown row: the variant's time, bandwidth and error (or the error that stopped it); fp_only: the BF16
    kernel's call (`bench_kernels.bf16_kernel_call`) instead of INT2's."""
    spec = int_spec(2, shape.head_dim)                              # decode_inputs' INT2 format
    default = fp_only_point_launch(batch, ctx, shape) if fp_only else point_launch(batch, ctx, shape, spec, spec)
    cfg = replace(default, **change)
    label = ", ".join(f"{k}={v}" for k, v in change.items()) or "(default)"
    nbytes = bf16_bytes(batch, ctx, shape) if fp_only else _decode_bytes(batch, ctx, 2, shape)
    make_call = (lambda _: bf16_kernel_call(batch, ctx, shape, cfg)) if fp_only else \
        (lambda _: decode_call(batch, ctx, 2, cfg, shape))
    try:
        err = check(cfg, shape, fp_only)
        ms = graph_ms(make_call, nbytes)
    except Exception as exc:                                   # noqa: BLE001 (a variant may not compile)
        torch.cuda.empty_cache()
        return f"| {batch} | {ctx} | {label} | failed: {str(exc).splitlines()[0][:80]} | | | |"
    tbs = nbytes / ms / 1e9
    return f"| {batch} | {ctx} | {label} | {ms:.3f} | {tbs:.2f} | {tbs / copy_tbs:.0%} | {err:.1e} |"


def sdpa_row(batch: int, ctx: int, shape: AttnShape, copy_tbs: float) -> str:
    """The point's baseline: BF16 SDPA over the whole context, timed the same way."""
    nbytes = bf16_bytes(batch, ctx, shape)
    ms = graph_ms(lambda _: sdpa_call(batch, ctx, shape), nbytes)
    tbs = nbytes / ms / 1e9
    return f"| {batch} | {ctx} | BF16 SDPA (baseline) | {ms:.3f} | {tbs:.2f} | {tbs / copy_tbs:.0%} | |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--group", type=positive_int, default=4, help="query heads per KV head")
    parser.add_argument("--points", type=batch_ctx_points, default=SHAPES, help="batch:ctx,...")
    parser.add_argument("--grid", default="default", choices=sorted(GRIDS))
    parser.add_argument("--fp-only", action="store_true",
                        help="time BF16 on the harness kernel (every row in the fp segment) instead of INT2")
    args = parser.parse_args()
    shape = AttnShape(args.group * KV_HEADS, KV_HEADS, args.head_dim)
    copy_tbs = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}; copy {copy_tbs:.2f} TB/s; {shape}; default "
          + ", ".join(f"{grid} grid {default_config(shape.head_dim, True, grid)}" for grid in LAUNCH_GRIDS))
    print("| batch | ctx | change from default | ms | TB/s | of copy | rel err |")
    print("|---|---|---|---|---|---|---|")
    for batch, ctx in args.points:
        print(sdpa_row(batch, ctx, shape, copy_tbs), flush=True)
        for change in GRIDS[args.grid]:
            print(sweep_row(batch, ctx, change, shape, copy_tbs, args.fp_only), flush=True)


if __name__ == "__main__":
    main()

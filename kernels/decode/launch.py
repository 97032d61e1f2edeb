"""Launch parameters (DecodeConfig and the per-shape defaults), split counts, input checks, and
`decode_attention`, which launches stage 1 and the stage-2 merge."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

import torch
import triton

from kernels.decode.common import CHANNEL, LOG2E, MAX_ROWS, PAIR_TILE_ROWS, ROW_BLOCK, TOKEN, TOKEN_GROUPED, \
    WARP_TILE_ROWS
from kernels.decode.merge import _decode_stage2_kernel
from kernels.decode.reference import check_decode_inputs
from kernels.decode.stage1 import _decode_stage1_kernel
from kernels.dispatch import HEAD_DIMS, interpreter_forced
from kernels.format import QuantSpec

@dataclass(frozen=True)
class DecodeConfig:
    """Tile sizes and launch parameters of stage 1."""

    block_n: int = 128        # history tokens per tile
    block_f: int = 64         # fp-segment tokens per tile
    num_warps: int = 4
    num_stages: int = 3
    programs_per_sm: int = 8  # split target when B*H_kv < #SMs (half of it beyond, or the token bound: `_split_target`)
    min_split_tiles: int = 4  # never split below this many tiles per program
    tile_merge_ratio: int = 0  # > 0: at most sqrt(ratio x tiles) splits (`_num_splits`); 0: the target alone
    maxnreg: int | None = None  # register cap per thread (None: the compiler's choice); GPU only
    asm_unpack: bool = False  # unpack the packed fields in inline PTX (`_field_ptx`); GPU only
    merge_block: int = 16     # splits merged per iteration of stage 2
    warp_tiles: bool = False  # single-group token layouts: one token sub-tile per warp (`_history_warp_tiles`)
    token_pairs: bool = True  # warp tiles over 16-byte tokens read two tokens per 32-byte row (pairs.py,
                              # channel_keys.py's `_history_warp_channel_pairs` for KIVI)
    wide_pairs: bool = False  # 4-row programs (warp_rows=4) read 32-byte tokens (head_dim 128 at 2 bits) as 64-byte
                              # pair rows too (`uses_token_pairs`)
    column_meta: bool = False  # pair loops load each pair's two (scale, zero) as one [W, PW, 2] tensor per side,
                               # repeated over each parity's columns at its use (pairs.py `_pair_meta`;
                               # `column_meta_pairs` turns it on where it serves)
    warp_rows: int | None = None  # query rows per warp-tile program, 4, 8 or 16 (None: 8 up to 8 rows, else 16)
    channel_key_tiles: bool = False  # per-channel keys on warp tiles, whole key groups per warp (channel_keys.py;
                                     # `launch_config` turns it on where it serves)
    pdl: bool = True  # on Hopper and later GPUs stage 2 is a programmatic dependent launch of stage 1 (merge.py)
    single_launch: bool = False  # the last stage-1 program of each row block merges the splits (merge.py's
                                 # `_merge_if_last`): one launch per call; on the H100 no faster at batch 1 / 1k
                                 # and slower at 8k (sweep_decode_short.md), so no default takes it
    history_loops: bool = True  # False: a call without history splits compiles stage 1 without the history loops
                                # (its HISTORY constexpr; `compiles_history`, `fp_only_launch`)
    masked_pair_tiles: bool = False  # token pairs mask every tile in one loop instead of whole tiles unmasked and
                                     # the partial ones masked (pairs.py; `masked_pair_tile_launches`)


GRIDS = ("tiny", "small", "medium", "large")
TINY_TOKENS_PER_SM = 6400  # packed history tokens (all units) per SM up to which the tiny grid's programs are faster
TINY_INT2 = dict(maxnreg=168, programs_per_sm=6)  # the tiny grid's 2-bit launch up to head_dim 128 (`launch_config`)
TINY_CHANNEL_KEYS = dict(maxnreg=None, programs_per_sm=2)  # per-channel-key tiles, tiny grid (`channel_key_tiny`)
WIDE_ROWS_MEDIUM_TOKENS_PER_SM = 20000  # the same for "medium" with more than WARP_TILE_ROWS query rows
SHORT_HISTORY_TOKENS = 4096  # packed tokens per unit of a short history: `eight_row_programs`,
                             # `short_history_two_warps`, TurboQuant's `short_history_split_tiles` and head_dim 128's
                             # wide pairs (`four_row_pairs`; each measured)
KIVI_TINY_FOUR_ROW_TOKENS = 32768  # packed tokens up to which KIVI-2 at head_dim 64, batch 1, takes 4-row programs
                                   # (`four_row_pairs`: faster to 32k, slower at 100k)
SHORT_KIVI_EIGHT_ROW_TOKENS = 2048  # packed tokens up to which KIVI at head_dim 128, batch 1, takes 8-row programs
                                   # (`short_history_eight_rows`: faster at 1k, slower at 4k)
SHORT_HISTORY_WIDE_HEAD_SMS_PER_UNIT = 4  # head_dim 256: the same only below one unit per 4 SMs (batch 1-4)
FITTED_MERGE_SPLITS = 8  # stage 2's tile holds just the call's splits up to this many (`merge_launch`)
WIDE_HEAD_FITTED_MERGE_ROWS = 1024  # head_dim 256: the same only from this many merged rows (B * H_q * T_q)
FP_ONLY_HEAD_DIMS = (64,)  # head_dims whose calls without packed history compile stage 1 without the history loops
FP_ONLY_LARGE_TILE = {64: 128, 128: 64}  # fp-segment tokens per tile of such calls on the large grid (`fp_only_launch`)
LARGE_BATCH_SPLIT_TOKENS = 49152  # a unit's context tokens per split at most where the target would leave one
                                  # split per unit (`_split_target`)
ONE_SPLIT_HISTORY_TOKENS = 1024  # packed tokens per unit up to which 2-bit calls of as many units as SMs or more
                                 # take one split per unit (`short_history_one_split`) and head_dim 128's calls of
                                 # few units 64-token tiles (`short_history_narrow_tiles`): faster at 1k (704
                                 # packed tokens), mixed or slower at 2k (1,728)
SHORT_FOUR_ROW_MAX_ROWS = 12  # head_dim 64's short histories: 4-row programs up to this many query rows per KV head
                              # (`short_history_four_rows`; 16 rows were slower at batch 8)


def grid_size(units: int, sms: int, history_tokens: int, rows: int = WARP_TILE_ROWS) -> str:
    """Which of `default_config`'s launch families serves `units` (sequence, KV head) pairs of `rows` query rows over
    `history_tokens` packed tokens each on `sms` SMs (H100 sweeps, 8 KV heads: results/bench/sweep_decode_tiny.md,
    _splits.md, sweep_rows16_medium.md):

    "small": at most one unit per 8 SMs (batch 1-2); "tiny" within it: at most one unit per 16 SMs (batch 1) and at
    most TINY_TOKENS_PER_SM history tokens per SM (batch 1 up to 102k faster, from 114k slower than "small");
    "medium": fewer units than SMs (batch 3-16), and with more than WARP_TILE_ROWS rows at most one unit per 2 SMs
    and WIDE_ROWS_MEDIUM_TOKENS_PER_SM history tokens per SM (batch 3 up to 100k, batch 4-8 up to 32k: its two-warp
    programs were slower at batch 4-6 / 100k and 12 / 32k); "large": the rest. A launch with no packed history
    (BF16 on the kernel path: every row in the fp segment) takes "small" or "large": two-warp programs were up to
    0.9 us slower there at 1k (bench_kernel_grid_batch1.md, the BF16 kernel column)."""
    packed = history_tokens > 0
    if units <= sms // 16 and packed and units * history_tokens <= TINY_TOKENS_PER_SM * sms:
        return "tiny"
    if units <= sms // 8:
        return "small"
    wide_rows_bound = 2 * units <= sms and within_wide_rows_tokens(units, sms, history_tokens)
    if not packed or units >= sms or (rows > WARP_TILE_ROWS and not wide_rows_bound):
        return "large"
    return "medium"


def within_wide_rows_tokens(units: int, sms: int, history_tokens: int) -> bool:
    """A packed history of at most WIDE_ROWS_MEDIUM_TOKENS_PER_SM tokens per SM over all units: how far "medium"
    serves more than WARP_TILE_ROWS rows (`grid_size`, `launch_grid`)."""
    return 0 < history_tokens and units * history_tokens <= WIDE_ROWS_MEDIUM_TOKENS_PER_SM * sms


def default_config(head_dim: int, on_gpu: bool, grid: str = "large", per_token: bool = True,
                   rows: int = WARP_TILE_ROWS) -> DecodeConfig:
    """Fixed heuristic table (no autotune: it does not run under the interpreter).

    rows: query rows per KV head (GQA group x T_q). Head_dim 256 and more than WARP_TILE_ROWS rows were swept on
    the H100 (results/bench/sweep_decode_shapes.md, 8 KV heads, batch 8 / 32k and 32 / 100k): at head_dim 256
    warp tiles of 128 tokens, 4 warps and 3 stages moved 53 % and 76 % of the copy bandwidth where the
    row-major 64-token tile moved 27 % and 30 %; with 16 rows (group 16) dropping the 168-register cap took
    25 % / 36 % to 33 % / 48 %. Head_dim 64 at 2 bits reads token pairs with the same tiles (`uses_token_pairs`:
    10 % -> 48 % of copy at 32 / 100k, sweep_decode_shapes.md).

    per_token: both K and V are per-token layouts of whole-field groups (`per_token_layouts`), the ones warp tiles
    serve. Other layouts (KIVI's per-channel keys, token groups narrower than a field) take the row-major loop,
    whose large-grid tile stays at 128 tokens with the inline-PTX unpack: at 256 tokens and 3 stages its pipeline
    buffers need 323 KB of shared memory at head_dim 128 (H100: 227 KB).

    grid: the launch family of `grid_size`. "small" (very few (sequence, KV head) units): two pipeline stages with a
    128-register cap were 11-16 % faster at batch 1 / 128k and slower at batch 32, 4 programs per SM a further
    3-5 % at batch 1 (H100 sweeps: results/bench/sweep_decode_tiles.md, sweep_decode_splits.md and their git
    history), merge_block=64 up to 10 % at batch 1 and neutral elsewhere. Splits of one tile (min_split_tiles=1)
    shorten a short history's longest program: at batch 1 / 1k 17 -> 12 us (head_dim 64, group 16), 10 -> 8 us
    (64, group 3), 12 -> 9 us (128, group 4), and 1-2 us less at 4k (results/bench/sweep_decode_short.md); from
    ~34k tokens at batch 1 the split target, not the tile count, sets the splits, so long contexts launch as
    before. Between those, one-tile splits left a merge over ~60 partials at 8k: tile_merge_ratio=16 (at most
    sqrt(16 x tiles) splits) took batch 1 / 8k 18 -> 15 us at head_dim 128 and 14 -> 12-13 us at 64 / group 3,
    within 1 us elsewhere from 1k to 32k; with 16 rows at head_dim 64, 64-token tiles took 24-31 % off from 1k to
    32k (8k: 24 -> 18 us; H200 sweep, results/bench/sweep_decode_splits_short.md). single_launch was no faster
    at batch 1 / 1k (8 -> 9 us) and slower at 8k (14 -> 18 us; H100, sweep_decode_short.md). Warp tiles beat
    the row-major loop everywhere on single-group layouts once the values became the MMA's A operand: 9 % less
    time at batch 1 / 128k (128-token tiles), 17 % at 8 / 32k and 37 % at 32 / 100k (256-token tiles;
    sweep_decode_tiles.md). There a 168-register cap (3 blocks per SM instead of 2) saves a further 4-6 %, 32-token
    fp-segment tiles 1-2 %. Rescaling only when a running max grows was slower (it needs a block barrier).
    asm_unpack (inline PTX) stopped paying once single-group fields became FIELD_TINY (ptxas emits one LOP3 per pair
    itself; 0-3 % slower in the final sweep): off for those, kept in the large-grid row-major tile of the other
    layouts.

    "tiny" (batch 1, up to ~100k): the small-grid tiles and splits in two-warp programs (64 tokens per warp) with no
    register cap. H200 sweep at batch 1, 8 KV heads (results/bench/sweep_decode_tiny.md): head_dim 128 group 4 at 8k /
    32k / 100k 15 / 26 / 49 -> 12 / 21 / 44 us, group 16 24 / 42 / 83 -> 17 / 30 / 61 us, head_dim 64 group 3 13 / 21 /
    42 -> 10 / 17 / 35 us, group 16 (64-token tiles before) 18 / 31 / 64 -> 14 / 24 / 50 us (1k: 8 -> 10 us); at
    batch 2 up to 40 % slower at 100k, at batch 1 from 114k on 23-52 % slower (H100; `grid_size` bounds it), at
    head_dim 256 slower everywhere. Head_dim 256 keeps its four-warp tile; at batch 1 (tiny) its splits take at least
    two tiles and at most sqrt(16 x tiles) of them (H100, results/bench/bench_kernel_grid_d256_splits.md: 1.08-1.21x
    faster from 1k to 8k, 1.05-1.06x at 100k, 0.96-0.99x at 32k; at batch 2 16 % slower at 8k: "small" keeps its).
    "medium" (batch 3-16, up to 8 rows, head_dim <= 128): the large-grid tile halved to 128 tokens in two-warp
    programs, 16 per SM: 0-17 % less time from batch 3 / 8k to batch 16 / 100k on the H100 (one point 2 % more,
    head_dim 128 at 16 / 100k), 23-29 % slower at batch 32 / 100k (groups 3-4), where "large" stays. With more than 8
    rows (groups 12-16; "medium" then ends earlier: `grid_size`) the large-grid tile halved in two-warp programs, no
    register cap, 8 per SM (results/bench/sweep_rows16_medium.md).
    """
    if grid not in GRIDS:
        raise ValueError(f"grid must be one of {GRIDS}, got {grid!r}.")
    if not on_gpu:
        return DecodeConfig(block_n=64, block_f=32, num_warps=4, num_stages=1)
    if head_dim > 128 and per_token:
        wide = DecodeConfig(block_n=128, block_f=32, num_warps=4, num_stages=3, merge_block=64, warp_tiles=True)
        return replace(wide, min_split_tiles=2, tile_merge_ratio=16) if grid == "tiny" else wide
    if head_dim > 128:
        return DecodeConfig(block_n=64, block_f=32, num_warps=8, num_stages=2, merge_block=64)
    small = grid in ("tiny", "small")
    if rows > WARP_TILE_ROWS and not small and per_token:
        wide_rows = DecodeConfig(block_n=256, block_f=32, num_warps=4, num_stages=3, merge_block=64, warp_tiles=True)
        return replace(wide_rows, block_n=128, num_warps=2) if grid == "medium" else wide_rows
    if grid == "tiny" and per_token:
        return DecodeConfig(block_n=128, block_f=64, num_warps=2, num_stages=2, merge_block=64, programs_per_sm=4,
                            min_split_tiles=1, tile_merge_ratio=16, warp_tiles=True)
    if small:
        return DecodeConfig(block_n=64 if rows > WARP_TILE_ROWS and head_dim <= 64 else 128, block_f=64,
                            num_warps=4, num_stages=2, maxnreg=128, merge_block=64, programs_per_sm=4,
                            min_split_tiles=1, tile_merge_ratio=16, warp_tiles=True)
    if not per_token:
        return DecodeConfig(block_n=128, block_f=64, num_warps=4, num_stages=3, asm_unpack=True, merge_block=64)
    if grid == "medium":
        return DecodeConfig(block_n=128, block_f=32, num_warps=2, num_stages=3, maxnreg=168, merge_block=64,
                            programs_per_sm=16, warp_tiles=True)
    return DecodeConfig(block_n=256, block_f=32, num_warps=4, num_stages=3, maxnreg=168, merge_block=64,
                        warp_tiles=True)


def launch_config(head_dim: int, on_gpu: bool, grid: str, k_spec: QuantSpec, v_spec: QuantSpec,
                  rows: int = WARP_TILE_ROWS) -> DecodeConfig:
    """`default_config` for this layout, with per-channel keys on warp tiles wherever `channel_key_layouts` serves
    them (KIVI-2 at head_dim <= 128 on the H100, results/bench/bench_formats.md: 0.54x -> 0.96-1.17x BF16 SDPA at
    head_dim 128, 0.35-0.43x -> 0.50-0.61x at 64; the row-major loop gathers every element's scale and zero); at
    head_dim 64 two key groups per warp: 256-token tiles took KIVI-2 (pair rows) there from 0.72-0.89x to
    1.05-2.05x SDPA (13-16 % -> 15-39 % of copy, results/bench/bench_formats_kivi.md), where at head_dim 128 they were
    slower (1.37x -> 0.84x at batch 1 / 32k); the same with 12-16 rows, whose 64-token tiles on the tiny and small
    grids had taken the row-major loop and on the larger grids one group per warp (H200, KIVI-2, groups 12 / 16,
    results/bench/bench_formats_kivi_grid_h200.md: batch 3 / 32k to 32 / 100k 0.43-0.47x -> 0.76-0.91x SDPA);
    KIVI-4 there 0.86-1.14x -> 1.04-1.81x SDPA from batch 3 / 8k on with 4 rows, 0.52-0.67x -> 0.85-1.34x with 16
    (H200, results/bench/bench_formats_kivi4_grid_h200.md; batch 1 / 1k with 16 rows, on the row-major loop before,
    0.92x -> 0.63x: `short_history_row_major` keeps that loop there); 8-row programs where `channel_key_rows` says,
    unpacking in inline PTX where `channel_key_asm` says, uncapped at 2 programs per SM on the tiny grid where
    `channel_key_tiny` says and uncapped on the small grid where `channel_key_small` says; at head_dim 256 (value
    groups of 32 as row blocks of a field) four warps of one key group each: KIVI-2 0.36-0.42x -> 1.80-2.58x, KIVI-4
    0.63-0.68x -> 1.03-1.24x (H100, `bench_formats.py --launch`, results/bench/bench_formats_kivi.md); and half the
    tokens per tile on the medium and large grids where K and V store 4-bit codes at head_dim 128 (`wide_token_fields`):
    each warp then holds 32 tokens, the bytes of INT2's 64 (H100 sweep, results/bench/bench_formats_int4_tiles.md:
    13-26 % less time from batch 3 / 8k to batch 32 / 100k; at head_dim 64 and 256 and on the tiny and small grids the
    same change was slower); and on the tiny grid (batch 1) with 2-bit K and V at head_dim 64 or 128 and up to
    WARP_TILE_ROWS rows, 6 two-warp programs per SM under a 168-register cap (TINY_INT2). At head_dim 64 (pair rows) 6
    per SM were measured against 4 (H100, results/bench/sweep_decode_occupancy.md: groups 1 / 3 / 8 at 100k 0.037 /
    0.038 / 0.038 -> 0.031 / 0.033 / 0.034 ms, 1k to 32k unchanged; group 16 slower at 100k; confirmed over the batch-1
    grid with trees alternating, results/bench/bench_kernel_grid_d64_tiny_pairs.md) when the program held 168 registers;
    the 16-bit code words would take it to 239 (4 per SM), the cap keeps 168 with no spill in the loop (offline, `python
    scripts/dev/decode_sass.py --launches`, results/bench/decode_sass.md) and batch 1 / 100k at 0.033 ms against 0.042
    uncapped (H100, group 4, results/bench/bench_formats_d64_cap.md). At head_dim 128 the words took the program from
    244 to 224 registers, and the cap with 6 per SM made batch 1 / 100k 0.046 -> 0.041 ms (H100,
    results/bench/sweep_tiny_int2_words.md)."""
    per_token = per_token_layouts(k_spec, v_spec, head_dim)
    cfg = default_config(head_dim, on_gpu, grid, per_token, rows)
    if on_gpu and per_token and grid in ("medium", "large") and wide_token_fields(k_spec, v_spec, head_dim):
        cfg = replace(cfg, block_n=cfg.block_n // 2)
    if on_gpu and grid == "tiny" and head_dim <= 128 and rows <= WARP_TILE_ROWS and \
            two_bit_token_layouts(k_spec, v_spec, head_dim):
        cfg = replace(cfg, **TINY_INT2)
    if not on_gpu or k_spec.axis != "channel":
        return cfg
    asm = channel_key_asm(grid, head_dim, k_spec, rows)
    tiles = replace(cfg, warp_tiles=True, channel_key_tiles=True, asm_unpack=asm)
    if head_dim == 64:                           # two key groups a warp (2-bit keys: pair rows)
        tiles = replace(tiles, block_n=2 * k_spec.group * tiles.num_warps)
    if head_dim > 128:                    # the row-major launch's 8 warps x 8 tokens -> 4 warps x one key group
        tiles = replace(tiles, block_n=4 * k_spec.group, num_warps=4)
    rows_per_program = channel_key_rows(head_dim, rows)
    tiles = replace(tiles, warp_rows=rows_per_program, **channel_key_tiny(grid, head_dim),
                    **channel_key_small(grid, head_dim, k_spec, rows))
    return tiles if channel_key_layouts(tiles, k_spec, v_spec, head_dim) else cfg


def channel_key_asm(grid: str, head_dim: int, k_spec: QuantSpec, rows: int) -> bool:
    """Whether per-channel keys on warp tiles unpack their fields in inline PTX (`asm_unpack`).

    4-bit keys at head_dim 256, at 128 off the tiny grid or with more than WARP_TILE_ROWS query rows, and at 64 in
    programs of up to WARP_TILE_ROWS rows. H200 sweeps, KIVI-4 (results/bench/bench_formats_kivi4_grid_h200.md):
    head_dim 128 from batch 3 on 1.43 -> 1.62x SDPA at batch 8 / 100k (group 4), 256 at every point timed (batch 32
    / 100k 1.54 -> 1.68x); at batch 1 / head_dim 128 1-3 % slower with up to 8 rows, and with 12-16 rows (16-row
    programs, 4k-100k; results/bench/bench_formats_kivi_rows16_h200.md) 0.996-1.06x faster; head_dim 64
    (results/bench/bench_formats_kivi_tiny_h200.md), groups 1 / 4 / 8, batch 1 / 8k to 32 / 100k: 0.93-1.00x the time
    (batch 32 / 100k 0.821-0.831 -> 0.763-0.788 ms), group 16 from batch 3 on 1.03-1.06x.

    2-bit keys at head_dim 128 and, on the tiny grid (batch 1), at 64. H200 sweeps, KIVI-2
    (results/bench/bench_formats_kivi_rows16_h200.md): head_dim 128 batch 8 / 32k and 32 / 100k 1.34 / 1.64 -> 1.38 /
    1.72x SDPA (group 4), batch 1 / 100k 1.46 -> 1.48x (group 4), 1.16 -> 1.17-1.24x (groups 12 / 16); head_dim 64 at
    batch 1 / 100k 1.16 -> 1.25x (group 4), 0.87-0.88 -> 0.90-0.91x (groups 12 / 16), and at batch 8 / 32k and 32 /
    100k 1.15 / 1.30 -> 1.14 / 1.29x (group 4), which keep the byte unpack."""
    if k_spec.container_bits == 2:
        return head_dim == 128 or (head_dim == 64 and grid == "tiny")
    if k_spec.container_bits != 4:
        return False
    if head_dim == 128:
        return grid != "tiny" or rows > WARP_TILE_ROWS
    return head_dim > 128 or (head_dim == 64 and rows <= WARP_TILE_ROWS)


def channel_key_tiny(grid: str, head_dim: int) -> dict:
    """DecodeConfig fields of per-channel-key tiles on the tiny grid (batch 1) up to head_dim 128: no register cap
    and 2 programs per SM (TINY_CHANNEL_KEYS) instead of the small grid's 128-register cap and 4 per SM, whose loops
    spill (offline, `python scripts/dev/decode_sass.py --launches --layout kivi4`: 58-166 spill instructions at
    head_dim 128). H200, batch 1 at 1k / 8k / 32k / 100k (results/bench/bench_formats_kivi_tiny_h200.md): the sweep
    (KIVI-2 and KIVI-4 at head_dim 64 / 128, groups 4 / 16) took 0.71-0.96x the time at 25 of the 30 points it
    changes (KIVI-4 head_dim 64 group 16 at 32k 36.9 -> 26.3 us) and 1.02-1.12x at 5 (KIVI-4 head_dim 64 group 4 at
    100k 1.11x, KIVI-2 head_dim 128 group 16 at 8k 1.12x); uncapped at 4 per SM it was slower at 10 (to 1.17x). The
    rule itself at groups 1 / 3 / 8 / 12: KIVI-2 1.12-1.18x faster at head_dim 64 and 1.04-1.07x at 128, KIVI-4
    1.13-1.17x at 128 (medians); KIVI-4 at 64 with up to 8 rows slower at 100k (40.1-42.1 -> 46.3-46.8 us). Head_dim
    64 with 16 rows up to 4k keeps the row-major loop (`short_history_row_major`)."""
    return TINY_CHANNEL_KEYS if grid == "tiny" and head_dim <= 128 else {}


def channel_key_small(grid: str, head_dim: int, k_spec: QuantSpec, rows: int) -> dict:
    """DecodeConfig fields of per-channel-key tiles on the small grid (batch 2, or batch 1 past the tiny grid's token
    bound) up to head_dim 128: no register cap (the family's 4 programs per SM kept) instead of its 128-register cap,
    under which the 16-row programs' loops spill (offline, `python scripts/dev/decode_sass.py --launches --layout
    kivi2`: 258 spill instructions at head_dim 64), except for up to WARP_TILE_ROWS rows of 2-bit keys at head_dim
    128 and of 4-bit keys at 64, where lifting the cap was slower. H200, batch 2 at 8k-100k and batch 1 / 128k
    (results/bench/bench_formats_kivi_small_h200.md): with 12-16 rows 0.48-0.96x the time at all 38 points timed
    against the cap (KIVI-2 at head_dim 64 / 100k 0.268 -> 0.129-0.130 ms, at 128 0.282 -> 0.177-0.187); with 1-8 rows
    KIVI-2 at head_dim 64 0.93-0.99x at 14 of 16 points (1.004-1.006x at 2) and KIVI-4 at 128 0.88-0.90x from 32k on
    (0.99-1.03x at 8k); at group 4 KIVI-2 at 128 1.10-1.12x and KIVI-4 at 64 1.20-1.25x from 32k on (those keep the
    cap); 2 programs per SM on top was slower at 100k."""
    if grid != "small" or head_dim > 128:
        return {}
    slower_uncapped = (k_spec.container_bits, head_dim) in ((2, 128), (4, 64))
    return {} if rows <= WARP_TILE_ROWS and slower_uncapped else {"maxnreg": None}


def channel_key_rows(head_dim: int, rows: int) -> int | None:
    """8-row programs (`warp_rows`) for per-channel keys with more than WARP_TILE_ROWS query rows per KV head at
    head_dim 256, else None (the default's one 16-row program). At head_dim 256, on every grid (H200, groups 12 / 16,
    KIVI-2 0.56-0.98x the time at every point of the grid, batch 32 / 100k 0.92 -> 1.14x SDPA; KIVI-4 faster at 7 of
    8 points timed, results/bench/bench_formats_kivi4_grid_h200.md). Below it the tiny grid (batch 1) took 8-row
    programs too while its programs ran under the small grid's 128-register cap (KIVI-2 at head_dim 64 at 8k / 32k
    0.024 / 0.061 -> 0.022 / 0.046 ms, results/bench/bench_formats_kivi_grid_h200.md); under `channel_key_tiny`'s
    uncapped launch one 16-row program is faster (H200, group 16, results/bench/bench_formats_kivi_rows16_h200.md:
    KIVI-2 at head_dim 64 8k / 32k / 100k 0.021 / 0.040 / 0.093 -> 0.019 / 0.031 / 0.068 ms, at 128 0.027 / 0.057 /
    0.141 -> 0.022 / 0.043 / 0.098, KIVI-4 at 128 0.028 / 0.059 / 0.141 -> 0.023 / 0.044 / 0.098)."""
    return WARP_TILE_ROWS if rows > WARP_TILE_ROWS and head_dim > 128 else None


def eight_row_programs(cfg: DecodeConfig, head_dim: int, rows: int, units: int, sms: int, history_tokens: int,
                       k_spec: QuantSpec, v_spec: QuantSpec) -> DecodeConfig:
    """cfg with 8-row programs (`warp_rows`) where a call has more query rows per KV head than WARP_TILE_ROWS over a
    packed history of 2-bit per-token K and V (`two_bit_token_layouts`): twice the programs, each on the word loop,
    the row blocks of a split neighbours in launch order (common.py's `_program_ids`), so the second finds the history
    in L2. An explicit cfg.warp_rows is kept. Two cases, H100, groups 12 and 16:

    Short histories: fewer units than SMs and at most SHORT_HISTORY_TOKENS packed tokens, where one 16-row program's
    latency dominates. Head_dim 64 / 128 / 256 (results/bench/sweep_short_rows.md): at 1k and batch 1 / 3 / 8
    0.60-0.91x -> 0.76-1.04x SDPA, at 4k and batch 1 0.82-1.06x -> 0.93-1.28x; at 8k and batch 1 and at batch 32 /
    1k the 16-row program is faster. At head_dim 256 with 64 units (batch 8) the 16-row program was faster at 1k
    (1.02-1.05x against 0.93-0.96x SDPA, one group per row) and within 3 % either way at 2k and 4k
    (results/bench/sweep_short_rows_4k.md), so there the rule takes fewer than one unit per
    SHORT_HISTORY_WIDE_HEAD_SMS_PER_UNIT SMs.

    Head_dim 256 with several (scale, zero) groups per row (OSCAR's and naive INT2's groups of 128), beyond short
    histories or with fewer units than SMs: the 16-row program of that layout took 1.12-1.13x the time at batch 8 /
    1k (0.85-0.88x -> 0.96-0.99x SDPA) and 0.99-1.21x from batch 1 / 8k to batch 32 / 100k (batch 32 / 100k:
    2.95-2.96x -> 3.29x SDPA); at batch 32 / 1k it stays (0.96-0.97x the 8-row time). With one group per row the
    16-row program stays faster beyond short histories (results/bench/sweep_rows8_wide_head.md)."""
    if cfg.warp_rows is not None or rows <= WARP_TILE_ROWS or history_tokens <= 0 or \
            not two_bit_token_layouts(k_spec, v_spec, head_dim):
        return cfg
    sms_per_unit = SHORT_HISTORY_WIDE_HEAD_SMS_PER_UNIT if head_dim > 128 else 1
    short = history_tokens <= SHORT_HISTORY_TOKENS and units * sms_per_unit < sms
    grouped_wide_head = head_dim > 128 and not single_group_layouts(k_spec, v_spec, head_dim) and \
        (history_tokens > SHORT_HISTORY_TOKENS or units < sms)
    return replace(cfg, warp_rows=WARP_TILE_ROWS) if short or grouped_wide_head else cfg


def launch_grid(head_dim: int, k_spec: QuantSpec, v_spec: QuantSpec, rows: int, units: int, sms: int,
                history_tokens: int) -> str:
    """`grid_size`'s family, except that more than WARP_TILE_ROWS query rows over 2-bit per-token K and V at head_dim
    <= 128 (`two_bit_token_layouts`) take "medium" (two-warp 128-token programs) within its token bound
    (WIDE_ROWS_MEDIUM_TOKENS_PER_SM packed tokens per SM) however many units there are. H200 sweep at batch 32 (256
    units), groups 12 and 16 (results/bench/sweep_short_large_h200.md): 1k 0.88-0.98x the large grid's time
    (head_dim 64 group 16 0.040 -> 0.035 ms), 8k 0.95-0.97x (head_dim 64 group 16 0.137 -> 0.132 ms, SDPA's time);
    with up to 8 rows (group 4) it was 5 % slower at 8k, so those keep `grid_size`'s family (and, up to 4k,
    `short_history_two_warps`). At batch 12 and 16 (1k-16k, groups 12 and 16) it took 0.84-0.97x the large grid's
    time (results/bench/sweep_short_rows8_h200.md)."""
    grid = grid_size(units, sms, history_tokens, rows)
    wide_rows = rows > WARP_TILE_ROWS and head_dim <= 128 and two_bit_token_layouts(k_spec, v_spec, head_dim)
    return "medium" if grid == "large" and wide_rows and within_wide_rows_tokens(units, sms, history_tokens) else grid


def short_history_two_warps(cfg: DecodeConfig, grid: str, head_dim: int, rows: int, history_tokens: int,
                            k_spec: QuantSpec, v_spec: QuantSpec) -> DecodeConfig:
    """cfg with the large grid's tile halved to 128 tokens in two-warp programs (its split density and register cap
    kept) where up to WARP_TILE_ROWS query rows read at most SHORT_HISTORY_TOKENS packed tokens of 2-bit per-token K
    and V at head_dim <= 128 on the large grid (as many units as SMs or more: batch >= 17 at 8 KV heads). H200 sweep,
    groups 1 / 3 / 4 / 8 at batch 24 / 1k and batch 32 / 1k-8k (results/bench/sweep_short_rows8_h200.md): up to 4k
    0.84-0.95x the time at head_dim 64 (batch 32 / 1k 0.024-0.026 -> 0.021-0.023 ms, SDPA 0.022) and 0.87-0.97x at
    128; at 8k 1.01-1.07x, at head_dim 256 1.14-1.21x everywhere. The medium family's 16 programs per SM were
    slower at batch 32 / 1k (sweep_short_large_h200.md)."""
    if grid != "large" or rows > WARP_TILE_ROWS or head_dim > 128 or not 0 < history_tokens <= SHORT_HISTORY_TOKENS \
            or not two_bit_token_layouts(k_spec, v_spec, head_dim):
        return cfg
    return replace(cfg, block_n=128, num_warps=2)


def short_channel_key_history(cfg: DecodeConfig, grid: str, rows: int, history_tokens: int, bound: int) -> bool:
    """Per-channel keys on warp tiles serving more than WARP_TILE_ROWS query rows on the tiny grid (batch 1) over at
    most `bound` packed tokens: where `short_history_row_major` and `short_history_eight_rows` change the launch."""
    return cfg.channel_key_tiles and grid == "tiny" and rows > WARP_TILE_ROWS and 0 < history_tokens <= bound


def short_history_row_major(cfg: DecodeConfig, grid: str, head_dim: int, rows: int,
                            history_tokens: int) -> DecodeConfig:
    """cfg, or the row-major loop (`default_config`'s launch for per-channel keys) where per-channel keys on warp tiles
    at head_dim 64 would serve more than WARP_TILE_ROWS query rows on the tiny grid (batch 1) over at most
    SHORT_HISTORY_TOKENS packed tokens. H200, groups 12 / 16, batch 1 / 1k: KIVI-4 6.9-7.0 us on the row-major loop
    against 9.9-10.1 us on the two-group tiles (results/bench/bench_formats_kivi4_grid_h200.md), KIVI-2 8 against 9
    us in 8-row programs (bench_formats_kivi_grid_h200.md); from 8k on the tiles were faster (KIVI-2) or within 1.8
    us (KIVI-4 at 8k: 16.6 against 18.4 us; 32k 41.0 against 35.0)."""
    if head_dim != 64 or not short_channel_key_history(cfg, grid, rows, history_tokens, SHORT_HISTORY_TOKENS):
        return cfg
    return default_config(head_dim, True, grid, False, rows)


def short_history_eight_rows(cfg: DecodeConfig, grid: str, head_dim: int, rows: int,
                             history_tokens: int) -> DecodeConfig:
    """cfg with 8-row programs (`warp_rows`) where per-channel keys on warp tiles at head_dim 128 serve more than
    WARP_TILE_ROWS query rows on the tiny grid (batch 1) over at most SHORT_KIVI_EIGHT_ROW_TOKENS packed tokens.
    H200, groups 12 / 16, batch 1 (results/bench/bench_formats_kivi_rows16_h200.md): at 1k two 8-row programs took
    0.011 ms against 0.012-0.013 for one 16-row program (KIVI-2 and KIVI-4, 0.62-0.63x -> 0.68-0.72x SDPA); at 4k the
    16-row program was faster (0.019-0.020 against 0.021-0.022 ms). The bound lies between the two timed points."""
    if head_dim != 128 or not short_channel_key_history(cfg, grid, rows, history_tokens, SHORT_KIVI_EIGHT_ROW_TOKENS):
        return cfg
    return replace(cfg, warp_rows=WARP_TILE_ROWS)


def default_launch(head_dim: int, k_spec: QuantSpec, v_spec: QuantSpec, rows: int, units: int, sms: int,
                   history_tokens: int, fp_tokens: int = 0) -> DecodeConfig:
    """The launch `decode_attention` takes on a GPU of `sms` SMs when given no config, for `units` (sequence, KV head)
    pairs of `rows` query rows over `history_tokens` packed tokens and `fp_tokens` fp-segment rows: the family by
    `launch_grid`, its launch by `launch_config`, then `short_history_row_major`, `short_history_eight_rows`,
    `short_history_two_warps`, `eight_row_programs`, `four_row_pairs`, `column_meta_pairs`, `short_history_one_split`,
    `short_history_narrow_tiles`, `wide_head_short_one_tile_splits`, `wide_head_wide_rows_two_warps`,
    `short_history_four_rows`, `small_grid_short_wide_rows_two_warps` and `masked_pair_tile_launches`; without packed
    history `fp_only_launch`."""
    grid = launch_grid(head_dim, k_spec, v_spec, rows, units, sms, history_tokens)
    cfg = short_history_row_major(launch_config(head_dim, True, grid, k_spec, v_spec, rows), grid, head_dim, rows,
                                  history_tokens)
    cfg = short_history_eight_rows(cfg, grid, head_dim, rows, history_tokens)
    cfg = short_history_two_warps(cfg, grid, head_dim, rows, history_tokens, k_spec, v_spec)
    cfg = eight_row_programs(cfg, head_dim, rows, units, sms, history_tokens, k_spec, v_spec)
    if history_tokens == 0:
        return fp_only_launch(cfg, head_dim, rows, grid, fp_tokens)
    cfg = column_meta_pairs(four_row_pairs(cfg, grid, head_dim, rows, history_tokens, k_spec, v_spec), grid,
                            head_dim, k_spec, v_spec)
    cfg = short_history_one_split(cfg, head_dim, units, sms, history_tokens, k_spec, v_spec)
    cfg = short_history_narrow_tiles(cfg, head_dim, units, sms, history_tokens, k_spec, v_spec)
    cfg = wide_head_short_one_tile_splits(cfg, grid, head_dim, rows, history_tokens, k_spec, v_spec)
    cfg = wide_head_wide_rows_two_warps(cfg, grid, head_dim, rows, k_spec, v_spec)
    cfg = short_history_four_rows(cfg, head_dim, rows, units, sms, history_tokens, k_spec, v_spec)
    cfg = small_grid_short_wide_rows_two_warps(cfg, grid, head_dim, rows, history_tokens, k_spec, v_spec)
    return masked_pair_tile_launches(cfg, grid, head_dim, rows, k_spec, v_spec)


def one_split_history(history_tokens: int, k_spec: QuantSpec, v_spec: QuantSpec, head_dim: int) -> bool:
    """2-bit per-token K and V (`two_bit_token_layouts`) over at most ONE_SPLIT_HISTORY_TOKENS packed tokens: where
    `short_history_one_split` and `short_history_narrow_tiles` were measured."""
    return 0 < history_tokens <= ONE_SPLIT_HISTORY_TOKENS and two_bit_token_layouts(k_spec, v_spec, head_dim)


def short_history_one_split(cfg: DecodeConfig, head_dim: int, units: int, sms: int, history_tokens: int,
                            k_spec: QuantSpec, v_spec: QuantSpec) -> DecodeConfig:
    """cfg with programs_per_sm=2 where 2-bit per-token K and V (`two_bit_token_layouts`) of as many units as SMs or
    more (batch >= 17 at 8 KV heads on an H200) hold at most ONE_SPLIT_HISTORY_TOKENS packed tokens: `_split_target`
    then plans one history split and one fp split per unit (its large-batch bound) where 3-4 programs per unit wrote
    partials for the merge. H200, 2026-12-02, each point's default launch beside this one in one run
    (results/bench/bench_kernel_short_splits_h200.md): batch 24 / 32 at 1k 0.74-0.96x the time at all 18 points
    (head_dim 64 / 128 / 256, groups 1 / 8 / 16; in another call head_dim 128 groups 1-12 and head_dim 256 groups
    1 / 8 / 16 at batch 32 / 1k 0.74-0.83x); at 2k 0.77-1.19x, at 4k-8k 0.90-1.28x, so longer histories keep their
    plan."""
    if units < sms or not one_split_history(history_tokens, k_spec, v_spec, head_dim):
        return cfg
    return replace(cfg, programs_per_sm=2)


def short_history_narrow_tiles(cfg: DecodeConfig, head_dim: int, units: int, sms: int, history_tokens: int,
                               k_spec: QuantSpec, v_spec: QuantSpec) -> DecodeConfig:
    """cfg with 64-token history tiles (block_n) at head_dim 128 where 2-bit per-token K and V of at most one unit per
    two SMs (batch 1-8 at 8 KV heads on an H200) hold at most ONE_SPLIT_HISTORY_TOKENS packed tokens: twice the splits
    of one tile on the tiny grid, each program's serial latency halved. H200, 2026-12-02, each point's default beside
    this one in one run, two calls (results/bench/bench_kernel_short_splits_h200.md): batch 1 / 1k 0.90-1.01x the
    time (groups 1-16), batch 3 / 1k 0.89-0.98x, batch 8 / 1k 0.95-1.00x; batch 1 / 2k 1.07-1.08x. Head_dim 64
    (0.96-1.07x at 1k) and 256 (0.99-1.33x) keep their tiles."""
    if head_dim != 128 or 2 * units > sms or not one_split_history(history_tokens, k_spec, v_spec, head_dim):
        return cfg
    return replace(cfg, block_n=64)


def wide_head_short_one_tile_splits(cfg: DecodeConfig, grid: str, head_dim: int, rows: int, history_tokens: int,
                                    k_spec: QuantSpec, v_spec: QuantSpec) -> DecodeConfig:
    """cfg with splits of one tile (min_split_tiles=1, the tiny grid's two otherwise: `default_config`) at head_dim
    256 on the tiny grid (batch 1) with up to WARP_TILE_ROWS rows, where 2-bit per-token K and V hold at most
    ONE_SPLIT_HISTORY_TOKENS packed tokens: six splits of 1k's six tiles instead of three, each program's serial
    latency halved. H200, 2026-12-02, each point's default beside this one in one run, three calls
    (results/bench/bench_kernel_wide_head_launches_h200.md): batch 1 / 1k groups 1-8 0.90-0.94x the time; at 2k
    1.13-1.16x, with 12-16 rows 1.18x, so those keep two tiles."""
    if grid != "tiny" or head_dim != 256 or rows > WARP_TILE_ROWS or \
            not one_split_history(history_tokens, k_spec, v_spec, head_dim):
        return cfg
    return replace(cfg, min_split_tiles=1)


def wide_head_wide_rows_two_warps(cfg: DecodeConfig, grid: str, head_dim: int, rows: int, k_spec: QuantSpec,
                                  v_spec: QuantSpec) -> DecodeConfig:
    """cfg in two-warp programs (64 tokens per warp of the 128-token tile) at head_dim 256 on the medium grid with
    more than WARP_TILE_ROWS rows (groups 12-16 at batch 3-8) for 2-bit per-token K and V: what head_dim 64 and 128's
    medium launch does (`default_config`). H200, 2026-12-02, each point's default beside this one in one run
    (results/bench/bench_kernel_wide_head_launches_h200.md): batch 3 / 1k 0.95-0.98x the time, 2k 0.93x, 4k-32k
    0.86-0.91x, 100k 0.99x; batch 4 / 1k-8k 0.85-0.93x; batch 6 / 1k-2k 0.91-0.99x; batch 8 / 8k 0.91-0.92x, 32k
    0.98x, 1k 0.97-1.04x (group 12 1.03-1.04x in four calls: the one point slower). With up to 8 rows the same change
    was mixed (batch 3 / 1k 1.13-1.15x, 100k 1.05x; batch 8 0.90-0.98x), so those keep four warps."""
    if grid != "medium" or head_dim != 256 or rows <= WARP_TILE_ROWS or \
            not two_bit_token_layouts(k_spec, v_spec, head_dim):
        return cfg
    return replace(cfg, num_warps=2)


def small_grid_short_wide_rows_two_warps(cfg: DecodeConfig, grid: str, head_dim: int, rows: int,
                                         history_tokens: int, k_spec: QuantSpec, v_spec: QuantSpec) -> DecodeConfig:
    """cfg in two-warp programs with no register cap where 2-bit per-token K and V at head_dim 128 serve more than
    WARP_TILE_ROWS query rows (groups 12-16, in 8-row programs there: `eight_row_programs`) on the small grid (batch
    2 at 8 KV heads) over a `one_split_history`. H200, 2026-12-03, the default beside the variants in one run, one round
    (results/bench/bench_formats_small_grid_rows16_h200.md): batch 2 / 1k 0.015 -> 0.010 ms (0.60-0.61x -> 0.87-0.88x
    SDPA) at groups 12 and 16; at 8k 1.04-1.07x the time, 32k 1.02-1.03x and 100k 1.18x, where the default stays
    (the bound lies between the timed 864 and 8,032 tokens). Dropping only the cap (the 16-row program's 33 spill
    instructions at 8k, `python scripts/dev/decode_sass.py --launches`) was no faster: 1.00-1.09x from 1k to 100k."""
    if grid != "small" or head_dim != 128 or rows <= WARP_TILE_ROWS or \
            not one_split_history(history_tokens, k_spec, v_spec, head_dim):
        return cfg
    return replace(cfg, num_warps=2, maxnreg=None)


def short_history_four_rows(cfg: DecodeConfig, head_dim: int, rows: int, units: int, sms: int, history_tokens: int,
                            k_spec: QuantSpec, v_spec: QuantSpec) -> DecodeConfig:
    """cfg with 4-row programs (`warp_rows`; token pairs, as `four_row_pairs`) at head_dim 64 where 5 to
    SHORT_FOUR_ROW_MAX_ROWS query rows per KV head read at most ONE_SPLIT_HISTORY_TOKENS packed tokens of 2-bit
    per-token K and V with at most one unit per two SMs (batch 1-8 at 8 KV heads on an H200). Likely why (not
    profiled): shorter serial chains per program, and 12 rows fill three 4-row programs where two 8-row ones held 4
    padding rows. It runs last in `default_launch`, over `eight_row_programs`' 8 rows, so that the launch is the one
    measured (`column_meta_pairs`, timed with up to 4 rows only, does not see it).

    H200, 2026-12-03, each point's default beside this launch in one run
    (results/bench/bench_kernel_short_four_rows_h200.md): at 1k, group 8 batch 1 / 3 / 8 0.87 / 0.79 / 0.93x the time,
    group 12 0.86 / 0.91 / 0.92x; group 16 0.94 / 0.94 / 1.09x (so 16 rows keep theirs); batch 32 / 1k 1.04-1.37x; at
    8k group 8 batch 3 / 8 1.30 / 1.13x, so longer histories keep theirs. On this rule's tree the 8-row programs took
    1.07-1.27x its time at those 1k points (2k unchanged). Rows 5-7 and 9-11 (GQA 6, GQA 3-5 x T_q 2) were not
    timed."""
    if head_dim != 64 or not PAIR_TILE_ROWS < rows <= SHORT_FOUR_ROW_MAX_ROWS or 2 * units > sms or \
            not one_split_history(history_tokens, k_spec, v_spec, head_dim) or not cfg.token_pairs or \
            not uses_warp_tiles(cfg, k_spec, v_spec, head_dim):
        return cfg
    return replace(cfg, warp_rows=PAIR_TILE_ROWS)


def column_meta_pairs(cfg: DecodeConfig, grid: str, head_dim: int, k_spec: QuantSpec,
                      v_spec: QuantSpec) -> DecodeConfig:
    """cfg with `column_meta` (pairs.py `_pair_meta`: each pair's two (scale, zero) loaded as one [W, PW, 2] tensor
    and repeated over each parity's columns at its use: 8 block barriers per tile at head_dim 128 where four
    [W, PW, 1] tensors per side had 16) where it was measured faster; H200, 2026-12-02,
    results/bench/bench_kernel_column_meta_h200.md:
    - KIVI-2's channel-key pairs at head_dim 64: 0.90-0.96x the time on the medium and large grids (batch 3 / 8 at 32k,
      32 / 100k; two rounds, trees alternating); on the tiny and small grids 0.97-1.05x (one round): not taken there;
    - 2-bit pairs with one (scale, zero) per token (head_dim 64, and 128's wide pairs): 0.95-0.96x on the large grid
      (batch 32 / 100k, two rounds) but 1.01-1.03x on the medium one (batch 3 / 8 at 32k), which keeps the four
      tensors; on the tiny and small grids (head_dim 64, batch 1-2, 8k-100k, GQA 1 and 3) 0.93-0.98x at 9 of 10
      points and 1.02x at batch 1 / 8k (8 us) in one round, 0.97-0.98x at batch 1 / 32k in another.
    In 8- and 16-row pair programs (head_dim 64, GQA 8-16, batch 1-32, 1k-100k; results/bench/
    bench_kernel_column_meta_rows_h200.md) 0.99-1.04x the time, median 1.00 (two rounds): they keep theirs. An
    explicit cfg.column_meta is kept."""
    if cfg.column_meta or not cfg.token_pairs or cfg.warp_rows != PAIR_TILE_ROWS:
        return cfg
    channel_pairs = channel_key_layouts(cfg, k_spec, v_spec, head_dim) and grid in ("medium", "large")
    token_pairs = single_group_layouts(k_spec, v_spec, head_dim) and grid != "medium"
    two_bit = k_spec.container_bits == v_spec.container_bits == 2
    return replace(cfg, column_meta=True) if two_bit and (channel_pairs or token_pairs) else cfg


def masked_pair_tile_launches(cfg: DecodeConfig, grid: str, head_dim: int, rows: int, k_spec: QuantSpec,
                              v_spec: QuantSpec) -> DecodeConfig:
    """cfg with `masked_pair_tiles` (one pair loop masking every tile, the loop before whole tiles went unmasked)
    where the two-body loop (whole tiles unmasked, then the partial ones masked) was slower on an H200
    (results/bench/bench_kernel_whole_tiles_h200.md, one round per point, trees alternating in each call):
    - head_dim 128's wide pairs: the second body spills under the 168-register cap (a spill instruction in the loop,
      `scripts/dev/decode_sass.py --layout int2-wide`): 1.03-1.06x the time at batch 8 / 32, 32k / 100k;
    - 8-row pair programs (head_dim 64, GQA 5-8): 9 spill instructions under the same cap (`--layout int2-d64`),
      1.02-1.03x at batch 32;
    - the tiny grid (batch 1): 1.00-1.11x at 1k-8k (GQA 4, 8 and 16; slower at 4 of 6 points; likely, not
      profiled: a split there holds few tiles and its partial one runs outside the pipelined loop); the small grid
      (batch 2, not timed) with it.
    4-row (no spills) and 16-row (uncapped) pair programs on the medium and large grids keep whole tiles unmasked:
    4 rows 0.93-1.01x at batch 8-32 / 32k-100k, 16 rows 0.87-0.96x there and 0.94x at batch 32 / 8k."""
    token_bytes = head_dim * k_spec.container_bits // 8                              # the pair loop's layouts only
    if not (single_group_layouts(k_spec, v_spec, head_dim) and k_spec.container_bits == v_spec.container_bits and
            reads_token_pairs(cfg, token_bytes, k_spec, v_spec, head_dim)):
        return cfg
    masked = cfg.wide_pairs or _warp_rows(cfg, rows) == WARP_TILE_ROWS or grid in ("tiny", "small")
    return replace(cfg, masked_pair_tiles=True) if masked else cfg


def four_row_pairs(cfg: DecodeConfig, grid: str, head_dim: int, rows: int, history_tokens: int, k_spec: QuantSpec,
                   v_spec: QuantSpec) -> DecodeConfig:
    """cfg with 4-row programs (`warp_rows`) where up to PAIR_TILE_ROWS query rows per KV head (GQA 1-4) read 2-bit K
    and V over token pairs: the pair dots' N is 2 x rows per program, so 8-row programs spent half of their scores,
    softmax and value accumulators on padding rows at GQA 4. H200, one round each, trees alternating in one call:
    - head_dim 64, one (scale, zero) per token (results/bench/sweep_rows4_h200.md): 0.72-0.85x the time at the kernel
      grid's 48 head_dim-64 points of GQA 1, 3 and 4 (batch 1-32, 1k-100k), 0.72x at batch 110 / 100k;
    - head_dim 64, KIVI-2's per-channel keys (`channel_key_layouts`; results/bench/sweep_pairs_kivi_d128_h200.md, the
      same 48 points): 0.82-0.97x from batch 3 on and at batch 1 up to 32k, 1.06-1.09x at batch 1 / 100k, so the tiny
      grid keeps 8 rows above KIVI_TINY_FOUR_ROW_TOKENS (32k-100k not timed);
    - head_dim 128 on the medium and large grids above SHORT_HISTORY_TOKENS per unit, reading 32-byte tokens as
      64-byte pair rows (`wide_pairs`, the same file): 0.94-0.99x from 8k on at batch 3-32, 1.03-1.09x at batch 3-8 /
      1k. On plain warp tiles (N = rows) 4-row programs had been up to 10 % slower there from batch 8 on.
    INT4's and KIVI-4's 32-byte tokens at head_dim 64 were not timed on 4 rows and keep theirs. An explicit
    cfg.warp_rows is kept."""
    two_bit = k_spec.container_bits == v_spec.container_bits == 2
    if cfg.warp_rows is not None or rows > PAIR_TILE_ROWS or not cfg.token_pairs or not two_bit or \
            not uses_warp_tiles(cfg, k_spec, v_spec, head_dim):
        return cfg
    single_group = single_group_layouts(k_spec, v_spec, head_dim)
    channel_pairs = channel_key_layouts(cfg, k_spec, v_spec, head_dim) and \
        (grid != "tiny" or history_tokens <= KIVI_TINY_FOUR_ROW_TOKENS)
    if head_dim == 64 and (single_group or channel_pairs):
        return replace(cfg, warp_rows=PAIR_TILE_ROWS)
    if head_dim == 128 and single_group and grid in ("medium", "large") and history_tokens > SHORT_HISTORY_TOKENS:
        return replace(cfg, warp_rows=PAIR_TILE_ROWS, wide_pairs=True)
    return cfg


def fp_only_launch(cfg: DecodeConfig, head_dim: int, rows: int, grid: str, fp_tokens: int) -> DecodeConfig:
    """cfg for a call without packed history (BF16 on the harness's engine, `bf16+graph`: the whole context in the fp
    segment of `fp_tokens` rows; a prompt within the sink and recent window) on the `grid` family:

    At a head_dim of FP_ONLY_HEAD_DIMS stage 1 is compiled without the history loops, so its fp programs no longer
    hold their registers (head_dim 64: 64-144 instead of 128-255 per launch, `python scripts/dev/decode_sass.py
    --launches --fp-only`). H200, the BF16 kernel at batch 1-32, 1k and 8k, groups 4 and 16
    (results/bench/bench_kernel_fp_only_h200.md, one round): head_dim 64 0.75-1.00x the time (group 16 at batch 8-32
    0.75-0.79x); head_dim 128 0.80-1.23x (group 4 at batch 32 1.17-1.23x) and 256 0.98-1.03x, so those keep the
    history loops.

    On the large grid (batch >= 3 at 8 KV heads) the fp-segment tile of INT2's launches (32 tokens, set for its 320
    sink + recent rows) is short for a whole context: FP_ONLY_LARGE_TILE tokens at head_dim 64 beyond
    SHORT_HISTORY_TOKENS rows, and at 128 with more than WARP_TILE_ROWS rows. H200, batch 3-32 at 1k-100k, alternating
    with the 32-token tile (results/bench/bench_kernel_fp_tiles_h200.md): head_dim 64 from 8k 0.82-1.00x the time
    (batch 8 / 100k 482.0 -> 396.8 us, SDPA 377.6) except group 16 at batch 3 / 100k (1.05x), at 1k 1.02-1.16x (so
    not there); head_dim 128 / group 16 0.74-0.97x everywhere. Head_dim 128 with 4 rows and 256 were fastest on their
    defaults (sweep: results/bench/sweep_fp_only_h200.md)."""
    cfg = replace(cfg, history_loops=head_dim not in FP_ONLY_HEAD_DIMS)
    long_narrow = head_dim == 64 and fp_tokens > SHORT_HISTORY_TOKENS
    wide_rows = head_dim == 128 and rows > WARP_TILE_ROWS
    return replace(cfg, block_f=FP_ONLY_LARGE_TILE[head_dim]) if grid == "large" and (long_narrow or wide_rows) else cfg


@lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _split_target(cfg: DecodeConfig, units: int, tokens: int, device: torch.device) -> int:
    """Programs to aim for: deep splitting for small batches, half as deep once B*H_kv fills the SMs (measured on an
    H100: 8/SM is best at batch 1-8, 4/SM at batch 32, Qwen3-8B shapes). Where half as deep would leave one split per
    unit (from 528 units on an H200: batch 66 at 8 KV heads), splits of at most LARGE_BATCH_SPLIT_TOKENS of a unit's
    `tokens` (history and fp rows) instead: at batch 110 / 100k three splits took 0.91-0.95x the time of one (H200,
    results/bench/bench_kernel_large_batch_splits_h200.md); from two splits to three was no faster (batch 48-64 /
    100k: 0.99-1.04x the time), so fewer units keep their plan. At batch 66 and 80 / 64k-100k the bound took
    0.80-1.01x the time of one split (same file, call 4)."""
    sms = _sm_count(device.index or 0)
    if units < sms:
        return cfg.programs_per_sm * sms
    halved = max(1, cfg.programs_per_sm // 2) * sms
    return halved if units < halved else units * triton.cdiv(tokens, LARGE_BATCH_SPLIT_TOKENS)


def _num_splits(units: int, tokens: int, block: int, target_programs: int, min_tiles: int,
                tile_merge_ratio: int = 0) -> int:
    """Splits per (sequence, KV head): enough programs for the target, at least min_tiles tiles each.

    tile_merge_ratio r > 0 balances the longest split (tiles / s tiles) against the merge (s partials): with a
    tile costing r partials, tiles / s + s / r is least at s = sqrt(r x tiles), the most splits taken.
    """
    if tokens == 0:
        return 0
    most = triton.cdiv(tokens, block * min_tiles)
    if tile_merge_ratio:
        most = min(most, math.ceil(math.sqrt(tile_merge_ratio * triton.cdiv(tokens, block))))
    return max(1, min(triton.cdiv(target_programs, units), most))


def _layout(spec: QuantSpec, head_dim: int) -> int:
    if spec.axis == "channel":
        return CHANNEL
    return TOKEN if spec.group == head_dim else TOKEN_GROUPED


def single_group_layouts(k_spec: QuantSpec, v_spec: QuantSpec, head_dim: int) -> bool:
    """K and V both hold one (scale, zero) per token and head."""
    return _layout(k_spec, head_dim) == TOKEN == _layout(v_spec, head_dim)


def _whole_field_groups(spec: QuantSpec, head_dim: int) -> bool:
    """A token-axis layout whose (scale, zero) groups each cover whole fields (D * bits / 8 coordinates)."""
    return spec.axis == "token" and spec.group % (head_dim * spec.container_bits // 8) == 0


def _value_row_blocks(spec: QuantSpec, head_dim: int) -> bool:
    """Token-axis value groups that warp tiles serve: whole fields, or >= 16 coordinates (the value MMA's M) that
    divide a field, each group then one row block of the field's bytes (`kernels/decode/warp_tiles.py`'s
    `_value_tiles`: KIVI's groups of 32 at head_dim 256 and 2 bits, or at head_dim 128 and 4 bits)."""
    field = head_dim * spec.container_bits // 8
    return _whole_field_groups(spec, head_dim) or (spec.axis == "token" and field % spec.group == 0
                                                   and spec.group >= 16)


def wide_token_fields(k_spec: QuantSpec, v_spec: QuantSpec, head_dim: int) -> bool:
    """K and V both store 4-bit codes at head_dim 128: 64 bytes per token and head, twice INT2's (head_dim 256 at 2
    bits has 64 bytes too, but its own tile: `default_config`; only this case was swept)."""
    return head_dim == 128 and k_spec.container_bits == 4 == v_spec.container_bits


def per_token_layouts(k_spec: QuantSpec, v_spec: QuantSpec, head_dim: int) -> bool:
    """K and V both hold per-token (scale, zero) groups of whole fields: the layouts warp tiles serve (the
    single-group layout, and e.g. two groups of 128 at head_dim 256 and 2 bits)."""
    return _whole_field_groups(k_spec, head_dim) and _whole_field_groups(v_spec, head_dim)


def two_bit_token_layouts(k_spec: QuantSpec, v_spec: QuantSpec, head_dim: int) -> bool:
    """2-bit K and V in per-token layouts of whole fields (`per_token_layouts`): what the tiny grid's INT2 launch and
    the short-history 8-row programs were measured on."""
    return per_token_layouts(k_spec, v_spec, head_dim) and k_spec.container_bits == v_spec.container_bits == 2


def channel_key_layouts(cfg: DecodeConfig, k_spec: QuantSpec, v_spec: QuantSpec, head_dim: int) -> bool:
    """Per-channel keys whose token groups (>= 16 tokens: the MMA's M) tile a warp's sub-tile (BLOCK_N / num_warps
    tokens: one or more whole groups), beside per-token value groups of whole fields or row blocks
    (`_value_row_blocks`): KIVI's layout on warp tiles (`DecodeConfig.channel_key_tiles`,
    kernels/decode/channel_keys.py; `launch_config` takes it wherever it applies)."""
    return (cfg.channel_key_tiles and k_spec.axis == "channel" and (cfg.block_n // cfg.num_warps) % k_spec.group == 0
            and k_spec.group >= 16 and _value_row_blocks(v_spec, head_dim))


def uses_warp_tiles(cfg: DecodeConfig, k_spec: QuantSpec, v_spec: QuantSpec, head_dim: int) -> bool:
    """DecodeConfig.warp_tiles applies to per-token layouts with >= 16 tokens per warp and tile (the MMA's M for
    the scores, its K for the values), and to `channel_key_layouts`; other launches take the row-major loop."""
    if not cfg.warp_tiles or cfg.block_n // cfg.num_warps < 16:
        return False
    return per_token_layouts(k_spec, v_spec, head_dim) or channel_key_layouts(cfg, k_spec, v_spec, head_dim)


def uses_token_pairs(cfg: DecodeConfig, k_codes: torch.Tensor, v_codes: torch.Tensor, k_spec: QuantSpec,
                     v_spec: QuantSpec, head_dim: int) -> bool:
    """Warp tiles read pair rows (kernels/decode/pairs.py) where both K and V pack a token into the same bytes, stored
    back to back, and `reads_token_pairs` holds for that width."""
    width = k_codes.shape[-1]
    contiguous = all(codes.shape[-1] == width == codes.stride(-2) for codes in (k_codes, v_codes))
    return contiguous and reads_token_pairs(cfg, width, k_spec, v_spec, head_dim)


def reads_token_pairs(cfg: DecodeConfig, token_bytes: int, k_spec: QuantSpec, v_spec: QuantSpec,
                      head_dim: int) -> bool:
    """Whether warp tiles over tokens of `token_bytes` bytes, stored back to back, read pair rows: 16-byte tokens
    (head_dim 64 at 2 bits) where each warp owns >= 16 pair rows (the MMA's M and K), with one (scale, zero) per token,
    or with KIVI's per-channel keys on warp tiles (`channel_key_layouts`: whole key groups per warp, channel_keys.py's
    `_history_warp_channel_pairs`); with cfg.wide_pairs, 4-row programs read 32-byte tokens (head_dim 128 at 2 bits)
    as 64-byte pair rows too."""
    widths = (16, 32) if cfg.wide_pairs and cfg.warp_rows == PAIR_TILE_ROWS else (16,)
    layouts = single_group_layouts(k_spec, v_spec, head_dim) or channel_key_layouts(cfg, k_spec, v_spec, head_dim)
    return (cfg.token_pairs and token_bytes in widths and cfg.block_n // (2 * cfg.num_warps) >= 16
            and uses_warp_tiles(cfg, k_spec, v_spec, head_dim) and layouts)


def uses_pair_words(cfg: DecodeConfig, row_block: int) -> bool:
    """Pair rows (kernels/decode/pairs.py) read their codes as 16-bit words in programs of up to WARP_TILE_ROWS query
    rows under no register cap below 168; 16-row programs and the small grid's 128-register cap keep bytes, where
    words spill inside the loop (offline, `python scripts/dev/decode_sass.py --launches`: 23 spill instructions on
    the tiny grid's 16-row launch, 36 against 5 on the small grid's 8-row one; results/bench/decode_sass.md; on the
    H100 that small-grid program on bytes: batch 2 / 100k 0.081 -> 0.068 ms, results/bench/bench_formats_d64_cap.md)."""
    return row_block <= WARP_TILE_ROWS and (cfg.maxnreg is None or cfg.maxnreg >= 168)


def _warp_rows(cfg: DecodeConfig, rows: int) -> int:
    """Query rows per warp-tile program: cfg.warp_rows, else WARP_TILE_ROWS up to that many rows, else ROW_BLOCK (more
    rows than a program holds take several programs, each reading the history again, mostly from L2)."""
    if cfg.warp_rows is None:
        return WARP_TILE_ROWS if rows <= WARP_TILE_ROWS else ROW_BLOCK
    if cfg.warp_rows not in (PAIR_TILE_ROWS, WARP_TILE_ROWS, ROW_BLOCK):
        raise ValueError(f"warp_rows must be {PAIR_TILE_ROWS}, {WARP_TILE_ROWS} or {ROW_BLOCK}, got {cfg.warp_rows}.")
    return cfg.warp_rows


def check_launch(q, tensors, fp_k, fp_v) -> None:
    """What any stage-1 kernel needs of its inputs (`tensors`, q among them): a supported head_dim, at most
    MAX_ROWS query rows per KV head, one device, contiguous last dims, fp_k / fp_v of one layout."""
    head_dim = q.shape[-1]
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {head_dim}.")
    rows = (q.shape[1] // fp_k.shape[1]) * q.shape[2]
    if rows > MAX_ROWS:
        raise ValueError(f"GQA group x T_q = {rows} query rows per KV head exceeds {MAX_ROWS}.")
    if any(t.device != q.device for t in tensors):
        raise ValueError("all decode inputs must be on the same device as q.")
    if any(t.dim() and t.stride(-1) != 1 for t in tensors):
        raise ValueError("every decode input must be contiguous in its last dim.")
    if fp_k.stride() != fp_v.stride():
        raise ValueError("fp_k and fp_v must share strides.")


def _check_kernel_support(k_spec, v_spec, k_scale, k_zero, v_scale, v_zero) -> None:
    """What the affine stage-1 kernel needs of its specs and metadata."""
    for name, spec in (("k", k_spec), ("v", v_spec)):
        if spec.container_bits not in (2, 4, 8):
            raise ValueError(f"{name}_spec: unsupported bits {spec.bits}.")
        if spec.axis == "token" and spec.group & (spec.group - 1):
            raise ValueError(f"{name}_spec: token-axis group must be a power of two, got {spec.group}.")
    if k_scale.stride() != k_zero.stride() or v_scale.stride() != v_zero.stride():
        raise ValueError("scale/zero pairs must share strides.")


def rows_aligned(codes: torch.Tensor, nbytes: int) -> bool:
    """Packed codes [B, H, N, bytes] start on `nbytes` bytes and step over sequences, heads and tokens by multiples of
    it: what a kernel reading a row's codes as `nbytes`-byte words needs (INT2's warp tiles: 2, TurboQuant's keys:
    4)."""
    return codes.data_ptr() % nbytes == 0 and all(stride % nbytes == 0 for stride in codes.stride()[:3])


def _check_word_aligned(k_codes: torch.Tensor, v_codes: torch.Tensor) -> None:
    """Warp tiles read the packed codes as 16-bit words (kernels/decode/warp_tiles.py): every code tensor must start
    on an even byte and step over tokens, heads and sequences by even byte counts."""
    for name, codes in (("k_codes", k_codes), ("v_codes", v_codes)):
        if not rows_aligned(codes, 2):
            raise ValueError(f"{name} must start on an even byte with even strides (16-bit loads), got strides "
                             f"{tuple(codes.stride())}.")


_MERGE_COUNTERS: dict[torch.device, torch.Tensor] = {}


def merge_counters(device: torch.device, n: int) -> torch.Tensor:
    """At least n zeroed int32 counters for single-launch merges on `device`: kept across calls (the merging
    program resets its counter), so a CUDA graph replays with them; one decode call in flight per device."""
    counters = _MERGE_COUNTERS.get(device)
    if counters is None or counters.numel() < n:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("single-launch decode allocates its counters in its first call; run one call "
                               "eagerly before capturing a CUDA graph.")
        counters = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)    # a floor: few regrowths
        _MERGE_COUNTERS[device] = counters
    return counters


def run_split_k(q, kv_heads: int, n_hist: int, n_fp: int, cfg: DecodeConfig, on_gpu: bool, num_splits: int | None,
                row_block: int, stage1, single_launch: bool = False) -> torch.Tensor:
    """Plan the splits, run stage 1 and the stage-2 merge -> out [B, H_q, T_q, D] (zeros without any key), held
    token-major ([B, T_q, H_q, D] memory, what the model's output projection reads: `out.transpose(1, 2)` is
    contiguous, so the seam's hand-over costs no copy kernel).

    stage1(grid, part_o, part_lse, hist_splits, fp_splits, out, counters) launches a format's stage-1 kernel on
    `grid` (row blocks of `row_block`, splits, B * H_kv: common.py's `_program_ids`); it fills part_o
    [B * H_kv, splits, rows, D] and part_lse [B * H_kv, splits, rows] (fp32), hist_splits history splits first.
    single_launch: the stage-1 kernel merges into `out` itself (`counters` given, no stage 2); otherwise counters is
    None.
    """
    batch, q_heads, q_tokens, head_dim = q.shape
    units, n_rows = batch * kv_heads, (q_heads // kv_heads) * q_tokens
    target = _split_target(cfg, units, n_hist + n_fp, q.device) if on_gpu else 1
    hist_splits = num_splits if num_splits is not None and n_hist else \
        _num_splits(units, n_hist, cfg.block_n, target, cfg.min_split_tiles, cfg.tile_merge_ratio)
    fp_splits = _num_splits(units, n_fp, cfg.block_f, target, cfg.min_split_tiles, cfg.tile_merge_ratio)
    n_splits = hist_splits + fp_splits
    out = q.new_empty(batch, q_tokens, q_heads, head_dim).transpose(1, 2)   # [B, H_q, T_q, D], token-major memory
    if n_splits == 0 or out.numel() == 0:
        return out.zero_()
    part_o = q.new_empty(units, n_splits, n_rows, head_dim, dtype=torch.float32)
    part_lse = q.new_empty(units, n_splits, n_rows, dtype=torch.float32)
    row_blocks = triton.cdiv(n_rows, row_block)
    counters = merge_counters(q.device, units * row_blocks) if single_launch else None
    stage1((row_blocks, n_splits, units), part_o, part_lse, hist_splits, fp_splits, out, counters)
    if single_launch:
        return out
    pdl = uses_pdl(cfg, q.device, on_gpu)
    block_s, warps = merge_launch(cfg.merge_block, n_splits, head_dim, units * n_rows)
    _decode_stage2_kernel[(units, n_rows)](
        part_o, part_lse, out, n_splits, kv_heads, q_tokens, n_rows, *out.stride()[:3],
        GROUP=q_heads // kv_heads, D=head_dim, BLOCK_S=block_s, PDL=pdl, num_warps=warps, launch_pdl=pdl,
    )
    return out


def merge_launch(merge_block: int, n_splits: int, head_dim: int, merge_rows: int) -> tuple[int, int]:
    """Stage 2's splits per iteration and warps for `merge_rows` (B * H_q * T_q) merges of `n_splits` partials.

    Up to FITTED_MERGE_SPLITS splits the tile holds just the call's splits (a power of two) in a warp per 512 of its
    elements, at head_dim 256 only from WIDE_HEAD_FITTED_MERGE_ROWS merges on; otherwise `merge_block` splits in 4
    warps. With 4-6 splits (batch 3-32 at 1k, batch 32 at any length) that 64-split tile spent the merge on
    masked-off splits: fitted, batch 32 / 1k took 0.75-0.96x the time (group 16: head_dim 64 47.9 -> 40.3 us, 128
    64.9 -> 49.0, 256 127.2 -> 107.9) and batch 3-8 / 1k 0.87-1.00x, no point of the 108 more than 1 % slower. Fitted
    everywhere, 16-19 splits in a 32-split tile (batch 3-8 / 8k) took up to 1.12x and head_dim 256 below 1,024
    merged rows 1.02-1.07x at 1k (H200, results/bench/bench_kernel_grid_merge_h200.md)."""
    if n_splits > FITTED_MERGE_SPLITS or (head_dim > 128 and merge_rows < WIDE_HEAD_FITTED_MERGE_ROWS):
        return merge_block, 4
    block_s = min(merge_block, triton.next_power_of_2(n_splits))
    return block_s, max(1, min(4, block_s * head_dim // 512))


def compiles_history(hist_splits: int, cfg: DecodeConfig) -> bool:
    """Whether stage 1 is compiled with the history loops (its HISTORY constexpr): always for a call with history
    splits, and for one without them unless its launch drops the loops (`DecodeConfig.history_loops`, set by
    `fp_only_launch`)."""
    return hist_splits > 0 or cfg.history_loops


def uses_pdl(cfg: DecodeConfig, device: torch.device, on_gpu: bool) -> bool:
    """Stage 2 launches as a programmatic dependent of stage 1 (cfg.pdl) on GPUs that have it (compute capability
    9.0 on: griddepcontrol), never under the interpreter."""
    return cfg.pdl and on_gpu and _compute_major(device.index or 0) >= 9


@lru_cache(maxsize=None)
def _compute_major(device_index: int) -> int:
    return torch.cuda.get_device_capability(device_index)[0]


def decode_attention(q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, fp_k, fp_v,
                     hist_len, fp_len, hist_start, fp_start, *, sm_scale: float, k_spec: QuantSpec,
                     v_spec: QuantSpec, num_splits: int | None = None,
                     config: DecodeConfig | None = None) -> torch.Tensor:
    """Triton version of `decode_attention_reference` (same arguments and result) -> [B, H_q, T_q, D].

    num_splits: history splits per (sequence, KV head); default fills the GPU (`DecodeConfig`).
    """
    tensors = (q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, fp_k, fp_v,
               hist_len, fp_len, hist_start, fp_start)
    check_decode_inputs(*tensors, k_spec, v_spec)
    check_launch(q, tensors, fp_k, fp_v)
    _check_kernel_support(k_spec, v_spec, k_scale, k_zero, v_scale, v_zero)
    batch, q_heads, q_tokens, head_dim = q.shape
    kv_heads = fp_k.shape[1]
    group, on_gpu = q_heads // kv_heads, q.is_cuda and not interpreter_forced()
    if config is not None:
        cfg = config
    elif on_gpu:
        cfg = default_launch(head_dim, k_spec, v_spec, group * q_tokens, batch * kv_heads,
                             _sm_count(q.device.index or 0), k_codes.shape[2], fp_k.shape[2])
    else:
        cfg = launch_config(head_dim, False, "large", k_spec, v_spec, group * q_tokens)
        if k_codes.shape[2] == 0:               # the interpreter takes the GPU's choices for calls without history
            cfg = fp_only_launch(cfg, head_dim, group * q_tokens, "large", fp_k.shape[2])
    warp_tiles = uses_warp_tiles(cfg, k_spec, v_spec, head_dim)
    token_pairs = uses_token_pairs(cfg, k_codes, v_codes, k_spec, v_spec, head_dim)
    row_block = _warp_rows(cfg, group * q_tokens) if warp_tiles else ROW_BLOCK
    if warp_tiles:
        _check_word_aligned(k_codes, v_codes)

    def stage1(grid, part_o, part_lse, hist_splits, fp_splits, out, counters):
        _decode_stage1_kernel[grid](
            q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, fp_k, fp_v,
            hist_len, fp_len, hist_start, fp_start, part_o, part_lse, part_lse if counters is None else counters,
            out, sm_scale * LOG2E, kv_heads, q_tokens, group * q_tokens, hist_splits, fp_splits, *out.stride()[:3],
            *q.stride()[:3], *k_codes.stride()[:3], *k_scale.stride()[:3],
            *v_codes.stride()[:3], *v_scale.stride()[:3], *fp_k.stride()[:3],
            GROUP=group, D=head_dim, K_BITS=k_spec.container_bits, V_BITS=v_spec.container_bits,
            K_LAYOUT=_layout(k_spec, head_dim), V_LAYOUT=_layout(v_spec, head_dim),
            K_GROUP=k_spec.group, V_GROUP=v_spec.group,
            WARP_TILES=warp_tiles, TOKEN_PAIRS=token_pairs, PAIR_WORDS=uses_pair_words(cfg, row_block),
            COLUMN_META=cfg.column_meta and token_pairs, WARPS=cfg.num_warps, BLOCK_R=row_block,
            BLOCK_N=cfg.block_n, BLOCK_F=cfg.block_f, FP16=on_gpu, ASM_UNPACK=on_gpu and cfg.asm_unpack,
            SINGLE_LAUNCH=counters is not None, PDL=uses_pdl(cfg, q.device, on_gpu),
            HISTORY=compiles_history(hist_splits, cfg), MASKED_PAIRS=cfg.masked_pair_tiles,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
            **({"maxnreg": cfg.maxnreg} if on_gpu and cfg.maxnreg else {}),
        )
    return run_split_k(q, kv_heads, k_codes.shape[2], fp_k.shape[2], cfg, on_gpu, num_splits, row_block, stage1,
                       single_launch=cfg.single_launch)

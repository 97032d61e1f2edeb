"""Triton decode attention (`kernels.decode`) against the torch reference, plus kernel dispatch.

Runs under TRITON_INTERPRET=1 on CPU (set below when CUDA is unavailable), where the kernel computes in
fp32, so outputs must match the fp32 reference to 1e-4. Lengths, GQA ratios, head dims, bit widths,
layouts, left padding and multi-token causal chunks are spread over a few cases (the interpreter is slow).
The inline-PTX unpack (`DecodeConfig.asm_unpack`) only runs compiled on a GPU (TRITON_INTERPRET=0); on CPU
its PTX text is checked by a small emulator of the four instructions it uses.
"""
import os
from dataclasses import replace

import numpy as np
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from kernels.decode import (FIELD_EXACT, FIELD_TINY, GRIDS, DecodeConfig, _field_ptx, decode_attention,  # noqa: E402
                            default_config, launch_config, per_token_layouts, uses_pdl, uses_token_pairs,
                            uses_warp_tiles)
from kernels.decode.common import PAIR_TILE_ROWS, WARP_TILE_ROWS  # noqa: E402
from kernels.decode.launch import TINY_INT2, default_launch, four_row_pairs  # noqa: E402
from kernels.decode.warp_tiles import _half_field_ptx  # noqa: E402
from kernels.dispatch import interpreter_forced, use_triton  # noqa: E402
from kernels.decode.reference import decode_attention_reference  # noqa: E402
from kernels.reference import quantize_pack_reference  # noqa: E402
from kernels.format import QuantSpec  # noqa: E402
from harness.quantizer import build_quantizer  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = 1e-4 if DEVICE == "cpu" else 2e-2  # fp32 in the interpreter; fp16 dot operands on the GPU


def make_inputs(batch, q_heads, kv_heads, q_tokens, head_dim, n_hist, n_fp, k_spec, v_spec, *, seed=0,
                left_pad=True, fp_dtype=torch.float32, key_ramp=0.0):
    """Random q, packed history (via the reference quantizer), fp segment and per-sequence lengths. key_ramp > 0:
    every query leans on coordinate 0 and the keys' coordinate 0 rises by key_ramp every 256 history tokens, so the
    scores' running max jumps far above its last value after the first tiles (flat tiles in between)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, q_heads, q_tokens, head_dim, generator=gen)
    k = torch.randn(batch, kv_heads, n_hist, head_dim, generator=gen)
    if key_ramp:
        q[..., 0] += 4.0
        k[..., 0] += key_ramp * (torch.arange(n_hist) // 256)
    k_packed = quantize_pack_reference(k, k_spec)
    v_packed = quantize_pack_reference(torch.randn(batch, kv_heads, n_hist, head_dim, generator=gen), v_spec)
    fp_k, fp_v = (torch.randn(batch, kv_heads, n_fp, head_dim, generator=gen).to(fp_dtype) for _ in range(2))
    hist_len = torch.randint(max(n_hist - 5, 0), n_hist + 1, (batch,), generator=gen, dtype=torch.int32)
    fp_len = torch.randint(max(n_fp - 3, q_tokens), n_fp + 1, (batch,), generator=gen, dtype=torch.int32)
    hist_start = torch.zeros(batch, dtype=torch.int32)
    fp_start = torch.zeros(batch, dtype=torch.int32)
    if left_pad:
        hist_start = torch.minimum(torch.randint(0, 6, (batch,), generator=gen, dtype=torch.int32), hist_len)
        fp_start = torch.minimum(torch.randint(0, 3, (batch,), generator=gen, dtype=torch.int32), fp_len - q_tokens)
    tensors = (q, *k_packed, *v_packed, fp_k, fp_v, hist_len, fp_len, hist_start, fp_start)
    return tuple(t.to(DEVICE) for t in tensors), dict(sm_scale=head_dim ** -0.5, k_spec=k_spec, v_spec=v_spec)


INT2 = {d: QuantSpec(bits=2, group=d) for d in (64, 128, 256)}
INT4 = {d: QuantSpec(bits=4, group=d) for d in (64, 128, 256)}
CASES = {  # name: (B, H_q, H_kv, T_q, D, N, M, k_spec, v_spec, num_splits)
    "int2-g4-d128-n1000-splits3": (2, 8, 2, 1, 128, 1000, 37, INT2[128], INT2[128], 3),
    "int4-g3-d64-n129-tq4-grouped-v": (3, 3, 1, 4, 64, 129, 20, INT4[64], QuantSpec(bits=4, group=32), None),
    "int2-g8-d256-n128-tq2-kivi-k": (1, 8, 1, 2, 256, 128, 17, QuantSpec(bits=2, group=32, axis="channel"),
                                     QuantSpec(bits=2, group=64), 2),
    "mixed-g1-d64-n1": (2, 2, 2, 1, 64, 1, 5, INT2[64], INT4[64], None),
    "int4k-int2v-g4-d128-n15-tq16": (2, 4, 1, 16, 128, 15, 40, INT4[128], INT2[128], None),
    "int4k-int2v-g4-d128-n300-tq16": (1, 4, 1, 16, 128, 300, 20, INT4[128], INT2[128], None),  # 4 row blocks
    "int2-g4-d128-n127-symmetric": (1, 4, 1, 1, 128, 127, 9, QuantSpec(bits=2, group=128, symmetric=True),
                                    QuantSpec(bits=2, group=128, scale_dtype="float32"), None),
}


@pytest.mark.parametrize("name", CASES)
def test_matches_reference(name):
    *shape, num_splits = CASES[name]
    args, kw = make_inputs(*shape)
    out = decode_attention(*args, **kw, num_splits=num_splits)
    ref = decode_attention_reference(*args, **kw)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert (out - ref).abs().max().item() < TOL


def test_bf16_fp_segment_without_left_padding():
    args, kw = make_inputs(2, 4, 2, 1, 128, 64, 12, INT2[128], INT2[128], left_pad=False, fp_dtype=torch.bfloat16)
    assert (decode_attention(*args, **kw) - decode_attention_reference(*args, **kw)).abs().max().item() < TOL


@pytest.mark.parametrize("head_dim", [64, 128])
def test_empty_history_is_plain_causal_attention(head_dim):
    """No history split: stage 1 compiled without the history loops at head_dim 64, with them at 128."""
    args, kw = make_inputs(1, 4, 2, 3, head_dim, 0, 11, INT2[head_dim], INT2[head_dim])
    assert (decode_attention(*args, **kw) - decode_attention_reference(*args, **kw)).abs().max().item() < TOL


def test_only_head_dim_64_drops_the_history_loops_without_history():
    """`fp_only_launch` / `compiles_history`: HISTORY=False only for calls without packed history at head_dim 64
    (measured faster there; mixed at 128, 0.80-1.23x; equal at 256), never for a call with history splits."""
    from kernels.decode.launch import compiles_history, default_launch
    launches = {d: default_launch(d, INT2[d], INT2[d], 4, 8, 132, 0) for d in (64, 128, 256)}
    assert not compiles_history(0, launches[64])
    assert compiles_history(1, launches[64]) and compiles_history(0, launches[128]) and \
        compiles_history(0, launches[256])
    assert compiles_history(0, default_launch(64, INT2[64], INT2[64], 4, 8, 132, 1024))


def test_calls_without_history_take_longer_fp_tiles_on_the_large_grid():
    """`fp_only_launch`: on the large grid a call without packed history reads 128-token fp tiles at head_dim 64
    beyond 4k fp rows and 64-token ones at 128 with more than 8 rows; shorter segments, INT2's calls, the small grid
    and head_dim 256 keep 32 or their own."""
    from kernels.decode.launch import SHORT_HISTORY_TOKENS, default_launch

    def launch(d, rows, units, history, fp_rows=8192):
        return default_launch(d, INT2[d], INT2[d], rows, units, 132, history, fp_rows)
    assert launch(64, 4, 64, 0).block_f == 128 and launch(64, 16, 256, 0).block_f == 128
    assert launch(64, 4, 64, 0, SHORT_HISTORY_TOKENS).block_f == 32 and launch(64, 4, 64, 0, 0).block_f == 32
    assert launch(128, 16, 64, 0, 1024).block_f == 64 and launch(128, 4, 64, 0).block_f == 32
    assert launch(256, 16, 64, 0).block_f == 32 and launch(64, 4, 64, 4096).block_f == 32
    assert launch(64, 4, 8, 0).block_f == launch(64, 4, 8, 4096).block_f == 64       # small grid (batch 1)


@pytest.mark.parametrize("head_dim, q_heads, fp_rows", [(64, 4, 4200), (128, 16, 300)])
def test_fp_only_tiles_match_the_reference(head_dim, q_heads, fp_rows):
    """A call without packed history on `fp_only_launch`'s longer fp tiles (the interpreter takes them too: 128 tokens
    at head_dim 64 beyond 4k rows, 64 at 128 with 16 rows), causal over 2 new tokens, against the reference."""
    args, kw = make_inputs(1, q_heads, 1, 2, head_dim, 0, fp_rows, INT2[head_dim], INT2[head_dim])
    assert (decode_attention(*args, **kw) - decode_attention_reference(*args, **kw)).abs().max().item() < TOL


def test_split_count_does_not_change_the_result():
    args, kw = make_inputs(1, 2, 1, 1, 64, 300, 6, INT4[64], INT4[64], seed=1)
    one, many = decode_attention(*args, **kw, num_splits=1), decode_attention(*args, **kw, num_splits=5)
    assert (one - many).abs().max().item() < TOL


def test_merge_tile_fitted_to_few_splits():
    """Up to 8 splits stage 2 takes just the call's splits (a power of two) in a warp per 512 elements; more splits,
    or head_dim 256 with fewer than 1,024 merged rows, keep the configured tile in 4 warps (`merge_launch`)."""
    from kernels.decode.launch import merge_launch
    assert merge_launch(64, 2, 128, 256) == (2, 1)
    assert merge_launch(64, 4, 64, 4096) == (4, 1)
    assert merge_launch(64, 8, 128, 8) == (8, 2)
    assert merge_launch(4, 7, 128, 8) == (4, 1)             # never above the configured tile
    assert merge_launch(64, 9, 128, 8) == (64, 4)           # more than 8 (16-19 splits in a 32-split tile: slower)
    assert merge_launch(64, 5, 256, 1023) == (64, 4)        # head_dim 256, few merges
    assert merge_launch(64, 5, 256, 1024) == (8, 4)


def test_merge_loops_over_more_splits_than_its_tile():
    """19 history splits + the fp segment's in 8-split tiles (3 iterations, the last partial, some splits
    past the history empty), and 6 splits in one fitted tile, give the reference's result."""
    args, kw = make_inputs(2, 4, 2, 1, 64, 300, 21, INT2[64], INT2[64], seed=4)
    cfg = DecodeConfig(block_n=16, block_f=16, num_stages=1, merge_block=8)
    out = decode_attention(*args, **kw, num_splits=19, config=cfg)
    assert (out - decode_attention_reference(*args, **kw)).abs().max().item() < TOL
    fitted = decode_attention(*args, **kw, num_splits=5, config=cfg)      # 6 splits in an 8-split tile, 2 masked
    assert (fitted - decode_attention_reference(*args, **kw)).abs().max().item() < TOL


def test_register_cap_config_matches_reference():
    """DecodeConfig.maxnreg (the sweep's register cap) reaches the GPU launch only; results stay the reference's."""
    args, kw = make_inputs(1, 4, 1, 1, 128, 200, 9, INT2[128], INT2[128], seed=2)
    out = decode_attention(*args, **kw, config=DecodeConfig(block_n=64, block_f=32, num_stages=1, maxnreg=128))
    assert (out - decode_attention_reference(*args, **kw)).abs().max().item() < TOL


def test_asm_unpack_config_matches_reference():
    """DecodeConfig.asm_unpack reaches the GPU launch only (the interpreter falls back to `_field`); results stay
    the reference's."""
    args, kw = make_inputs(1, 4, 1, 1, 128, 200, 9, INT2[128], INT4[128], seed=3)
    out = decode_attention(*args, **kw, config=DecodeConfig(block_n=64, block_f=32, num_stages=1, asm_unpack=True))
    assert (out - decode_attention_reference(*args, **kw)).abs().max().item() < TOL


@pytest.mark.parametrize("name", ["int2-g4-d128-n1000-splits3", "mixed-g1-d64-n1", "int4k-int2v-g4-d128-n300-tq16",
                                  "int2-g4-d128-n127-symmetric"])
def test_warp_tiles_match_reference(name):
    """DecodeConfig.warp_tiles (one token sub-tile per warp, tokens as the MMA's M) on single-group token layouts,
    mixed bit widths and multi-token chunks (GQA x T_q > 8 rows takes 16-row programs)."""
    *shape, num_splits = CASES[name]
    args, kw = make_inputs(*shape)
    cfg = DecodeConfig(block_n=64, block_f=32, num_stages=1, warp_tiles=True)
    out = decode_attention(*args, **kw, num_splits=num_splits, config=cfg)
    assert (out - decode_attention_reference(*args, **kw)).abs().max().item() < TOL


GROUPED = {  # name: (B, H_q, H_kv, T_q, D, N, M, k_spec, v_spec, num_splits): several (scale, zero) per token
    "oscar-gemma-d256-g128": (2, 4, 1, 1, 256, 700, 19, QuantSpec(bits=2, group=128), QuantSpec(bits=2, group=128), 2),
    "int2-d128-g32-k-single-v": (2, 8, 2, 1, 128, 301, 9, QuantSpec(bits=2, group=32), INT2[128], None),
    "int4-d256-g128-tq3": (1, 8, 2, 3, 256, 260, 12, QuantSpec(bits=4, group=128), QuantSpec(bits=4, group=128), 3),
}


@pytest.mark.parametrize("name", GROUPED)
def test_grouped_token_layouts_take_warp_tiles_and_match_reference(name):
    """Token groups that cover whole fields (OSCAR's group 128 at head_dim 256: fields 0-1 and 2-3) run on warp
    tiles, each group's (scale, zero) folded around its own fields' dots, and match the reference."""
    *shape, num_splits = GROUPED[name]
    args, kw = make_inputs(*shape)
    cfg = DecodeConfig(block_n=64, block_f=32, num_stages=1, warp_tiles=True)
    assert uses_warp_tiles(cfg, kw["k_spec"], kw["v_spec"], shape[4])
    out = decode_attention(*args, **kw, num_splits=num_splits, config=cfg)
    assert (out - decode_attention_reference(*args, **kw)).abs().max().item() < TOL


KIVI_TILES = {  # name: (B, H_q, H_kv, T_q, D, N, M, k_spec, v_spec, num_splits): per-channel keys, groups of 32
    "kivi2-d128-splits3": (2, 8, 2, 1, 128, 992, 13, QuantSpec(bits=2, group=32, axis="channel"),
                           QuantSpec(bits=2, group=32), 3),
    "kivi2-d64-g3": (3, 6, 2, 1, 64, 320, 9, QuantSpec(bits=2, group=32, axis="channel"), QuantSpec(bits=2, group=32),
                     None),
    "kivi4-d128-tq2": (1, 8, 2, 2, 128, 256, 7, QuantSpec(bits=4, group=32, axis="channel"),
                       QuantSpec(bits=4, group=128), 2),
    "kivi2-d64-tq4-splits3": (2, 6, 2, 4, 64, 512, 11, QuantSpec(bits=2, group=32, axis="channel"),
                              QuantSpec(bits=2, group=32), 3),
    "kivi2-d64-g1-short": (1, 2, 2, 1, 64, 32, 5, QuantSpec(bits=2, group=32, axis="channel"),
                           QuantSpec(bits=2, group=64), None),
    "kivi4-d128-value-blocks": (2, 8, 2, 1, 128, 288, 9, QuantSpec(bits=4, group=32, axis="channel"),
                                QuantSpec(bits=4, group=32), 2),
    "kivi2-d256-value-blocks": (1, 4, 1, 2, 256, 192, 7, QuantSpec(bits=2, group=32, axis="channel"),
                                QuantSpec(bits=2, group=32), None),
    "kivi4-d64-splits3": (2, 8, 2, 1, 64, 480, 9, QuantSpec(bits=4, group=32, axis="channel"),
                          QuantSpec(bits=4, group=32), 3),
    "kivi4-d256-value-blocks": (1, 6, 1, 2, 256, 224, 7, QuantSpec(bits=4, group=32, axis="channel"),
                                QuantSpec(bits=4, group=32), 2),
}
kivi4_k, kivi4_v = QuantSpec(bits=4, group=32, axis="channel"), QuantSpec(bits=4, group=32)


@pytest.mark.parametrize("token_pairs", [True, False])
@pytest.mark.parametrize("name", KIVI_TILES)
def test_channel_key_tiles_match_reference(name, token_pairs):
    """DecodeConfig.channel_key_tiles: KIVI's per-channel keys on warp tiles, one 32-token key group per warp (the
    group's channel scales folded into the query), with histories that start and end inside a group (left
    padding) and splits whose bounds cut groups, match the reference; at head_dim 64 and 2 bits also over pair
    rows (`_history_warp_channel_pairs`), with value groups of 32 (two per token) and 64, 16-row programs (GQA 3 x
    T_q 4) and a history shorter than one group. The "splits3" cases give each warp two key groups (64 tokens); the
    "value-blocks" cases hold value groups narrower than a field (32 of a field's 64 coordinates: row blocks);
    KIVI-4 at head_dim 256 (128-byte key fields) dequantizes each field in two column chunks (`_key_chunks`), here in
    a 12-row program."""
    *shape, num_splits = KIVI_TILES[name]
    args, kw = make_inputs(*shape)
    cfg = DecodeConfig(block_n=256 if name.endswith("splits3") else 128, block_f=32, num_warps=4, num_stages=1,
                       warp_tiles=True, channel_key_tiles=True, token_pairs=token_pairs)
    assert uses_warp_tiles(cfg, kw["k_spec"], kw["v_spec"], shape[4])
    narrow = shape[4] * kw["k_spec"].bits // 8 == 16
    assert uses_token_pairs(cfg, args[1], args[4], kw["k_spec"], kw["v_spec"], shape[4]) == (token_pairs and narrow)
    if narrow or not token_pairs:
        out = decode_attention(*args, **kw, num_splits=num_splits, config=cfg)
        assert (out - decode_attention_reference(*args, **kw)).abs().max().item() < TOL


@pytest.mark.parametrize("head_dim, block_n, bits, warp_rows", [
    (64, 256, 2, WARP_TILE_ROWS), (128, 128, 2, WARP_TILE_ROWS), (256, 128, 2, WARP_TILE_ROWS),
    (128, 128, 4, WARP_TILE_ROWS), (256, 128, 4, WARP_TILE_ROWS), (64, 256, 4, None)])
def test_channel_key_tiles_in_eight_row_programs_match_reference(head_dim, block_n, bits, warp_rows):
    """12 query rows per KV head in 8-row programs (`warp_rows`: KIVI's launch from 9 rows on at head_dim 256, and at
    128 on the tiny grid over short histories) over per-channel keys on warp tiles, pair rows at head_dim 64 and 2
    bits, with splits that cut key groups; 4-bit keys at head_dim 64 in two-group tiles of one 16-row program
    (KIVI-4's launch there)."""
    args, kw = make_inputs(2, 24, 2, 1, head_dim, 480, 9, QuantSpec(bits=bits, group=32, axis="channel"),
                           QuantSpec(bits=bits, group=32))
    cfg = DecodeConfig(block_n=block_n, block_f=32, num_warps=4, num_stages=1, warp_tiles=True,
                       channel_key_tiles=True, warp_rows=warp_rows)
    assert uses_warp_tiles(cfg, kw["k_spec"], kw["v_spec"], head_dim)
    out = decode_attention(*args, **kw, num_splits=2, config=cfg)
    assert (out - decode_attention_reference(*args, **kw)).abs().max().item() < TOL


def test_channel_key_tiles_are_the_gpu_launch_where_they_serve():
    """launch_config puts KIVI's keys on warp tiles on the GPU at head_dim 64-256, every grid size (timed there,
    bench_formats_kivi.md), two key groups per warp at head_dim 64 (pair rows), four warps at 256, 8-row programs for
    12-16 query rows at head_dim 256 (one 16-row program below it, the tiny grid included); other key groups,
    per-token keys and the interpreter keep their launch (their register cap and split target are tested apart)."""
    kivi_k, kivi_v = QuantSpec(bits=2, group=32, axis="channel"), QuantSpec(bits=2, group=32)
    for head_dim in (64, 128, 256):
        for grid in GRIDS:
            cfg = launch_config(head_dim, True, grid, kivi_k, kivi_v)
            assert cfg.channel_key_tiles and uses_warp_tiles(cfg, kivi_k, kivi_v, head_dim)
            tokens_per_warp = 64 if head_dim == 64 else 32      # pair rows at head_dim 64: two key groups a warp
            assert cfg.block_n // cfg.num_warps == tokens_per_warp
            ignored = dict(warp_tiles=False, asm_unpack=False, block_n=0, num_warps=0, maxnreg=0, programs_per_sm=0)
            assert replace(cfg, channel_key_tiles=False, **ignored) == \
                replace(default_config(head_dim, True, grid, False), **ignored)  # cap, split target: tested apart
    for grid in GRIDS:                  # 12-16 rows: pair-row tiles too, 8-row programs at head_dim 256 only
        for head_dim in (64, 128, 256):
            wide_rows = launch_config(head_dim, True, grid, kivi_k, kivi_v, rows=16)
            assert wide_rows.channel_key_tiles and uses_warp_tiles(wide_rows, kivi_k, kivi_v, head_dim)
            assert wide_rows.block_n // wide_rows.num_warps == (64 if head_dim == 64 else 32)
            assert wide_rows.warp_rows == (WARP_TILE_ROWS if head_dim == 256 else None)
            assert wide_rows.asm_unpack == (head_dim == 128 or (head_dim == 64 and grid == "tiny"))  # 2-bit keys
        assert launch_config(128, True, grid, kivi_k, kivi_v, rows=8).warp_rows is None
    assert launch_config(128, True, "large", kivi4_k, kivi4_v).channel_key_tiles      # value groups as row blocks
    odd = QuantSpec(bits=2, group=64, axis="channel")
    assert launch_config(128, True, "large", odd, kivi_v) == default_config(128, True, "large", False)
    assert launch_config(128, False, "large", kivi_k, kivi_v) == default_config(128, False)
    assert launch_config(128, True, "large", INT2[128], INT2[128]) == default_config(128, True)


def test_kivi4_launch_per_shape():
    """KIVI-4 (4-bit per-channel keys) on warp tiles at every head_dim and grid: two key groups a warp at head_dim
    64, 8-row programs from 9 rows at 256 (the tiny grid's at 128 too before bench_formats_kivi_rows16_h200.md),
    inline-PTX unpack at 256, at 128 off the tiny grid or with more than 8 rows, and at 64 with up to 8 rows (the H200
    sweeps in bench_formats_kivi4_grid_h200.md and bench_formats_kivi_rows16_h200.md)."""
    for grid in GRIDS:
        for head_dim in (64, 128, 256):
            for rows in (4, 16):
                cfg = launch_config(head_dim, True, grid, kivi4_k, kivi4_v, rows=rows)
                assert cfg.channel_key_tiles and uses_warp_tiles(cfg, kivi4_k, kivi4_v, head_dim)
                assert cfg.block_n // cfg.num_warps == (64 if head_dim == 64 else 32)
                eight = rows > WARP_TILE_ROWS and head_dim == 256
                assert cfg.warp_rows == (WARP_TILE_ROWS if eight else None)
                asm = head_dim == 256 or (head_dim == 128 and (grid != "tiny" or rows > 8)) or \
                    (head_dim == 64 and rows <= 8)
                assert cfg.asm_unpack == asm


def test_kivi_tiles_run_uncapped_on_the_tiny_grid_and_with_many_rows_on_the_small_grid():
    """Per-channel-key tiles on the tiny grid (batch 1) up to head_dim 128 take TINY_CHANNEL_KEYS (no register cap,
    2 programs per SM: the H200 sweep in bench_formats_kivi_tiny_h200.md); on the small grid (batch 2) up to
    head_dim 128 they drop the cap and keep the family's split target (channel_key_small:
    bench_formats_kivi_small_h200.md), except up to WARP_TILE_ROWS rows of 2-bit keys at head_dim 128 and 4-bit keys
    at 64; the other cases keep their family's cap and split target, and the short-history row-major loop keeps
    default_config's."""
    from kernels.decode.launch import SHORT_HISTORY_TOKENS, TINY_CHANNEL_KEYS, default_launch
    kivi2_k, kivi2_v = QuantSpec(bits=2, group=32, axis="channel"), QuantSpec(bits=2, group=32)
    assert TINY_CHANNEL_KEYS == dict(maxnreg=None, programs_per_sm=2)
    for k, v in ((kivi4_k, kivi4_v), (kivi2_k, kivi2_v)):
        for head_dim in (64, 128, 256):
            for grid in GRIDS:
                for rows in (4, 16):
                    cfg = launch_config(head_dim, True, grid, k, v, rows=rows)
                    base = default_config(head_dim, True, grid, False, rows)
                    tiny = grid == "tiny" and head_dim <= 128
                    slower_uncapped = (k.container_bits, head_dim) in ((2, 128), (4, 64)) and rows <= WARP_TILE_ROWS
                    small_uncapped = grid == "small" and head_dim <= 128 and not slower_uncapped
                    expected = (None, 2) if tiny else (base.maxnreg, base.programs_per_sm)
                    if small_uncapped:
                        expected = (None, base.programs_per_sm)
                    assert (cfg.maxnreg, cfg.programs_per_sm) == expected, (head_dim, grid, rows)
        row_major = default_launch(64, k, v, 16, 8, 132, SHORT_HISTORY_TOKENS)
        assert not row_major.channel_key_tiles and row_major.maxnreg == 128
    layouts = {2: (kivi2_k, kivi2_v), 4: (kivi4_k, kivi4_v)}
    small = {(bits, head_dim, rows): launch_config(head_dim, True, "small", *layouts[bits], rows=rows).maxnreg
             for bits in (2, 4) for head_dim in (64, 128) for rows in (4, 16)}
    assert small == {(2, 64, 4): None, (2, 64, 16): None, (2, 128, 4): 128, (2, 128, 16): None,
                     (4, 64, 4): 128, (4, 64, 16): None, (4, 128, 4): None, (4, 128, 16): None}


def test_short_kivi_histories_with_many_rows_at_head_dim_64_take_the_row_major_loop():
    """default_launch: per-channel keys at head_dim 64 with 12-16 rows on the tiny grid (batch 1) over at most
    SHORT_HISTORY_TOKENS packed tokens take the row-major loop, the launch they had before warp tiles served them;
    longer histories, up to 8 rows, larger grids and other head_dims keep the warp tiles."""
    from kernels.decode.launch import SHORT_HISTORY_TOKENS, default_launch
    kivi2_k, kivi2_v = QuantSpec(bits=2, group=32, axis="channel"), QuantSpec(bits=2, group=32)
    for k, v in ((kivi4_k, kivi4_v), (kivi2_k, kivi2_v)):
        short = default_launch(64, k, v, 16, 8, 132, 704)
        assert short == default_config(64, True, "tiny", False, 16) and not uses_warp_tiles(short, k, v, 64)
        assert default_launch(64, k, v, 12, 8, 132, SHORT_HISTORY_TOKENS) == short
        for args in ((16, 8, SHORT_HISTORY_TOKENS + 1), (8, 8, 704), (16, 256, 704)):
            assert default_launch(64, k, v, *args[:2], 132, args[2]).channel_key_tiles
        assert default_launch(128, k, v, 16, 8, 132, 704).channel_key_tiles


def test_short_kivi_histories_with_many_rows_at_head_dim_128_take_eight_row_programs():
    """default_launch: per-channel keys at head_dim 128 with 12-16 rows on the tiny grid (batch 1) over at most
    SHORT_KIVI_EIGHT_ROW_TOKENS packed tokens take two 8-row programs (faster at 1k, bench_formats_kivi_rows16_h200.md);
    longer histories, up to 8 rows, larger grids and other head_dims keep their launch's rows."""
    from kernels.decode.launch import SHORT_KIVI_EIGHT_ROW_TOKENS, default_launch
    kivi2_k, kivi2_v = QuantSpec(bits=2, group=32, axis="channel"), QuantSpec(bits=2, group=32)
    for k, v in ((kivi4_k, kivi4_v), (kivi2_k, kivi2_v)):
        tiles = launch_config(128, True, "tiny", k, v, 16)
        assert tiles.warp_rows is None
        assert default_launch(128, k, v, 16, 8, 132, 896) == replace(tiles, warp_rows=WARP_TILE_ROWS)
        assert default_launch(128, k, v, 12, 8, 132, SHORT_KIVI_EIGHT_ROW_TOKENS).warp_rows == WARP_TILE_ROWS
        assert default_launch(128, k, v, 16, 8, 132, SHORT_KIVI_EIGHT_ROW_TOKENS + 1) == tiles
        assert default_launch(128, k, v, 8, 8, 132, 896).warp_rows is None
        assert default_launch(128, k, v, 16, 8, 132, 0).warp_rows is None
        assert default_launch(128, k, v, 16, 256, 132, 896).warp_rows is None           # the large grid
        assert default_launch(256, k, v, 16, 8, 132, 896) == launch_config(256, True, "tiny", k, v, 16)


def test_channel_key_tiles_need_whole_key_groups_per_warp():
    """Key groups of 32 tokens need warp sub-tiles of whole groups (32, 64, ... tokens); off unless the launch asks
    for it."""
    kivi_k, kivi_v = QuantSpec(bits=2, group=32, axis="channel"), QuantSpec(bits=2, group=32)
    cfg = DecodeConfig(block_n=128, num_warps=4, warp_tiles=True, channel_key_tiles=True)
    assert uses_warp_tiles(cfg, kivi_k, kivi_v, 128)
    assert uses_warp_tiles(replace(cfg, block_n=256), kivi_k, kivi_v, 128)
    assert not uses_warp_tiles(replace(cfg, block_n=64), kivi_k, kivi_v, 128)
    assert not uses_warp_tiles(replace(cfg, block_n=128, num_warps=8), kivi_k, kivi_v, 128)
    assert not uses_warp_tiles(replace(cfg, channel_key_tiles=False), kivi_k, kivi_v, 128)
    assert uses_warp_tiles(cfg, kivi_k, kivi_v, 256)              # value groups of 32: row blocks of a field
    assert not uses_warp_tiles(cfg, kivi_k, QuantSpec(bits=2, group=8), 128)      # blocks under the MMA's 16 rows


def test_groups_narrower_than_a_field_take_the_row_major_loop():
    """INT2 groups of 16 at head_dim 128 split a 32-coordinate field: not a per-token layout for warp tiles."""
    assert not per_token_layouts(QuantSpec(bits=2, group=16), INT2[128], 128)
    assert not per_token_layouts(INT2[128], QuantSpec(bits=2, group=32, axis="channel"), 128)
    assert per_token_layouts(QuantSpec(bits=2, group=32), QuantSpec(bits=4, group=64), 128)


@pytest.mark.parametrize("batch, group, q_tokens, n_hist, num_splits", [(3, 3, 1, 1000, 3), (2, 8, 1, 301, None),
                                                                       (2, 3, 4, 517, 2), (1, 1, 1, 33, None)])
def test_token_pairs_match_reference(batch, group, q_tokens, n_hist, num_splits):
    """Head_dim 64 at 2 bits reads two tokens per 32-byte row (kernels/decode/pairs.py): odd history starts and
    ends (left padding), split boundaries inside a pair, 16-row programs (GQA 3 x T_q 4) and a history shorter
    than one tile all match the reference."""
    args, kw = make_inputs(batch, 2 * group, 2, q_tokens, 64, n_hist, 21, INT2[64], INT2[64], seed=n_hist)
    cfg = DecodeConfig(block_n=128, block_f=32, num_warps=4, num_stages=1, warp_tiles=True)
    assert uses_token_pairs(cfg, args[1], args[4], INT2[64], INT2[64], 64)
    out = decode_attention(*args, **kw, num_splits=num_splits, config=cfg)
    assert (out - decode_attention_reference(*args, **kw)).abs().max().item() < TOL


@pytest.mark.parametrize("head_dim, group", [(64, 64), (128, 128), (256, 256), (256, 128)])
def test_warp_rows_split_16_query_rows_over_two_programs(head_dim, group):
    """DecodeConfig.warp_rows=8 with GQA 16: two 8-row programs per KV head (pairs at head_dim 64; at head_dim 256
    also with two (scale, zero) groups per row, where `eight_row_programs` takes them by default) match the
    reference; other values are refused."""
    spec = QuantSpec(bits=2, group=group)
    args, kw = make_inputs(2, 32, 2, 1, head_dim, 290, 11, spec, spec, seed=7)
    cfg = DecodeConfig(block_n=128, block_f=32, num_warps=4, num_stages=1, warp_tiles=True, warp_rows=8)
    out = decode_attention(*args, **kw, config=cfg)
    assert (out - decode_attention_reference(*args, **kw)).abs().max().item() < TOL
    with pytest.raises(ValueError, match="warp_rows must be 4, 8 or 16"):
        decode_attention(*args, **kw, config=replace(cfg, warp_rows=2))


@pytest.mark.parametrize("head_dim, group, q_tokens, n_hist, num_splits", [(64, 4, 1, 1000, 3), (64, 3, 1, 301, None),
                                                                          (64, 1, 1, 33, None), (64, 2, 2, 517, 2),
                                                                          (128, 4, 1, 290, 2), (64, 12, 1, 701, None),
                                                                          (64, 8, 1, 704, 2)])
def test_four_row_programs_match_reference(head_dim, group, q_tokens, n_hist, num_splits):
    """DecodeConfig.warp_rows=4 (`four_row_pairs`'s launch): up to 4 query rows per KV head in 4-row programs over
    token pairs at head_dim 64 (odd history ends, split boundaries inside a pair, a history shorter than one tile,
    GQA 2 x T_q 2) and over plain warp tiles at head_dim 128 match the reference; so do 8 and 12 rows in two and
    three 4-row programs (`short_history_four_rows`'s launch)."""
    spec = INT2[head_dim]
    args, kw = make_inputs(2, 2 * group, 2, q_tokens, head_dim, n_hist, 21, spec, spec, seed=n_hist)
    cfg = DecodeConfig(block_n=128, block_f=32, num_warps=4, num_stages=1, warp_tiles=True, warp_rows=4)
    assert uses_token_pairs(cfg, args[1], args[4], spec, spec, head_dim) == (head_dim == 64)
    out = decode_attention(*args, **kw, num_splits=num_splits, config=cfg)
    assert (out - decode_attention_reference(*args, **kw)).abs().max().item() < TOL


@pytest.mark.parametrize("group, q_tokens, n_hist, num_splits, maxnreg", [(4, 1, 301, 3, None), (3, 1, 200, 2, 128),
                                                                          (2, 2, 77, 1, None)])
def test_wide_pairs_match_reference(group, q_tokens, n_hist, num_splits, maxnreg):
    """DecodeConfig.wide_pairs: 4-row programs read head_dim 128's 32-byte tokens as 64-byte pair rows (pairs.py), as
    16-bit words or (under a 128-register cap, `uses_pair_words`) as bytes, and match the reference (odd ends,
    splits inside a pair, GQA 2 x T_q 2); 8-row programs keep plain warp tiles."""
    spec = INT2[128]
    args, kw = make_inputs(2, 2 * group, 2, q_tokens, 128, n_hist, 21, spec, spec, seed=n_hist)
    cfg = DecodeConfig(block_n=128, block_f=32, num_warps=4, num_stages=1, warp_tiles=True, warp_rows=4,
                       wide_pairs=True, maxnreg=maxnreg)
    assert uses_token_pairs(cfg, args[1], args[4], spec, spec, 128)
    assert not uses_token_pairs(replace(cfg, warp_rows=8), args[1], args[4], spec, spec, 128)
    out = decode_attention(*args, **kw, num_splits=num_splits, config=cfg)
    assert (out - decode_attention_reference(*args, **kw)).abs().max().item() < TOL


@pytest.mark.parametrize("group, q_tokens, n_hist", [(4, 1, 320), (2, 2, 64)])
def test_four_row_channel_key_pairs_match_reference(group, q_tokens, n_hist):
    """KIVI-2's per-channel keys at head_dim 64 over token pairs (channel_keys.py) in 4-row programs match the
    reference."""
    kivi = QuantSpec(bits=2, group=32, axis="channel")
    args, kw = make_inputs(2, 2 * group, 2, q_tokens, 64, n_hist, 21, kivi, INT2[64], seed=n_hist)
    cfg = DecodeConfig(block_n=256, block_f=32, num_warps=4, num_stages=1, warp_tiles=True, warp_rows=4,
                       channel_key_tiles=True)
    assert uses_token_pairs(cfg, args[1], args[4], kivi, INT2[64], 64)
    out = decode_attention(*args, **kw, num_splits=2, config=cfg)
    assert (out - decode_attention_reference(*args, **kw)).abs().max().item() < TOL


def test_four_row_pairs_only_where_pairs_serve_up_to_four_rows():
    """`default_launch` takes 4-row programs for GQA 1-4 over 2-bit K and V with a packed history at head_dim 64 (one
    (scale, zero) per token, or KIVI-2's per-channel keys) and, as wide pairs, at head_dim 128 on the medium and large
    grids beyond short histories (results/bench/sweep_rows4_h200.md, sweep_pairs_kivi_d128_h200.md); it keeps its plan
    for 8 rows, head_dim 128 at batch 1 or 1k, KIVI-2 at batch 1 / 100k, head_dim 256, KIVI-4, INT4's 32-byte tokens
    (no pairs) and calls without history."""
    kivi2 = QuantSpec(bits=2, group=32, axis="channel")
    kivi4 = QuantSpec(bits=4, group=32, axis="channel")
    for rows, units, history in [(1, 8, 1024), (3, 24, 8192), (4, 256, 102400), (4, 880, 102400)]:
        assert default_launch(64, INT2[64], INT2[64], rows, units, 132, history).warp_rows == PAIR_TILE_ROWS
        assert default_launch(64, kivi2, INT2[64], rows, units, 132, history).warp_rows == PAIR_TILE_ROWS
        wide = default_launch(128, INT2[128], INT2[128], rows, units, 132, history)
        assert (wide.warp_rows, wide.wide_pairs) == ((PAIR_TILE_ROWS, True) if units > 8 else (None, False))
    assert default_launch(64, kivi2, INT2[64], 4, 8, 132, 102400).warp_rows != PAIR_TILE_ROWS   # batch 1 / 100k
    assert not default_launch(128, INT2[128], INT2[128], 4, 24, 132, 1024).wide_pairs            # batch 3 / 1k
    assert default_launch(64, INT2[64], INT2[64], 8, 256, 132, 102400).warp_rows is None
    assert default_launch(64, INT2[64], INT2[64], 4, 256, 132, 0, 4096).warp_rows is None
    assert default_launch(64, kivi4, QuantSpec(bits=4, group=64), 4, 256, 132, 102400).warp_rows != PAIR_TILE_ROWS
    for int4 in (QuantSpec(bits=4, group=64), QuantSpec(bits=4, group=128)):
        assert default_launch(64, int4, int4, 4, 256, 132, 102400).warp_rows is None
    assert default_launch(256, INT2[256], INT2[256], 4, 256, 132, 102400).warp_rows is None
    explicit = DecodeConfig(block_n=256, block_f=32, num_warps=4, num_stages=3, warp_tiles=True, warp_rows=8)
    assert four_row_pairs(explicit, "large", 64, 4, 102400, INT2[64], INT2[64]) == explicit


@pytest.mark.parametrize("key_ramp", [0.0, 12.0])
@pytest.mark.parametrize("group, warp_rows", [(16, 16), (12, 16), (8, 8)])
def test_warp_tile_streams_match_the_reference_when_late_tiles_raise_the_max(group, warp_rows, key_ramp):
    """Plain warp tiles (`_warp_tile`, whole tiles unmasked, the split's partial last one masked): with keys whose
    scores jump by ~6 (log2) every 256 tokens, later tiles rescale the accumulators, sums and zero-point sums by a
    large factor, and the output matches the reference as without the ramp (16-row programs at GQA 16 and 12, whose
    padding rows never see a key, and 8-row ones)."""
    args, kw = make_inputs(1, 2 * group, 2, 1, 128, 1024, 9, INT2[128], INT2[128], key_ramp=key_ramp)
    cfg = DecodeConfig(block_n=128, block_f=32, num_warps=4, num_stages=1, warp_tiles=True, warp_rows=warp_rows)
    assert uses_warp_tiles(cfg, INT2[128], INT2[128], 128) and not uses_token_pairs(cfg, args[1], args[4],
                                                                                    INT2[128], INT2[128], 128)
    reference = decode_attention_reference(*args, **kw)
    assert (decode_attention(*args, **kw, num_splits=2, config=cfg) - reference).abs().max().item() < TOL


@pytest.mark.parametrize("layout, head_dim, group, q_tokens, n_hist, num_splits, warp_rows", [
    ("int2", 64, 4, 1, 301, 3, 4), ("int2", 64, 2, 2, 77, 1, 4), ("int2", 128, 4, 1, 301, 3, 4),
    ("int2", 128, 3, 1, 200, 2, 4), ("kivi2", 64, 4, 1, 320, 2, 4), ("kivi2", 64, 2, 2, 64, 1, 4),
    ("int2", 64, 8, 1, 301, 3, 8), ("int2", 64, 6, 1, 77, 1, 8), ("int2", 64, 12, 1, 301, 2, 16),
    ("int2", 64, 16, 1, 200, 3, 16)])
def test_column_meta_pairs_match_reference_and_the_four_tensor_form(layout, head_dim, group, q_tokens, n_hist,
                                                                   num_splits, warp_rows):
    """DecodeConfig.column_meta: the pair loops (2-bit tokens at head_dim 64, head_dim 128's wide pairs, KIVI-2's
    channel-key pairs) with each pair's (scale, zero) loaded as one [W, PW, 2] tensor and repeated per column match
    the reference (odd ends, splits inside a pair, GQA 2 x T_q 2) and, value for value, the four-tensor form; in the
    4-row programs `column_meta_pairs` picks and in the 8- and 16-row ones an explicit config may ask for."""
    k_spec = QuantSpec(bits=2, group=32, axis="channel") if layout == "kivi2" else INT2[head_dim]
    args, kw = make_inputs(2, 2 * group, 2, q_tokens, head_dim, n_hist, 21, k_spec, INT2[head_dim], seed=n_hist)
    cfg = DecodeConfig(block_n=256 if layout == "kivi2" else 128, block_f=32, num_warps=4, num_stages=1,
                       warp_tiles=True, warp_rows=warp_rows, wide_pairs=head_dim == 128,
                       channel_key_tiles=layout == "kivi2")
    assert uses_token_pairs(cfg, args[1], args[4], k_spec, INT2[head_dim], head_dim)
    columns = decode_attention(*args, **kw, num_splits=num_splits, config=replace(cfg, column_meta=True))
    assert (columns - decode_attention_reference(*args, **kw)).abs().max().item() < TOL
    assert torch.equal(columns, decode_attention(*args, **kw, num_splits=num_splits, config=cfg))


@pytest.mark.parametrize("head_dim, group, n_hist, num_splits, warp_rows", [
    (64, 4, 301, 3, 4), (64, 16, 200, 3, 16), (128, 4, 301, 3, 4), (64, 8, 77, 1, 8)])
def test_pair_loops_of_whole_unmasked_tiles_match_the_masked_loop(head_dim, group, n_hist, num_splits, warp_rows):
    """The pair loop that runs whole tiles unmasked and then a split's partial tiles masked (odd starts from left
    padding: a masked first tile; odd ends, splits inside a pair) matches the reference, and the loop that masks
    every tile (`DecodeConfig.masked_pair_tiles`) within the interpreter's rounding of a different tile order."""
    args, kw = make_inputs(2, 2 * group, 2, 1, head_dim, n_hist, 21, INT2[head_dim], INT2[head_dim], seed=n_hist)
    assert (args[-2] % 2 == 1).any()                                    # an odd history start
    cfg = DecodeConfig(block_n=128, block_f=32, num_warps=4, num_stages=1, warp_tiles=True, warp_rows=warp_rows,
                       wide_pairs=head_dim == 128)
    assert uses_token_pairs(cfg, args[1], args[4], INT2[head_dim], INT2[head_dim], head_dim)
    whole = decode_attention(*args, **kw, num_splits=num_splits, config=cfg)
    masked = decode_attention(*args, **kw, num_splits=num_splits, config=replace(cfg, masked_pair_tiles=True))
    assert (whole - decode_attention_reference(*args, **kw)).abs().max().item() < TOL
    assert (whole - masked).abs().max().item() < 1e-5


def test_masked_pair_tiles_only_where_whole_tiles_were_slower():
    """`default_launch` keeps the pair loop that masks every tile (`masked_pair_tile_launches`) for head_dim 128's
    wide pairs, 8-row pair programs and the tiny and small grids (slower or spilling with whole tiles unmasked,
    results/bench/bench_kernel_whole_tiles_h200.md); 4- and 16-row pair programs on the medium and large grids run
    whole tiles unmasked, and launches without pairs never ask for masked pair tiles."""
    def launch(head_dim, rows, batch, ctx):
        return default_launch(head_dim, INT2[head_dim], INT2[head_dim], rows, batch * 8, 132, ctx)
    assert launch(128, 4, 32, 102400).wide_pairs and launch(128, 4, 32, 102400).masked_pair_tiles
    assert launch(64, 8, 32, 102400).masked_pair_tiles                 # 8-row pair programs
    assert launch(64, 4, 1, 1024).masked_pair_tiles and launch(64, 16, 1, 8192).masked_pair_tiles  # the tiny grid
    assert not launch(64, 4, 32, 102400).masked_pair_tiles and not launch(64, 16, 32, 102400).masked_pair_tiles
    assert not launch(64, 16, 8, 32768).masked_pair_tiles              # the medium grid, 16 rows
    assert not any(launch(d, rows, 32, 102400).masked_pair_tiles for d, rows in ((128, 16), (256, 4), (128, 8)))


def test_column_meta_only_where_it_was_measured_faster():
    """`default_launch` loads the pair loops' (scale, zero) per column (`column_meta_pairs`) in 4-row programs for 2-bit
    tokens with one (scale, zero) each (head_dim 64, 128's wide pairs) on every grid but the medium one, and for
    KIVI-2's channel-key pairs on the medium and large grids (results/bench/bench_kernel_column_meta_h200.md); not
    for 8- or 16-row pair programs (0.99-1.04x their time, results/bench/bench_kernel_column_meta_rows_h200.md) and
    not without pairs."""
    kivi2 = QuantSpec(bits=2, group=32, axis="channel")
    for head_dim in (64, 128):
        assert default_launch(head_dim, INT2[head_dim], INT2[head_dim], 4, 256, 132, 102400).column_meta  # large
        assert not default_launch(head_dim, INT2[head_dim], INT2[head_dim], 4, 64, 132, 32768).column_meta
    for units, history in [(8, 8192), (8, 102400), (16, 32768)]:                                      # tiny, small
        assert default_launch(64, INT2[64], INT2[64], 3, units, 132, history).column_meta
        assert not default_launch(64, kivi2, INT2[64], 3, units, 132, history).column_meta
    for units, history in [(24, 32768), (64, 32768), (256, 102400)]:
        assert default_launch(64, kivi2, INT2[64], 4, units, 132, history).column_meta
    assert not default_launch(64, INT2[64], INT2[64], 8, 256, 132, 102400).column_meta               # 8 rows
    assert not default_launch(64, INT2[64], INT2[64], 16, 256, 132, 102400).column_meta              # 16 rows
    assert not default_launch(256, INT2[256], INT2[256], 4, 256, 132, 102400).column_meta            # no pairs
    assert not default_launch(64, INT2[64], INT2[64], 4, 256, 132, 0, 4096).column_meta              # no history


def test_row_blocks_of_a_split_are_neighbours_in_launch_order():
    """run_split_k launches stage 1 on (row blocks, splits, B * H_kv) (common.py's `_program_ids`): programs start
    x-fastest, so the row blocks that read one split's history tiles run together and all but the first find them
    in L2 (results/bench/sweep_rows8_wide_head.md: 8-row programs 9-15 % faster at head_dim 128 and 256, batch 8-32 /
    32k-100k)."""
    from kernels.decode.launch import run_split_k
    grids = []

    def stage1(grid, *_):
        grids.append(grid)
    q = torch.zeros(2, 32, 1, 128)
    run_split_k(q, 2, 1000, 40, DecodeConfig(), on_gpu=False, num_splits=3, row_block=8, stage1=stage1,
                single_launch=True)     # stage 1 alone (no stage-2 launch on these CPU tensors on a GPU host)
    assert grids == [(2, 3 + 1, 4)]         # 16 rows in two blocks; 3 history splits + 1 fp split; 2 x 2 units


def test_token_pairs_only_for_contiguous_16_byte_tokens_or_wide_pairs():
    """Pairs need both caches at 16 bytes per token (32 with wide_pairs in 4-row programs), stored back to back, and
    >= 16 pair rows per warp."""
    cfg = DecodeConfig(block_n=128, num_warps=4, warp_tiles=True)
    codes64 = torch.zeros(1, 2, 10, 16, dtype=torch.uint8)
    codes128 = torch.zeros(1, 2, 10, 32, dtype=torch.uint8)
    assert uses_token_pairs(cfg, codes64, codes64, INT2[64], INT2[64], 64)
    assert not uses_token_pairs(cfg, codes128, codes128, INT2[128], INT2[128], 128)
    assert not uses_token_pairs(replace(cfg, wide_pairs=True), codes128, codes128, INT2[128], INT2[128], 128)  # 8 rows
    assert uses_token_pairs(replace(cfg, wide_pairs=True, warp_rows=4), codes128, codes128, INT2[128], INT2[128], 128)
    assert not uses_token_pairs(cfg, codes128[..., :16], codes64, INT2[64], INT2[64], 64)   # strided rows
    assert not uses_token_pairs(replace(cfg, block_n=64), codes64, codes64, INT2[64], INT2[64], 64)
    assert not uses_token_pairs(replace(cfg, token_pairs=False), codes64, codes64, INT2[64], INT2[64], 64)


@pytest.mark.parametrize("head_dim, group, grid", [(256, 4, "large"), (256, 4, "small"), (256, 4, "tiny"),
                                                 (128, 16, "large"), (128, 12, "large"), (64, 3, "large")])
def test_per_shape_gpu_defaults_match_reference(head_dim, group, grid):
    """The GPU default tile chosen for each attention shape (head_dim 256, more than 8 query rows per KV head)
    computes the reference's result under the interpreter (it may differ from the head_dim-128 tile)."""
    cfg = default_config(head_dim, on_gpu=True, grid=grid, rows=group)
    args, kw = make_inputs(2, 2 * group, 2, 1, head_dim, 300, 20, INT2[head_dim], INT2[head_dim], seed=5)
    out = decode_attention(*args, **kw, config=replace(cfg, num_stages=1, maxnreg=None))
    assert (out - decode_attention_reference(*args, **kw)).abs().max().item() < TOL


def test_short_histories_split_into_single_tiles_on_small_grids():
    """Batch 1-2 (small grid): a 1k history splits into one tile per program (results/bench/sweep_decode_short.md);
    at 128k the split target sets the count as before. Those one-tile splits merge to the reference's result."""
    from kernels.decode.launch import _num_splits
    cfg = default_config(128, on_gpu=True, grid="small")
    assert cfg.min_split_tiles == 1
    assert _num_splits(8, 704, cfg.block_n, 4 * 132, cfg.min_split_tiles) == 6          # 704 tokens, 6 tiles
    long = _num_splits(8, 131072, cfg.block_n, 4 * 132, cfg.min_split_tiles)
    assert long == _num_splits(8, 131072, cfg.block_n, 4 * 132, 4) == 66
    args, kw = make_inputs(1, 8, 2, 1, 128, 700, 20, INT2[128], INT2[128], seed=7)
    out = decode_attention(*args, **kw, config=replace(cfg, num_stages=1, maxnreg=None), num_splits=6)
    assert (out - decode_attention_reference(*args, **kw)).abs().max().item() < TOL


def test_grid_size_picks_the_launch_family():
    """On 132 SMs (8 KV heads): batch 1 up to ~100k of history is the tiny grid, longer or batch 2 the small one,
    batch 3-16 medium, 32 large; a launch with no packed history (BF16 on the kernel path) never takes the two-warp
    families (results/bench/sweep_decode_tiny.md)."""
    from kernels.decode.launch import grid_size
    assert grid_size(8, 132, 102080) == "tiny" and grid_size(8, 132, 114368) == "small"
    assert grid_size(4, 132, 200000) == "tiny"                              # fewer units: longer histories
    assert grid_size(16, 132, 1000) == "small" and grid_size(8, 132, 0) == "small"
    assert grid_size(24, 132, 8000) == "medium" and grid_size(128, 132, 100000) == "medium"
    assert grid_size(64, 132, 0) == "large" and grid_size(256, 132, 100000) == "large"
    # more than 8 rows: medium up to 66 units and 20k tokens per SM (batch 3 / 100k, batch 8 / 32k), not to batch 16
    assert grid_size(24, 132, 102080, rows=16) == "medium" and grid_size(32, 132, 102080, rows=16) == "large"
    assert grid_size(64, 132, 32448, rows=12) == "medium" and grid_size(96, 132, 8000, rows=16) == "large"
    assert grid_size(96, 132, 32448, rows=8) == "medium"
    with pytest.raises(ValueError, match="grid must be one of"):
        default_config(128, on_gpu=True, grid="huge")


def test_wide_rows_at_2_bits_take_medium_within_its_token_bound():
    """More than 8 query rows over 2-bit per-token K and V at head_dim <= 128 take the two-warp "medium" family up to
    20k packed tokens per SM at any batch (batch 32: 1k and 8k, not 32k); 8 rows, 4-bit K and V, head_dim 256 and a
    launch without packed history keep `grid_size`'s family (results/bench/sweep_short_large_h200.md)."""
    from kernels.decode.launch import default_launch, launch_grid
    int4 = QuantSpec(bits=4, group=128)
    assert launch_grid(128, INT2[128], INT2[128], 16, 256, 132, 7872) == "medium"
    assert launch_grid(64, INT2[64], INT2[64], 12, 256, 132, 704) == "medium"
    assert launch_grid(128, INT2[128], INT2[128], 16, 256, 132, 32448) == "large"         # past the token bound
    assert launch_grid(128, INT2[128], INT2[128], 8, 256, 132, 7872) == "large"           # 8 rows
    assert launch_grid(128, int4, int4, 16, 256, 132, 7872) == "large"                     # 4-bit
    assert launch_grid(256, INT2[256], INT2[256], 16, 256, 132, 7872) == "large"          # head_dim 256
    assert launch_grid(128, INT2[128], INT2[128], 16, 256, 132, 0) == "large"             # no packed history
    assert launch_grid(128, INT2[128], INT2[128], 16, 8, 132, 7872) == "tiny"             # other families as before
    cfg = default_launch(128, INT2[128], INT2[128], 16, 256, 132, 7872)
    assert (cfg.block_n, cfg.num_warps) == (128, 2)


def test_short_histories_on_the_large_grid_take_two_warp_128_token_programs():
    """Up to 8 query rows over at most 4,096 packed tokens of 2-bit per-token K and V at head_dim <= 128, with as many
    units as SMs or more: the large grid's launch with 128-token tiles in two warps, its split density and register
    cap kept; not at 8k, not at head_dim 256, not for 4-bit or channel keys, not below the large grid
    (results/bench/sweep_short_rows8_h200.md)."""
    from kernels.decode.launch import default_launch
    kivi = QuantSpec(bits=2, group=32, axis="channel")
    large = default_config(128, on_gpu=True, grid="large")

    def tile(head_dim=128, rows=4, units=256, tokens=3776, k=None, v=None):
        cfg = default_launch(head_dim, k or INT2[head_dim], v or INT2[head_dim], rows, units, 132, tokens)
        return cfg.block_n, cfg.num_warps
    assert tile() == (128, 2) and tile(head_dim=64, rows=8, tokens=704) == (128, 2) and tile(tokens=4096) == (128, 2)
    cfg = default_launch(128, INT2[128], INT2[128], 4, 256, 132, 1728)       # 704 tokens: `short_history_one_split`
    assert (cfg.programs_per_sm, cfg.maxnreg, cfg.num_stages) == (large.programs_per_sm, large.maxnreg, 3)
    assert tile(tokens=7872) == (256, 4) and tile(head_dim=256) != (128, 2) and tile(tokens=0) == (256, 4)
    assert tile(k=QuantSpec(bits=4, group=128), v=QuantSpec(bits=4, group=128)) != (128, 2)
    assert tile(k=kivi) != (128, 2)
    assert tile(units=128) == (128, 2) and default_launch(128, INT2[128], INT2[128], 4, 128, 132, 3776).programs_per_sm \
        == 16                                                                       # batch 16: the medium family's own


def test_short_histories_of_many_units_take_one_split_per_unit(monkeypatch):
    """`short_history_one_split`: 2-bit per-token K and V of as many units as SMs or more over at most 1,024 packed
    tokens plan one history split and one fp split per unit (programs_per_sm=2: `_split_target`'s large-batch bound),
    at every head_dim and group; not at 2k, not below the SMs, not for 4-bit or channel keys
    (results/bench/bench_kernel_short_splits_h200.md)."""
    from kernels.decode import launch
    monkeypatch.setattr(launch, "_sm_count", lambda index: 132)
    kivi = QuantSpec(bits=2, group=32, axis="channel")
    for head_dim, rows, units in [(64, 1, 192), (64, 16, 256), (128, 12, 256), (256, 8, 256), (256, 16, 192)]:
        cfg = default_launch(head_dim, INT2[head_dim], INT2[head_dim], rows, units, 132, 704)
        assert cfg.programs_per_sm == 2, (head_dim, rows, units)
        target = launch._split_target(cfg, units, 704 + 320, torch.device("cpu"))
        assert [launch._num_splits(units, tokens, block, target, cfg.min_split_tiles, cfg.tile_merge_ratio)
                for tokens, block in ((704, cfg.block_n), (320, cfg.block_f))] == [1, 1]
        before = replace(cfg, programs_per_sm=8)
        assert launch._num_splits(units, 704, cfg.block_n, launch._split_target(before, units, 1024, torch.device(
            "cpu")), cfg.min_split_tiles, cfg.tile_merge_ratio) > 1 or head_dim == 256
    assert default_launch(128, INT2[128], INT2[128], 4, 256, 132, 1728).programs_per_sm != 2      # 2k
    assert default_launch(128, INT2[128], INT2[128], 4, 128, 132, 704).programs_per_sm != 2       # batch 16
    int4 = QuantSpec(bits=4, group=128)
    assert default_launch(128, int4, int4, 4, 256, 132, 704).programs_per_sm != 2
    assert default_launch(64, kivi, INT2[64], 4, 256, 132, 704).programs_per_sm != 2


def test_short_histories_of_few_units_at_head_dim_128_take_64_token_tiles():
    """`short_history_narrow_tiles`: head_dim 128's 2-bit per-token K and V of at most one unit per two SMs (batch 1-8)
    over at most 1,024 packed tokens read 64-token history tiles, the rest of the launch as at 2k; not at head_dim 64
    or 256, not at 2k, not from batch 9 (results/bench/bench_kernel_short_splits_h200.md)."""
    from kernels.decode.launch import short_history_narrow_tiles
    for rows, units in [(1, 8), (4, 24), (8, 64), (16, 8), (12, 24)]:
        cfg = default_launch(128, INT2[128], INT2[128], rows, units, 132, 704)
        assert cfg.block_n == 64, (rows, units)
        before = default_launch(128, INT2[128], INT2[128], rows, units, 132, 1728)
        assert replace(cfg, block_n=before.block_n) == short_history_narrow_tiles(before, 128, units, 132, 1728,
                                                                                 INT2[128], INT2[128])
    for rows, units in [(4, 8), (16, 8), (8, 24)]:                     # 32-token warp sub-tiles match the reference
        cfg = default_launch(128, INT2[128], INT2[128], rows, units, 132, 704)
        args, kw = make_inputs(2, 2 * rows, 2, 1, 128, 301, 21, INT2[128], INT2[128], seed=rows)
        out = decode_attention(*args, **kw, num_splits=3, config=replace(cfg, num_stages=1, maxnreg=None))
        assert (out - decode_attention_reference(*args, **kw)).abs().max().item() < TOL
    assert default_launch(128, INT2[128], INT2[128], 4, 8, 132, 1728).block_n == 128               # 2k
    assert default_launch(128, INT2[128], INT2[128], 4, 72, 132, 704).block_n != 64                # batch 9
    for head_dim in (64, 256):
        assert default_launch(head_dim, INT2[head_dim], INT2[head_dim], 4, 8, 132, 704).block_n != 64


def test_head_dim_256_short_histories_of_batch_1_take_one_tile_splits():
    """`wide_head_short_one_tile_splits`: head_dim 256's tiny grid (batch 1) with up to 8 rows over at most 1,024
    packed 2-bit per-token tokens splits at one tile (two otherwise); not at 2k, not with 12-16 rows, not at head_dim
    128, not for 4-bit (results/bench/bench_kernel_wide_head_launches_h200.md). Its launches match the reference."""
    two_groups, int4 = QuantSpec(bits=2, group=128), QuantSpec(bits=4, group=128)

    def split_tiles(rows=4, tokens=704, head_dim=256, spec=two_groups):
        return default_launch(head_dim, spec, spec, rows, 8, 132, tokens).min_split_tiles
    assert split_tiles() == 1 and split_tiles(rows=1) == 1 and split_tiles(rows=8, tokens=1024) == 1
    assert split_tiles(tokens=1728) == 2 and split_tiles(rows=12) == 2 and split_tiles(spec=int4) == 2
    assert split_tiles(head_dim=128, spec=INT2[128]) == default_launch(128, INT2[128], INT2[128], 4, 8, 132,
                                                                        1728).min_split_tiles
    for spec in (two_groups, INT2[256]):
        cfg = default_launch(256, spec, spec, 4, 8, 132, 704)
        args, kw = make_inputs(1, 8, 2, 1, 256, 300, 21, spec, spec, seed=spec.group)
        out = decode_attention(*args, **kw, config=replace(cfg, num_stages=1))
        assert (out - decode_attention_reference(*args, **kw)).abs().max().item() < TOL


def test_head_dim_256_with_12_to_16_rows_on_the_medium_grid_takes_two_warps():
    """`wide_head_wide_rows_two_warps`: head_dim 256 on the medium grid (batch 3-8 at 8 KV heads) with more than 8
    rows runs two-warp programs (64 tokens per warp); up to 8 rows, the large grid, head_dim 128 and 4-bit keep their
    warps (results/bench/bench_kernel_wide_head_launches_h200.md). Its launch matches the reference."""
    two_groups, int4 = QuantSpec(bits=2, group=128), QuantSpec(bits=4, group=128)

    def warps(rows=16, units=24, tokens=7872, head_dim=256, spec=two_groups):
        return default_launch(head_dim, spec, spec, rows, units, 132, tokens).num_warps
    assert warps() == 2 and warps(rows=12, units=64, tokens=704) == 2 and warps(tokens=102080) == 2
    assert warps(rows=8) == 4 and warps(units=128) == 4 and warps(spec=int4) == 4
    assert warps(head_dim=128, spec=INT2[128]) == 2            # head_dim 128's medium launch: two warps already
    cfg = default_launch(256, two_groups, two_groups, 16, 24, 132, 704)
    assert (cfg.num_warps, cfg.block_n) == (2, 128)
    args, kw = make_inputs(2, 32, 2, 1, 256, 300, 21, two_groups, two_groups, seed=5)
    out = decode_attention(*args, **kw, num_splits=2, config=replace(cfg, num_stages=1))
    assert (out - decode_attention_reference(*args, **kw)).abs().max().item() < TOL


def test_short_head_dim_64_histories_with_8_to_12_rows_take_4_row_programs():
    """`short_history_four_rows`: head_dim 64, 5-12 query rows per KV head, at most 1,024 packed 2-bit per-token
    tokens and at most one unit per two SMs (batch 1-8 at 8 KV heads): 4-row programs over token pairs; not with 16
    rows, not at 2k, not at batch 32, not at head_dim 128, not for 4-bit or KIVI-2's per-channel keys, not on a launch
    without token pairs (results/bench/bench_kernel_short_four_rows_h200.md). Its launch matches the reference."""
    kivi2, int4 = QuantSpec(bits=2, group=32, axis="channel"), QuantSpec(bits=4, group=64)

    def rows_per_program(rows=12, units=8, tokens=704, head_dim=64, k=INT2[64], v=INT2[64]):
        return default_launch(head_dim, k, v, rows, units, 132, tokens).warp_rows
    for rows, units, tokens in ((8, 8, 704), (12, 8, 704), (8, 24, 704), (12, 64, 1024), (6, 8, 704)):
        assert rows_per_program(rows, units, tokens) == PAIR_TILE_ROWS
    assert rows_per_program(rows=16) != PAIR_TILE_ROWS and rows_per_program(tokens=1728) != PAIR_TILE_ROWS
    assert rows_per_program(units=256) != PAIR_TILE_ROWS and rows_per_program(units=67) != PAIR_TILE_ROWS
    assert rows_per_program(head_dim=128, k=INT2[128], v=INT2[128]) != PAIR_TILE_ROWS
    assert rows_per_program(k=int4, v=int4) != PAIR_TILE_ROWS and rows_per_program(k=kivi2) != PAIR_TILE_ROWS
    from kernels.decode.launch import short_history_four_rows
    no_pairs = DecodeConfig(warp_tiles=True, token_pairs=False, warp_rows=WARP_TILE_ROWS)
    assert short_history_four_rows(no_pairs, 64, 12, 8, 132, 704, INT2[64], INT2[64]) == no_pairs
    cfg = default_launch(64, INT2[64], INT2[64], 12, 8, 132, 704)
    args, kw = make_inputs(1, 24, 2, 1, 64, 300, 21, INT2[64], INT2[64], seed=12)
    assert uses_token_pairs(cfg, args[1], args[4], INT2[64], INT2[64], 64)
    out = decode_attention(*args, **kw, config=replace(cfg, num_stages=1))
    assert (out - decode_attention_reference(*args, **kw)).abs().max().item() < TOL


def test_short_histories_split_wide_row_groups_into_8_row_programs():
    """More than 8 query rows, 2-bit per-token K and V of whole fields, fewer units than SMs and at most 4,096 packed
    tokens: 8-row programs; not at 8k, not with as many units as SMs (at head_dim 256 not from one unit per 4 SMs on),
    not for 8 rows, 4-bit, channel keys or groups inside a field, nor over a launch that names its rows
    (results/bench/sweep_short_rows.md, sweep_short_rows_4k.md)."""
    from kernels.decode.launch import eight_row_programs
    int2, int4, kivi = QuantSpec(bits=2, group=128), QuantSpec(bits=4, group=32), QuantSpec(bits=2, group=32,
                                                                                              axis="channel")
    cfg = default_config(128, on_gpu=True, grid="small", rows=16)

    def rows_of(rows=16, units=8, tokens=704, k=int2, v=int2, base=cfg):
        return eight_row_programs(base, 128, rows, units, 132, tokens, k, v).warp_rows
    assert rows_of() == 8 and rows_of(rows=12, units=64, tokens=3776) == 8 and rows_of(tokens=4096) == 8
    assert rows_of(tokens=7872) is None and rows_of(tokens=0) is None and rows_of(units=256) is None
    assert rows_of(rows=8) is None and rows_of(k=int4, v=int4) is None and rows_of(k=kivi) is None
    assert rows_of(k=QuantSpec(bits=2, group=16), v=QuantSpec(bits=2, group=16)) is None   # groups inside a field
    assert rows_of(base=replace(cfg, warp_rows=16)) == 16

    def rows_at_256(units, tokens=704):
        spec = QuantSpec(bits=2, group=256)
        base = default_config(256, on_gpu=True, grid="medium", rows=16)
        return eight_row_programs(base, 256, 16, units, 132, tokens, spec, spec).warp_rows
    assert rows_at_256(8) == 8 and rows_at_256(32) == 8 and rows_at_256(33) is None and rows_at_256(64) is None
    assert rows_at_256(8, tokens=7872) is None


def test_small_grid_short_histories_of_many_rows_take_two_uncapped_warps():
    """`small_grid_short_wide_rows_two_warps`: on the small grid (batch 2 at 8 KV heads) 2-bit per-token K and V at
    head_dim 128 with 12-16 query rows over at most 1,024 packed tokens launch two warps with no register cap
    (results/bench/bench_formats_small_grid_rows16_h200.md); not at 8k, not with 8 rows, not at head_dim 64, not
    for 4-bit K and V. The launch matches the reference."""
    int2, int4 = QuantSpec(bits=2, group=128), QuantSpec(bits=4, group=32)

    def launch(rows=16, units=16, tokens=864, head_dim=128, spec=int2):
        return default_launch(head_dim, spec, spec, rows, units, 132, tokens)
    assert (launch().num_warps, launch().maxnreg) == (2, None) and launch(rows=12).num_warps == 2
    assert (launch(tokens=8032).num_warps, launch(tokens=8032).maxnreg) == (4, 128)
    assert launch(rows=8).num_warps == 4 and launch(spec=int4).maxnreg == 128
    assert launch(head_dim=64, spec=QuantSpec(bits=2, group=64)).num_warps == 4
    cfg = replace(launch(), num_stages=1)
    args, kw = make_inputs(2, 32, 2, 1, 128, 200, 21, int2, int2, seed=7)
    out = decode_attention(*args, **kw, config=cfg)
    assert (out - decode_attention_reference(*args, **kw)).abs().max().item() < TOL


def test_two_groups_per_row_at_head_dim_256_take_8_row_programs_beyond_short_histories():
    """Head_dim 256 with two (scale, zero) groups of 128 per row (OSCAR's and naive INT2's layout there): 8-row
    programs beyond 4,096 packed tokens and with fewer units than SMs (results/bench/sweep_rows8_wide_head.md), never
    without a packed history (the BF16 rows of the fp segment), nor with 8 rows, nor at head_dim 128 with two groups
    of 64 (not measured)."""
    from kernels.decode.launch import eight_row_programs
    two_groups = QuantSpec(bits=2, group=128)
    base = default_config(256, on_gpu=True, grid="large", rows=16)

    def rows_of(units, tokens, rows=16, head_dim=256, spec=two_groups):
        return eight_row_programs(base, head_dim, rows, units, 132, tokens, spec, spec).warp_rows
    assert rows_of(8, 102080) == 8 and rows_of(256, 102080) == 8 and rows_of(64, 704) == 8
    assert rows_of(256, 7872) == 8 and rows_of(256, 704) is None      # short histories: only below one unit per SM
    assert rows_of(256, 0) is None and rows_of(256, 102080, rows=8) is None
    assert rows_of(256, 102080, head_dim=128, spec=QuantSpec(bits=2, group=64)) is None


def test_default_launch_is_the_family_its_launch_and_the_short_history_rule():
    """default_launch (what decode_attention takes on a GPU with no config, and what the benchmarks record):
    batch 1 with 16 rows at 1k takes the tiny grid's launch with 8-row programs (and 64-token tiles:
    `short_history_narrow_tiles`), at 8k the 16-row one."""
    from kernels.decode.launch import default_launch, grid_size, launch_config
    spec = INT2[128]
    short, longer = (default_launch(128, spec, spec, 16, 8, 132, tokens) for tokens in (704, 7872))
    assert grid_size(8, 132, 704, 16) == "tiny" == grid_size(8, 132, 7872, 16)
    assert short == replace(launch_config(128, True, "tiny", spec, spec, 16), warp_rows=8, block_n=64)
    assert longer == launch_config(128, True, "tiny", spec, spec, 16) and longer.warp_rows is None


def test_tiny_and_medium_grids_take_two_warp_programs():
    """Two-warp programs at batch 1 (no register cap, the small-grid tiles) and batch 3-16 (128-token tiles, 16 per
    SM; more than 8 rows: no register cap, 8 per SM); head_dim 256 and per-channel layouts keep their own. Two
    64-token warp sub-tiles (head_dim 128) and two 64-token pair sub-tiles (head_dim 64) merge to the reference's
    result, also with 12-16 rows per program."""
    tiny = default_config(128, on_gpu=True, grid="tiny")
    assert (tiny.num_warps, tiny.maxnreg, tiny.block_n, tiny.tile_merge_ratio) == (2, None, 128, 16)
    assert default_config(64, on_gpu=True, grid="tiny", rows=16) == tiny
    medium = default_config(128, on_gpu=True, grid="medium")
    assert (medium.num_warps, medium.block_n, medium.programs_per_sm, medium.maxnreg) == (2, 128, 16, 168)
    assert default_config(128, on_gpu=True, grid="small").num_warps == 4
    rows16 = default_config(128, on_gpu=True, grid="medium", rows=16)       # sweep_rows16_medium.md
    assert (rows16.num_warps, rows16.block_n, rows16.programs_per_sm, rows16.maxnreg) == (2, 128, 8, None)
    assert default_config(128, on_gpu=True, grid="large", rows=16).num_warps == 4
    for grid in ("tiny", "medium"):
        assert default_config(256, on_gpu=True, grid=grid).num_warps == 4
        assert default_config(128, on_gpu=True, grid=grid, per_token=False).num_warps == 4
    for cfg, shapes in ((tiny, ((128, 4), (64, 3))), (medium, ((128, 4), (64, 3))), (rows16, ((128, 16), (64, 12)))):
        for head_dim, group in shapes:
            args, kw = make_inputs(1, 2 * group, 2, 1, head_dim, 700, 20, INT2[head_dim], INT2[head_dim], seed=9)
            out = decode_attention(*args, **kw, config=replace(cfg, num_stages=1, maxnreg=None))
            assert (out - decode_attention_reference(*args, **kw)).abs().max().item() < TOL


def test_tiny_grid_splits_pair_rows_deeper():
    """At batch 1, 2-bit K and V at head_dim 64 (pair rows) with up to 8 rows launch TINY_INT2's 6 programs per SM
    (results/bench/sweep_decode_occupancy.md) under its 168-register cap; 16 rows, 4-bit values and other grids keep
    4."""
    int2, int4 = INT2[64], INT4[64]
    assert launch_config(64, True, "tiny", int2, int2, rows=3).programs_per_sm == TINY_INT2["programs_per_sm"] == 6
    assert launch_config(64, True, "tiny", int2, int2, rows=3).maxnreg == TINY_INT2["maxnreg"] == 168  # 6 fit per SM
    assert launch_config(64, True, "tiny", int2, int2, rows=16).programs_per_sm == 4
    assert launch_config(64, True, "tiny", int2, int4, rows=3).programs_per_sm == 4
    assert launch_config(64, True, "small", int2, int2, rows=3).programs_per_sm == 4
    assert launch_config(64, False, "large", int2, int2) == default_config(64, on_gpu=False)


def test_tiny_grid_caps_int2_registers_at_head_dim_128():
    """At batch 1, 2-bit K and V at head_dim 128 with up to 8 rows launch 6 two-warp programs per SM under a
    168-register cap (TINY_INT2, results/bench/sweep_tiny_int2_words.md); 16 rows, 4-bit codes and the other
    grids keep their launch (head_dim 64: the pair rows' own, above), and the capped launch merges to the
    reference's result."""
    int2 = INT2[128]
    capped = launch_config(128, True, "tiny", int2, int2, rows=4)
    assert (capped.maxnreg, capped.programs_per_sm) == (TINY_INT2["maxnreg"], TINY_INT2["programs_per_sm"])
    assert replace(capped, maxnreg=None, programs_per_sm=4) == default_config(128, on_gpu=True, grid="tiny")
    for other in (launch_config(128, True, "tiny", int2, int2, rows=16), launch_config(128, True, "tiny", INT4[128],
                  INT4[128], rows=4), launch_config(128, True, "small", int2, int2, rows=4)):
        assert other.maxnreg != 168 or other.programs_per_sm != 6
    args, kw = make_inputs(1, 4, 1, 1, 128, 700, 9, int2, int2, seed=4)
    out = decode_attention(*args, **kw, config=replace(capped, block_n=64, num_stages=1))
    assert (out - decode_attention_reference(*args, **kw)).abs().max().item() < TOL


def test_int4_at_head_dim_128_takes_32_token_warp_tiles_on_medium_and_large_grids():
    """4-bit K and V at head_dim 128 (64 bytes per token) halve the medium and large tiles to 32 tokens per warp
    (results/bench/bench_formats_int4_tiles.md); INT2, head_dim 64 / 256, mixed widths and the tiny and small grids
    keep theirs. Both halved tiles merge to the reference's result."""
    int4 = INT4[128]
    for grid, block_n in (("medium", 64), ("large", 128), ("tiny", 128), ("small", 128)):
        assert launch_config(128, True, grid, int4, int4).block_n == block_n
    for grid in ("medium", "large"):
        halved = launch_config(128, True, grid, int4, int4)
        assert halved == replace(default_config(128, True, grid), block_n=halved.block_n)
        assert halved.block_n // halved.num_warps == 32
        assert launch_config(128, True, grid, INT2[128], INT2[128]) == default_config(128, True, grid)
        assert launch_config(128, True, grid, int4, INT2[128]) == default_config(128, True, grid)
        for head_dim in (64, 256):
            assert launch_config(head_dim, True, grid, INT4[head_dim], INT4[head_dim]) == \
                default_config(head_dim, True, grid)
        args, kw = make_inputs(2, 8, 2, 1, 128, 300, 20, int4, int4, seed=11)
        out = decode_attention(*args, **kw, config=replace(halved, num_stages=1, maxnreg=None))
        assert (out - decode_attention_reference(*args, **kw)).abs().max().item() < TOL


def test_mid_length_histories_balance_split_count_against_the_merge():
    """tile_merge_ratio=16 on small grids (results/bench/sweep_decode_splits_short.md): an 8k history (62 tiles)
    splits 32 ways, not 62 (at most sqrt(16 x tiles)); 1k and 128k split as before; 16 rows at head_dim 64 take
    64-token tiles. The capped split count merges to the reference's result."""
    from kernels.decode.launch import _num_splits
    cfg = default_config(128, on_gpu=True, grid="small")
    assert cfg.tile_merge_ratio == 16 and cfg.block_n == 128
    assert _num_splits(8, 7872, 128, 4 * 132, 1) == 62
    assert _num_splits(8, 7872, 128, 4 * 132, 1, cfg.tile_merge_ratio) == 32
    assert _num_splits(8, 704, 128, 4 * 132, 1, cfg.tile_merge_ratio) == 6
    assert _num_splits(8, 131072, 128, 4 * 132, 1, cfg.tile_merge_ratio) == 66
    assert default_config(64, on_gpu=True, grid="small", rows=16).block_n == 64
    assert default_config(64, on_gpu=True, grid="small", rows=8).block_n == 128
    assert default_config(128, on_gpu=True, grid="large").tile_merge_ratio == 0
    tiles = replace(cfg, block_n=16, num_stages=1, maxnreg=None)
    splits = _num_splits(1, 700, tiles.block_n, 10**6, 1, cfg.tile_merge_ratio)   # 44 tiles of 16 tokens
    assert splits == 27                                                             # uneven: 2 tiles, some empty
    args, kw = make_inputs(1, 8, 2, 1, 128, 700, 20, INT2[128], INT2[128], seed=8)
    out = decode_attention(*args, **kw, config=tiles, num_splits=splits)
    assert (out - decode_attention_reference(*args, **kw)).abs().max().item() < TOL


def test_large_batches_keep_splits_under_the_token_bound(monkeypatch):
    """Where the halved target would leave one split per unit, no split holds more than LARGE_BATCH_SPLIT_TOKENS of a
    unit's context (results/bench/bench_kernel_large_batch_splits_h200.md): batch 110 x 8 KV heads at 100k splits 3
    ways, not 1; at 32k, with fewer units (two splits) or below the SMs, the plan is the one before."""
    from kernels.decode import launch
    monkeypatch.setattr(launch, "_sm_count", lambda index: 132)
    cfg, gpu = default_config(64, on_gpu=True, grid="large"), torch.device("cuda", 0)

    def splits(units: int, tokens: int) -> int:
        target = launch._split_target(cfg, units, tokens, gpu)
        return launch._num_splits(units, tokens - 320, cfg.block_n, target, cfg.min_split_tiles)
    assert splits(880, 102400) == 3 and splits(880, 65536) == 2       # were 1
    assert splits(880, 32768) == 1 and splits(384, 102400) == 2       # unchanged
    assert launch._split_target(cfg, 64, 102400, gpu) == cfg.programs_per_sm * 132


def test_per_shape_defaults_pick_the_swept_tiles():
    """results/bench/sweep_decode_shapes.md: head_dim 256 takes warp tiles of 128 tokens, 16 rows drop the cap."""
    wide = default_config(256, on_gpu=True)
    assert wide.warp_tiles and wide.block_n == 128 and wide.num_warps == 4
    wide_tiny = default_config(256, on_gpu=True, grid="tiny")          # bench_kernel_grid_d256_splits.md
    assert (wide_tiny.min_split_tiles, wide_tiny.tile_merge_ratio) == (2, 16)
    assert wide_tiny == replace(wide, min_split_tiles=2, tile_merge_ratio=16)
    assert default_config(256, on_gpu=True, grid="small") == wide
    assert default_config(128, on_gpu=True, rows=16).maxnreg is None
    assert default_config(128, on_gpu=True, rows=8).maxnreg == 168
    assert not default_config(256, on_gpu=True, per_token=False).warp_tiles


ASM_CASES = {f"asm-int{bits}-d{d}-n1001": (2, 8, 2, 1, d, 1001, 13, spec[d], spec[d], None)
             for bits, spec in ((2, INT2), (4, INT4)) for d in (64, 128, 256)}


@pytest.mark.skipif(not torch.cuda.is_available() or interpreter_forced(),
                    reason="inline PTX runs compiled on a CUDA device only (TRITON_INTERPRET=0)")
@pytest.mark.parametrize("name", [*CASES, *ASM_CASES])
def test_asm_unpack_matches_reference_on_gpu(name):
    """The GPU default tiles with the inline-PTX unpack: every layout of CASES, INT2/INT4 at each head dim."""
    *shape, num_splits = {**CASES, **ASM_CASES}[name]
    args, kw = make_inputs(*shape)
    cfg = replace(default_config(shape[4], on_gpu=True, per_token=per_token_layouts(*shape[7:], shape[4])),
                  asm_unpack=True)
    out = decode_attention(*args, **kw, num_splits=num_splits, config=cfg)
    assert (out - decode_attention_reference(*args, **kw)).abs().max().item() < TOL


@pytest.mark.skipif(not torch.cuda.is_available() or interpreter_forced(),
                    reason="fp16 dot operands and the kept value offset run compiled on a CUDA device only")
@pytest.mark.parametrize("name", [*CASES, *ASM_CASES])
@pytest.mark.parametrize("warp_tiles", [False, True])
def test_gpu_tiles_match_reference(name, warp_tiles):
    """The GPU default tiles with and without warp tiles (other layouts fall back to the row-major path)."""
    *shape, num_splits = {**CASES, **ASM_CASES}[name]
    args, kw = make_inputs(*shape)
    cfg = replace(default_config(shape[4], on_gpu=True, per_token=per_token_layouts(*shape[7:], shape[4])),
                  warp_tiles=warp_tiles)
    out = decode_attention(*args, **kw, num_splits=num_splits, config=cfg)
    assert (out - decode_attention_reference(*args, **kw)).abs().max().item() < TOL


@pytest.mark.skipif(not torch.cuda.is_available() or interpreter_forced(),
                    reason="the default launch is chosen by GPU size and compiled on a CUDA device only")
@pytest.mark.parametrize("batch", [1, 5])  # 8 and 40 (sequence, KV head) units: small and large grid on an H100
@pytest.mark.parametrize("name", ["naive_int2", "int4", "kivi2", "kivi4", "oscar"])
def test_gpu_default_launch_matches_reference(name, batch):
    """decode_attention with no config (the seam's call) for each code-storing quantizer's specs at Qwen3-8B head
    counts: the large-grid tiles of one layout must not be launched for another (they ran out of shared memory)."""
    quantizer = build_quantizer(name)
    k_spec, v_spec = quantizer.key_spec, quantizer.value_spec
    args, kw = make_inputs(batch, 32, 8, 1, 128, 704, 30, k_spec, v_spec)  # KIVI keys: whole 32-token groups
    out = decode_attention(*args, **kw)
    assert (out - decode_attention_reference(*args, **kw)).abs().max().item() < TOL


@pytest.mark.skipif(not torch.cuda.is_available() or interpreter_forced(),
                    reason="the default launch is chosen by GPU size and compiled on a CUDA device only")
@pytest.mark.parametrize("batch", [1, 2, 5])
@pytest.mark.parametrize("head_dim, q_heads", [(64, 32), (64, 128), (128, 32), (128, 128), (256, 32)])
@pytest.mark.parametrize("name", ["kivi2", "kivi4"])
def test_gpu_default_launch_of_kivi_at_other_head_dims_matches_reference(name, head_dim, q_heads, batch):
    """KIVI's default launch at head_dim 64 (8 and 16 rows: the inline-PTX unpack of 4-bit keys in 8-row programs,
    the tiny grid's uncapped launch at batch 1), 128 with 4 and 16 rows (one 16-row program on the tiny grid), the
    small grid's launches at batch 2, capped or not (`channel_key_small`), and 256 (column chunks for 4-bit keys)
    over 4,800 packed tokens (past `short_history_row_major`'s bound) matches the reference."""
    quantizer = build_quantizer(name)
    args, kw = make_inputs(batch, q_heads, 8, 1, head_dim, 4800, 320, quantizer.key_spec, quantizer.value_spec)
    out = decode_attention(*args, **kw)
    assert (out - decode_attention_reference(*args, **kw)).abs().max().item() < TOL


@pytest.mark.skipif(not torch.cuda.is_available() or interpreter_forced(),
                    reason="the default launch is chosen by GPU size and compiled on a CUDA device only")
@pytest.mark.parametrize("name", ["kivi2", "kivi4"])
def test_gpu_default_launch_of_kivi_over_a_short_history_with_16_rows_matches_reference(name):
    """KIVI at head_dim 128 with 16 rows at batch 1 over 992 packed tokens: two 8-row programs
    (`short_history_eight_rows`) match the reference."""
    quantizer = build_quantizer(name)
    args, kw = make_inputs(1, 128, 8, 1, 128, 992, 128, quantizer.key_spec, quantizer.value_spec)
    out = decode_attention(*args, **kw)
    assert (out - decode_attention_reference(*args, **kw)).abs().max().item() < TOL


@pytest.mark.skipif(not torch.cuda.is_available() or interpreter_forced(),
                    reason="the default launch is chosen by GPU size and compiled on a CUDA device only")
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("batch", [1, 3])
def test_gpu_default_launch_of_16_rows_over_a_short_history_matches_reference(head_dim, batch):
    """GQA 16 over 1k tokens (`eight_row_programs`: two 8-row programs per KV head on the launch of its grid, with
    that grid's register cap) matches the reference."""
    args, kw = make_inputs(batch, 128, 8, 1, head_dim, 704, 320, INT2[head_dim], INT2[head_dim], seed=head_dim)
    out = decode_attention(*args, **kw)
    assert (out - decode_attention_reference(*args, **kw)).abs().max().item() < TOL


@pytest.mark.skipif(not torch.cuda.is_available() or interpreter_forced(),
                    reason="programmatic dependent launch exists on a CUDA device only")
@pytest.mark.parametrize("batch, n_hist", [(1, 900), (6, 4000)])
def test_stage2_as_dependent_launch_gives_the_same_output(batch, n_hist):
    """Stage 2 as a programmatic dependent launch (DecodeConfig.pdl, Hopper on: it waits for stage 1 by
    griddepcontrol) merges exactly what a plain launch merges, eagerly and replayed as a CUDA graph."""
    args, kw = make_inputs(batch, 32, 8, 1, 128, n_hist, 30, INT2[128], INT2[128])
    cfg = default_config(128, True)
    plain = decode_attention(*args, **kw, config=replace(cfg, pdl=False))
    assert uses_pdl(cfg, args[0].device, True) == (torch.cuda.get_device_capability()[0] >= 9)
    dependent = decode_attention(*args, **kw, config=cfg)                     # also compiles before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = decode_attention(*args, **kw, config=cfg)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(dependent, plain) and torch.equal(replayed, plain)


def test_stage2_dependent_launch_only_where_it_exists():
    """No programmatic dependent launch off the GPU or when the launch turns it off."""
    assert not uses_pdl(default_config(128, False), torch.device("cpu"), False)
    assert not uses_pdl(replace(default_config(128, True), pdl=False), torch.device("cuda", 0), True)


def _run_ptx(ptx: str, word: np.ndarray, source: str = "$2", outputs: tuple = ("$0", "$1")) -> np.ndarray:
    """Emulate `_field_ptx` on uint32 words (`source`) -> [N, 2 * len(outputs)] fp16 ($0 low, $0 high, $1 low, $1
    high), PTX ISA rules: prmt (default mode) byte i = byte (c >> 4i) & 7 of {b, a}; lop3 LUT 0xEA = (a & b) | c;
    and; shr (logical); sub.f16x2 per lane."""
    regs = {source: word}
    for line in ptx.splitlines():
        op, *args = line.rstrip(";").replace(",", " ").split()
        if op in ("{", "}", ".reg"):
            continue
        a = [regs[x] if x in regs else np.full_like(word, int(x, 0)) for x in args[1:]]
        if op == "mov.b32":
            out = a[0]
        elif op == "prmt.b32":
            sel = [(int(args[3], 0) >> (4 * i)) & 0xF for i in range(4)]
            assert all(s < 8 for s in sel)  # no sign replication
            src = a[1].astype(np.uint64) << np.uint64(32) | a[0]
            out = sum((src >> np.uint64(8 * s) & np.uint64(0xFF)) << np.uint64(8 * i) for i, s in enumerate(sel))
            out = out.astype(np.uint32)
        elif op == "lop3.b32" and int(args[4], 0) == 0xEA:
            out = (a[0] & a[1]) | a[2]
        elif op == "and.b32":
            out = a[0] & a[1]
        elif op == "shr.b32":
            out = a[0] >> a[1]
        elif op == "sub.f16x2":
            out = (a[0].view(np.float16) - a[1].view(np.float16)).view(np.uint32)
        else:
            raise AssertionError(f"unexpected PTX: {line}")
        regs[args[0]] = out
    return np.stack([regs[name] for name in outputs], axis=1).view(np.float16)


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("mode", [FIELD_EXACT, FIELD_TINY])
def test_field_ptx_matches_field(bits, mode):
    """Element k of each 4-byte block is byte k's field f as `_field` returns it: 2^(f*bits) * code, times 2^-24
    with FIELD_TINY (an fp16 subnormal), for every byte value at every position."""
    codes = (np.arange(256)[:, None] + 67 * np.arange(4)[None, :]) % 256           # [256, 4] bytes of each word
    words = (codes << (8 * np.arange(4))).sum(axis=1).astype(np.uint32)
    for f in range(8 // bits):
        field = (codes & (((1 << bits) - 1) << (f * bits))).astype(np.float64)
        want = field * 2.0 ** -24 if mode == FIELD_TINY else field
        assert np.array_equal(_run_ptx(_field_ptx(bits, f, mode), words), want.astype(np.float16))


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_half_field_ptx_matches_the_bytes_fields(bits):
    """`_half_field_ptx` on two 16-bit words (one register): lane j is field f of byte h (0: even, 1: odd) of word j
    as `_field` (FIELD_TINY) reads it from that byte, for every byte value in both lanes."""
    lo, hi = np.meshgrid(np.arange(256), np.arange(256), indexing="ij")
    words16 = np.stack([(lo * 256 + hi), (hi * 256 + lo) ^ 0x5A3C], axis=-1).reshape(-1, 2)   # [65536, 2]
    words = (words16[:, 0] | (words16[:, 1] << 16)).astype(np.uint32)
    for f in range(8 // bits):
        for h in range(2):
            field = (words16 >> (8 * h)) & 0xFF & (((1 << bits) - 1) << (f * bits))    # [N, 2] per lane
            got = _run_ptx(_half_field_ptx(bits, f, h), words, source="$1", outputs=("$0",))
            assert np.array_equal(got, (field * 2.0 ** -24).astype(np.float16))


def _replace(args, index, value):
    return args[:index] + (value,) + args[index + 1:]


@pytest.mark.parametrize("mutate, match", [
    (lambda a: _replace(a, 0, a[0][:, :3]), "multiple of H_kv"),
    (lambda a: _replace(a, 1, a[1][..., :8]), "k_codes must be"),
    (lambda a: _replace(a, 9, a[9].long()), "hist_len must be int32"),
    (lambda a: _replace(a, 0, a[0].expand(-1, -1, 40, -1)), "query rows"),
])
def test_bad_inputs_raise_before_launch(mutate, match):
    args, kw = make_inputs(1, 8, 2, 1, 128, 16, 4, INT2[128], INT2[128])
    with pytest.raises(ValueError, match=match):
        decode_attention(*mutate(args), **kw)


def test_warp_tiles_refuse_codes_at_odd_byte_strides():
    """Warp tiles read the codes as 16-bit words: codes whose token stride is odd fail in one sentence before the
    launch (the same tensor read through the row-major loop is fine)."""
    args, kw = make_inputs(1, 8, 2, 1, 128, 16, 4, INT2[128], INT2[128])
    codes = args[4]
    odd = torch.zeros(*codes.shape[:3], codes.shape[3] + 1, dtype=codes.dtype, device=codes.device)[..., :-1]
    odd.copy_(codes)
    args = _replace(args, 4, odd)
    with pytest.raises(ValueError, match="v_codes must start on an even byte with even strides"):
        decode_attention(*args, **kw, config=DecodeConfig(block_n=64, block_f=32, num_stages=1, warp_tiles=True))
    out = decode_attention(*args, **kw, config=DecodeConfig(block_n=64, block_f=32, num_stages=1))
    assert (out - decode_attention_reference(*args, **kw)).abs().max().item() < TOL


def test_unsupported_head_dim_raises():
    spec = QuantSpec(bits=2, group=96)
    args, kw = make_inputs(1, 2, 1, 1, 96, 8, 4, spec, spec)
    with pytest.raises(ValueError, match="head_dim must be one of"):
        decode_attention(*args, **kw)


def test_dispatch_modes(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert use_triton("cuda") and use_triton("cuda", "triton")
    assert not use_triton("cpu") and not use_triton("cuda", "reference")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        use_triton("cpu", "triton")
    with pytest.raises(ValueError, match="must be one of"):
        use_triton("cpu", "fast")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert use_triton("cpu") and use_triton("cpu", "triton")


@pytest.mark.parametrize("name", ["int2-g4-d128-n1000-splits3", "int4k-int2v-g4-d128-n300-tq16",
                                  "int4-g3-d64-n129-tq4-grouped-v"])
def test_single_launch_merge_matches_reference(name):
    """`DecodeConfig.single_launch`: the last stage-1 program of each row block merges the splits itself (several
    splits, several row blocks, T_q > 1): the reference's result, and its counters back at zero for the next call."""
    from kernels.decode.launch import _MERGE_COUNTERS
    *shape, num_splits = CASES[name]
    args, kw = make_inputs(*shape)
    ref = decode_attention_reference(*args, **kw)
    on_gpu = DEVICE == "cuda" and not interpreter_forced()       # on a GPU: its default tile, real memory ordering
    cfg = replace(default_config(shape[4], on_gpu=on_gpu), single_launch=True)
    for _ in range(2):                                            # the second call reuses the reset counters
        out = decode_attention(*args, **kw, config=cfg, num_splits=num_splits)
        assert (out - ref).abs().max().item() < TOL
    assert not _MERGE_COUNTERS[args[0].device].any()

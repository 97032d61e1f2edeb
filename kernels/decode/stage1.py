"""The stage-1 program: one split of one KV head's query rows, over the packed history or the fp segment."""
from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from kernels.decode.channel_keys import _history_warp_channel_keys, _history_warp_channel_pairs
from kernels.decode.common import _program_rows, _split_bounds
from kernels.decode.fp_segment import _fp_program
from kernels.decode.merge import _merge_if_last
from kernels.decode.packed import _history_split
from kernels.decode.pairs import _history_warp_pairs
from kernels.decode.warp_tiles import _history_warp_tiles


@triton.jit
def _decode_stage1_kernel(
    q_ptr, kc_ptr, ks_ptr, kz_ptr, vc_ptr, vs_ptr, vz_ptr, fk_ptr, fv_ptr,
    hist_len_ptr, fp_len_ptr, hist_start_ptr, fp_start_ptr, part_o_ptr, part_lse_ptr, counter_ptr, out_ptr,
    qk_scale, kv_heads, q_tokens, n_rows, n_hist_splits, n_fp_splits, stride_ob, stride_oh, stride_ot,
    stride_qb, stride_qh, stride_qt,
    stride_kcb, stride_kch, stride_kcn, stride_ksb, stride_ksh, stride_ksn,
    stride_vcb, stride_vch, stride_vcn, stride_vsb, stride_vsh, stride_vsn,
    stride_fb, stride_fh, stride_fn,
    GROUP: tl.constexpr, D: tl.constexpr, K_BITS: tl.constexpr, V_BITS: tl.constexpr,
    K_LAYOUT: tl.constexpr, V_LAYOUT: tl.constexpr, K_GROUP: tl.constexpr, V_GROUP: tl.constexpr,
    WARP_TILES: tl.constexpr, TOKEN_PAIRS: tl.constexpr, PAIR_WORDS: tl.constexpr, COLUMN_META: tl.constexpr,
    WARPS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_F: tl.constexpr, FP16: tl.constexpr,
    ASM_UNPACK: tl.constexpr, SINGLE_LAUNCH: tl.constexpr, PDL: tl.constexpr, HISTORY: tl.constexpr,
    MASKED_PAIRS: tl.constexpr = False,
):
    if PDL:                                              # stage 2's programs may be scheduled once all of ours run
        gdc_launch_dependents()
    split, b, h, rows, row_ok, q_rows, slot = _program_rows(kv_heads, q_tokens, n_rows, n_hist_splits + n_fp_splits,
                                                           stride_qb, stride_qh, stride_qt, GROUP, BLOCK_R)
    in_history = False                                   # without HISTORY (a call with fp splits only) the history
    if HISTORY:                                          # loops and their registers are not compiled
        in_history = split < n_hist_splits
    if in_history:
        _history_program(q_ptr, kc_ptr, ks_ptr, kz_ptr, vc_ptr, vs_ptr, vz_ptr, hist_len_ptr, hist_start_ptr,
                         part_o_ptr, part_lse_ptr, qk_scale, split, n_hist_splits, b, h, q_rows, row_ok, slot,
                         stride_kcb, stride_kch, stride_kcn, stride_ksb, stride_ksh, stride_ksn,
                         stride_vcb, stride_vch, stride_vcn, stride_vsb, stride_vsh, stride_vsn,
                         D, K_BITS, V_BITS, K_LAYOUT, V_LAYOUT, K_GROUP, V_GROUP, WARP_TILES, TOKEN_PAIRS,
                         PAIR_WORDS, COLUMN_META, WARPS, BLOCK_N, FP16, ASM_UNPACK, MASKED_PAIRS)
    else:
        _fp_program(q_ptr, q_rows, row_ok, rows, qk_scale, fk_ptr, fv_ptr, fp_len_ptr, fp_start_ptr, b, h,
                    split - n_hist_splits, n_fp_splits, q_tokens, stride_fb, stride_fh, stride_fn,
                    part_o_ptr, part_lse_ptr, slot, D, BLOCK_F, FP16)
    if SINGLE_LAUNCH:
        _merge_if_last(counter_ptr, part_o_ptr, part_lse_ptr, out_ptr, rows, row_ok, n_hist_splits + n_fp_splits,
                       n_rows, kv_heads, q_tokens, stride_ob, stride_oh, stride_ot, GROUP, D)


@triton.jit
def _history_program(q_ptr, kc_ptr, ks_ptr, kz_ptr, vc_ptr, vs_ptr, vz_ptr, hist_len_ptr, hist_start_ptr,
                     part_o_ptr, part_lse_ptr, qk_scale, split, n_hist_splits, b, h, q_rows, row_ok, slot,
                     stride_kcb, stride_kch, stride_kcn, stride_ksb, stride_ksh, stride_ksn,
                     stride_vcb, stride_vch, stride_vcn, stride_vsb, stride_vsh, stride_vsn,
                     D: tl.constexpr, K_BITS: tl.constexpr, V_BITS: tl.constexpr, K_LAYOUT: tl.constexpr,
                     V_LAYOUT: tl.constexpr, K_GROUP: tl.constexpr, V_GROUP: tl.constexpr, WARP_TILES: tl.constexpr,
                     TOKEN_PAIRS: tl.constexpr, PAIR_WORDS: tl.constexpr, COLUMN_META: tl.constexpr,
                     WARPS: tl.constexpr, BLOCK_N: tl.constexpr, FP16: tl.constexpr, ASM_UNPACK: tl.constexpr,
                     MASKED_PAIRS: tl.constexpr):
    """History split `split` of (sequence b, KV head h): the loop of its layout and launch (MASKED_PAIRS: token
    pairs in one masked loop)."""
    start, end = _split_bounds(tl.load(hist_start_ptr + b), tl.load(hist_len_ptr + b), split,
                               n_hist_splits, BLOCK_N)
    kc, vc = kc_ptr + b * stride_kcb + h * stride_kch, vc_ptr + b * stride_vcb + h * stride_vch
    k_meta, v_meta = b * stride_ksb + h * stride_ksh, b * stride_vsb + h * stride_vsh
    if WARP_TILES and K_LAYOUT == 2 and TOKEN_PAIRS:
        _history_warp_channel_pairs(q_ptr, q_rows, row_ok, qk_scale, kc, ks_ptr + k_meta, kz_ptr + k_meta,
                                    vc, vs_ptr + v_meta, vz_ptr + v_meta, start, end, stride_ksn, stride_vsn,
                                    part_o_ptr, part_lse_ptr, slot, D, K_BITS, V_BITS, K_GROUP, V_GROUP, BLOCK_N,
                                    WARPS, COLUMN_META, FP16, ASM_UNPACK)
    elif WARP_TILES and K_LAYOUT == 2:
        _history_warp_channel_keys(q_ptr, q_rows, row_ok, qk_scale, kc, ks_ptr + k_meta, kz_ptr + k_meta,
                                   vc, vs_ptr + v_meta, vz_ptr + v_meta, start, end, stride_kcn, stride_ksn,
                                   stride_vcn, stride_vsn, part_o_ptr, part_lse_ptr, slot, D, K_BITS, V_BITS,
                                   K_GROUP, V_GROUP, BLOCK_N, WARPS, FP16, ASM_UNPACK)
    elif TOKEN_PAIRS:
        _history_warp_pairs(q_ptr, q_rows, row_ok, qk_scale, kc, ks_ptr + k_meta, kz_ptr + k_meta,
                            vc, vs_ptr + v_meta, vz_ptr + v_meta, start, end, stride_ksn, stride_vsn,
                            part_o_ptr, part_lse_ptr, slot, D, K_BITS, V_BITS, BLOCK_N, WARPS, PAIR_WORDS,
                            COLUMN_META, FP16, ASM_UNPACK, MASKED_PAIRS)
    elif WARP_TILES:
        _history_warp_tiles(q_ptr, q_rows, row_ok, qk_scale, kc, ks_ptr + k_meta, kz_ptr + k_meta,
                            vc, vs_ptr + v_meta, vz_ptr + v_meta, start, end, stride_kcn, stride_ksn,
                            stride_vcn, stride_vsn, part_o_ptr, part_lse_ptr, slot, D, K_BITS, V_BITS,
                            K_GROUP, V_GROUP, BLOCK_N, WARPS, FP16, ASM_UNPACK)
    else:
        _history_split(q_ptr, q_rows, row_ok, qk_scale, kc, ks_ptr + k_meta, kz_ptr + k_meta,
                       vc, vs_ptr + v_meta, vz_ptr + v_meta, start, end, stride_kcn, stride_ksn,
                       stride_vcn, stride_vsn, part_o_ptr, part_lse_ptr, slot, D, K_BITS, V_BITS,
                       K_LAYOUT, V_LAYOUT, K_GROUP, V_GROUP, BLOCK_N, FP16, ASM_UNPACK)

"""Warp tiles for per-channel keys (KIVI: one (scale, zero) per channel for each group of K_GROUP tokens) beside
per-token values, with one key group per warp sub-tile (`DecodeConfig.channel_key_tiles`).

A group's channel scales multiply the query instead of the codes, so the codes stay FIELD_TINY MMA operands:
    q.k_n = sum_c q_c s_gc (c_nc - z_gc) = (q * s_g) . c_n - sum_c q_c s_gc z_gc        (g: token n's group)
Each warp's sub-tile is exactly one group (BLOCK_N / WARPS = K_GROUP tokens, tiles aligned to groups), so the
B operand of its score MMA is q_f * s_g,f [KB, R] and its bias one [R] vector; from head_dim 128 each tile's
channel (scale, zero) pairs are loaded one tile ahead, like the values' per-token ones. The values and the epilogue
are warp_tiles.py's.
"""
from __future__ import annotations

import triton
import triton.language as tl

from kernels.decode.common import FIELD_EXACT, FIELD_TINY, TINY_SCALE

# head_dims from which the key channel metadata is loaded a tile ahead: on the H100 that took KIVI-2 at 128 from 19 % to
# 35 % of copy (batch 8 / 32k; 23 -> 45 % at 32 / 100k); at 64 it lost (9 -> 7 %; results/bench/bench_formats_kivi.md)
KEY_META_AHEAD_MIN_D = tl.constexpr(128)
from kernels.decode.packed import _field, _query_fields
from kernels.decode.pairs import _block_diagonal, _pair_group_meta, _pair_value_step, _store_pair_streams
from kernels.decode.warp_tiles import _empty_streams, _group_meta, _store_warp_streams, _value_step, \
    _warp_softmax_step


@triton.jit
def _channel_meta(s_ptr, z_ptr, groups, group_ok, stride_n, KP: tl.constexpr, KB: tl.constexpr,
                  COPIES: tl.constexpr = 1):
    """The channel (scale, zero) of each warp's key group for every field, in their stored dtype: a flat tuple
    (s_0, z_0, s_1, z_1, ...) of [WARPS, COPIES * KB] tensors, the field's KB channels repeated COPIES times (2 for
    the pair rows of `_history_warp_channel_pairs`)."""
    metas = ()
    for f in tl.static_range(KP):
        channels = tl.arange(0, COPIES * KB) % KB
        ptrs = groups[:, None] * stride_n + f * KB + channels[None, :]                # [WARPS, COPIES * KB]
        metas = metas + (tl.load(s_ptr + ptrs, mask=group_ok[:, None], other=0.0),
                         tl.load(z_ptr + ptrs, mask=group_ok[:, None], other=0.0))
    return metas


@triton.jit
def _channel_scaled_query(q_t, s, z, f: tl.constexpr, BITS: tl.constexpr, FP16: tl.constexpr):
    """Field f's query scaled by each warp's key-group channel scales s [WARPS, KB] -> (B operand [WARPS, KB, R] in
    the dot dtype, bias [WARPS, R] = sum over the field's channels of q_c s_gc z_gc). q_t [KB, R] is field f of
    `_query_fields` transposed (q times 2^(-f*BITS), an exact power of two)."""
    scaled = q_t.to(tl.float32)[None, :, :] * s.to(tl.float32)[:, :, None]          # [WARPS, KB, R]
    bias = tl.sum(scaled * z.to(tl.float32)[:, :, None], axis=1) * (1 << (f * BITS))  # [WARPS, R]
    return scaled.to(tl.float16 if FP16 else tl.float32), bias


@triton.jit
def _history_warp_channel_keys(q_ptr, q_rows, row_ok, qk_scale, kc_ptr, ks_ptr, kz_ptr, vc_ptr, vs_ptr, vz_ptr,
                               start, end, stride_kcn, stride_ksn, stride_vcn, stride_vsn, part_o_ptr,
                               part_lse_ptr, slot, D: tl.constexpr, K_BITS: tl.constexpr, V_BITS: tl.constexpr,
                               V_GROUP: tl.constexpr, BLOCK_N: tl.constexpr, WARPS: tl.constexpr,
                               FP16: tl.constexpr, ASM: tl.constexpr):
    """Tokens [start, end) of one KV head in group-aligned tiles of BLOCK_N tokens, warp w owning key group
    n0 / BLOCK_W + w (tokens outside [start, end) masked); stores o and lse like the other history loops."""
    qf, q_sum = _query_fields(q_ptr, q_rows, row_ok, qk_scale, D, K_BITS, FP16)
    KP: tl.constexpr = 8 // K_BITS
    VP: tl.constexpr = 8 // V_BITS
    KB: tl.constexpr = D // KP
    VB: tl.constexpr = D // VP
    VG: tl.constexpr = D // V_GROUP
    BLOCK_W: tl.constexpr = BLOCK_N // WARPS                                         # tokens per key group
    R: tl.constexpr = row_ok.shape[0]
    dtype: tl.constexpr = tl.float16 if FP16 else tl.float32
    q_t = ()
    for f in tl.static_range(KP):                                                    # true-scale q (2^(f*BITS) exact)
        q_t = q_t + (tl.broadcast_to((tl.trans(qf[f]).to(tl.float32) * (1 << (f * K_BITS))).to(dtype)[None, :, :],
                                     (WARPS, KB, R)),)                               # [WARPS, KB, R]
    m_i, l_i, pz_sum, acc = _empty_streams(WARPS, R, VB, VP, VG)
    sub = tl.arange(0, WARPS)[:, None] * BLOCK_W + tl.arange(0, BLOCK_W)[None, :]    # [WARPS, BLOCK_W]
    kb = tl.arange(0, KB)
    vb = tl.arange(0, VB)
    first = start - start % BLOCK_W
    v_meta = _group_meta(vs_ptr, vz_ptr, first + sub, first + sub < end, stride_vsn, VG)
    if D >= KEY_META_AHEAD_MIN_D:                                                   # the first tile's, ahead
        groups = first // BLOCK_W + tl.arange(0, WARPS)                               # [WARPS]
        k_ahead = _channel_meta(ks_ptr, kz_ptr, groups, groups * BLOCK_W < end, stride_ksn, KP, KB)
    for n0 in range(first, end, BLOCK_N):
        offs_n = n0 + sub
        stored = offs_n < end
        # the next tile's metadata is loaded a whole tile ahead: its global latency hides behind this tile
        v_next = _group_meta(vs_ptr, vz_ptr, offs_n + BLOCK_N, offs_n + BLOCK_N < end, stride_vsn, VG)
        groups = n0 // BLOCK_W + tl.arange(0, WARPS)                                 # [WARPS]
        if D >= KEY_META_AHEAD_MIN_D:
            k_meta = k_ahead
            k_ahead = _channel_meta(ks_ptr, kz_ptr, groups + WARPS, (groups + WARPS) * BLOCK_W < end, stride_ksn,
                                    KP, KB)
        else:                                                                        # this tile's, loaded here
            k_meta = _channel_meta(ks_ptr, kz_ptr, groups, groups * BLOCK_W < end, stride_ksn, KP, KB)
        packed = tl.load(kc_ptr + offs_n[:, :, None] * stride_kcn + kb[None, None, :], mask=stored[:, :, None],
                         other=0)                                                    # [WARPS, BLOCK_W, KB]
        for f in tl.static_range(KP - 1, -1, -1):
            k = _dequant_channel_field(packed, k_meta[2 * f], k_meta[2 * f + 1], f, K_BITS, FP16, ASM)
            if f == KP - 1:
                qk = tl.dot(k, q_t[f])
            else:
                qk = tl.dot(k, q_t[f], qk)                                           # [WARPS, BLOCK_W, R]
        qk = tl.where(((offs_n >= start) & stored)[:, :, None], qk, float("-inf"))
        p, alpha, m_i, l_i = _warp_softmax_step(qk, m_i, l_i)
        packed = tl.load(vc_ptr + offs_n[:, None, :] * stride_vcn + vb[None, :, None], mask=stored[:, None, :],
                         other=0)                                                    # [WARPS, VB, BLOCK_W]
        acc, pz_sum = _value_step(acc, pz_sum, p, alpha, packed, v_meta, V_BITS, VP // VG, FP16, ASM)
        v_meta = v_next
    _store_warp_streams(m_i, l_i, pz_sum, acc, row_ok, slot, part_o_ptr, part_lse_ptr, D, V_BITS, VP // VG)


@triton.jit
def _dequant_channel_field(packed, s, z, f: tl.constexpr, BITS: tl.constexpr, FP16: tl.constexpr, ASM: tl.constexpr):
    """Field f of a key tile packed [WARPS, N, C] dequantized with each warp's channel (scale, zero) s, z [WARPS, C]:
    (code - zero) * scale in the dot dtype, the exact field times scale * 2^(-f*BITS) plus -scale * zero."""
    dtype: tl.constexpr = tl.float16 if FP16 else tl.float32
    s = s.to(tl.float32)
    scale = (s * (1.0 / (1 << (f * BITS)))).to(dtype)[:, None, :]                    # [WARPS, 1, C]
    shift = (-s * z.to(tl.float32)).to(dtype)[:, None, :]
    return _field(packed, f, BITS, FP16, FIELD_EXACT, ASM) * scale + shift


@triton.jit
def _history_warp_channel_pairs(q_ptr, q_rows, row_ok, qk_scale, kc_ptr, ks_ptr, kz_ptr, vc_ptr, vs_ptr, vz_ptr,
                                start, end, stride_ksn, stride_vsn, part_o_ptr, part_lse_ptr, slot, D: tl.constexpr,
                                K_BITS: tl.constexpr, V_BITS: tl.constexpr, V_GROUP: tl.constexpr,
                                BLOCK_N: tl.constexpr, WARPS: tl.constexpr, FP16: tl.constexpr, ASM: tl.constexpr):
    """`_history_warp_channel_keys` over pair rows (pairs.py: two 16-byte tokens per 32-byte row, head_dim 64 at 2
    bits, codes stored back to back), each warp's BLOCK_N / (2 * WARPS) pair rows one key group. The score MMA's
    B operand is the block-diagonal query of pairs.py with both blocks scaled by the group's channel scales:
        S2 [PW, 2R] = sum_f field_f(K pairs) [PW, 2KB] @ (Q2_f * [s_gf; s_gf]) [2KB, 2R] - [bias_g, bias_g]
    and the values are pairs.py's, with each of a token's V_GROUP-coordinate groups scaling its own fields."""
    qf, q_sum = _query_fields(q_ptr, q_rows, row_ok, qk_scale, D, K_BITS, FP16)
    KP: tl.constexpr = 8 // K_BITS
    VP: tl.constexpr = 8 // V_BITS
    KB: tl.constexpr = D // KP
    VB: tl.constexpr = D // VP
    VG: tl.constexpr = D // V_GROUP
    PR: tl.constexpr = BLOCK_N // 2                                                  # pair rows per tile
    PW: tl.constexpr = PR // WARPS                                                   # pair rows per warp: one group
    R: tl.constexpr = row_ok.shape[0]
    dtype: tl.constexpr = tl.float16 if FP16 else tl.float32
    q2 = ()
    for f in tl.static_range(KP):                                                    # true-scale q (2^(f*BITS) exact)
        q2 = q2 + (tl.broadcast_to(_block_diagonal(tl.trans(qf[f]).to(tl.float32) * (1 << (f * K_BITS)), KB, R)
                                   .to(dtype)[None, :, :], (WARPS, 2 * KB, 2 * R)),)  # [WARPS, 2KB, 2R]
    column_parity = (tl.arange(0, 2 * R) // R)[None, None, :]
    m_i, l_i, pz_sum, acc = _empty_streams(WARPS, 2 * R, 2 * VB, VP, VG)            # acc: [WARPS, 2VB, 2R] each
    sub = tl.arange(0, WARPS)[:, None] * PW + tl.arange(0, PW)[None, :]              # [WARPS, PW]
    kb = tl.arange(0, 2 * KB)
    vb = tl.arange(0, 2 * VB)
    first = (start - start % (2 * PW)) // 2                                         # the first group's first pair
    v_meta = _pair_group_meta(vs_ptr, vz_ptr, first + sub, end, stride_vsn, VG)
    for p0 in range(first, tl.cdiv(end, 2), PR):
        pairs = p0 + sub                                                             # [WARPS, PW]
        v_next = _pair_group_meta(vs_ptr, vz_ptr, pairs + PR, end, stride_vsn, VG)   # a tile ahead
        groups = p0 // PW + tl.arange(0, WARPS)                                      # [WARPS]
        k_meta = _channel_meta(ks_ptr, kz_ptr, groups, groups * (2 * PW) < end, stride_ksn, KP, KB, 2)
        k_token = 2 * pairs[:, :, None] + kb[None, None, :] // KB                    # [WARPS, PW, 2KB]
        packed = tl.load(kc_ptr + pairs[:, :, None] * (2 * KB) + kb[None, None, :], mask=k_token < end,
                         other=0)                                                    # [WARPS, PW, 2KB]
        for f in tl.static_range(KP - 1, -1, -1):
            k = _dequant_channel_field(packed, k_meta[2 * f], k_meta[2 * f + 1], f, K_BITS, FP16, ASM)
            if f == KP - 1:
                qk = tl.dot(k, q2[f])
            else:
                qk = tl.dot(k, q2[f], qk)                                            # [WARPS, PW, 2R]
        token = 2 * pairs[:, :, None] + column_parity                                # [WARPS, PW, 2R]
        qk = tl.where((token >= start) & (token < end), qk, float("-inf"))
        p, alpha, m_i, l_i = _warp_softmax_step(qk, m_i, l_i)                        # alpha: [WARPS, 2R]
        v_token = 2 * pairs[:, None, :] + vb[None, :, None] // VB                    # [WARPS, 2VB, PW]
        packed = tl.load(vc_ptr + pairs[:, None, :] * (2 * VB) + vb[None, :, None], mask=v_token < end,
                         other=0)                                                    # [WARPS, 2VB, PW]
        acc, pz_sum = _pair_value_step(acc, pz_sum, p, alpha, packed, v_meta, R, V_BITS, VP // VG, FP16, ASM)
        v_meta = v_next
    _store_pair_streams(m_i, l_i, pz_sum, acc, row_ok, slot, part_o_ptr, part_lse_ptr, D, V_BITS, VP // VG, WARPS,
                        R, VB)

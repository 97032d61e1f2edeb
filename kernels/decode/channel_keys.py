"""Warp tiles for per-channel keys (KIVI: one (scale, zero) per channel for each group of K_GROUP tokens) beside
per-token values, each warp's token sub-tile one or more whole key groups (`DecodeConfig.channel_key_tiles`).

Each key field is dequantized in the dot dtype with its token's group channel (scale, zero), (code - zero) * scale
(the exact field, one FMA), and meets the loop-invariant query:
    q.k_n = sum_c q_c s_gc (c_nc - z_gc)                                                  (g: token n's group)
Scaling the query by each group's channel scales instead (one B operand per group, moved into the MMA layout every
tile, plus a bias sum) issued more: offline SASS at head_dim 64 with pairs 1,221 -> 942 instructions per 128 tokens,
46 -> 10 barriers. Head_dim 64 at 2 bits (16-byte tokens) reads pair rows (pairs.py). From head_dim 128 each tile's
channel (scale, zero) pairs are loaded one tile ahead, like the values' per-token ones. A key field of 128 bytes per
token (head_dim 256 at 4 bits) is loaded and dequantized in two column chunks of 64 channels (`_key_chunks`), so that
one dequantized chunk, not the whole [tokens, 128] field, is live at a time: offline SASS of KIVI-4's head_dim-256
loop (`python scripts/dev/decode_sass.py --launches --layout kivi4`) 2,157 -> 1,829 instructions per warp and 128
tokens and 51 -> 0 spill instructions, at 255 registers either way; on an H200 1.11-1.12x faster at groups 4 / 16
over the grid (results/bench/bench_formats_kivi_tiny_h200.md). The values and the epilogue are warp_tiles.py's
(pairs.py's over pair rows).
"""
from __future__ import annotations

import triton
import triton.language as tl

from kernels.decode.common import FIELD_EXACT
from kernels.decode.packed import _field, _query_fields
from kernels.decode.pairs import _block_diagonal, _pair_attend, _pair_meta, _store_pair_streams
from kernels.decode.warp_tiles import _empty_streams, _group_meta, _store_warp_streams, _value_step, _value_tiles, \
    _warp_softmax_step

# head_dims from which the key channel metadata is loaded a tile ahead: on the H100 that took KIVI-2 at 128 from 19 % to
# 35 % of copy (batch 8 / 32k; 23 -> 45 % at 32 / 100k); at 64 it lost (9 -> 7 %; results/bench/bench_formats_kivi.md)
KEY_META_AHEAD_MIN_D = tl.constexpr(128)


@triton.jit
def _channel_meta(s_ptr, z_ptr, first_group, end, stride_n, WARPS: tl.constexpr, GW: tl.constexpr,
                  COPIES: tl.constexpr, K_GROUP: tl.constexpr, KP: tl.constexpr, KB: tl.constexpr,
                  CHUNKS: tl.constexpr):
    """The channel (scale, zero) of the GW key groups of each warp from group first_group on, for every field and
    each of its CHUNKS column chunks, the chunk's KB / CHUNKS channels COPIES times (2: a pair row's two tokens): a
    flat tuple (s_0, z_0, s_1, ...), chunk u = f * CHUNKS + c, of [WARPS, GW * COPIES * KB / CHUNKS] tensors,
    group-major, in their stored dtype."""
    KC: tl.constexpr = KB // CHUNKS
    WIDTH: tl.constexpr = COPIES * KC
    cols = tl.arange(0, GW * WIDTH)
    groups = first_group + tl.arange(0, WARPS)[:, None] * GW + (cols // WIDTH)[None, :]   # [WARPS, GW * WIDTH]
    ok = groups * K_GROUP < end
    metas = ()
    for u in tl.static_range(KP * CHUNKS):
        ptrs = groups * stride_n + u * KC + (cols % KC)[None, :]
        metas = metas + (tl.load(s_ptr + ptrs, mask=ok, other=0.0), tl.load(z_ptr + ptrs, mask=ok, other=0.0))
    return metas


@triton.jit
def _group_rows(x, GROUPS: tl.constexpr, ROWS: tl.constexpr):
    """[WARPS, GROUPS * C] per-group channel values (group-major) -> their rows of a warp's tile: [WARPS, 1, C] for one
    group (broadcast by its user), else [WARPS, GROUPS * ROWS, C] (ROWS rows per group)."""
    W: tl.constexpr = x.shape[0]
    C: tl.constexpr = x.shape[1] // GROUPS
    if GROUPS == 1:
        rows = x[:, None, :]
    else:
        rows = tl.reshape(tl.broadcast_to(tl.reshape(x, (W, GROUPS, 1, C)), (W, GROUPS, ROWS, C)),
                          (W, GROUPS * ROWS, C))
    return rows


@triton.jit
def _dequant_keys(packed, meta, f: tl.constexpr, u: tl.constexpr, BITS: tl.constexpr, GROUPS: tl.constexpr,
                  ROWS: tl.constexpr, FP16: tl.constexpr, ASM: tl.constexpr):
    """Field f of a key tile's column chunk packed [WARPS, N, C] (N = GROUPS * ROWS rows) dequantized with each row's
    group channel (scale, zero) of `_channel_meta`'s chunk u: (code - zero) * scale in the dot dtype, the exact field
    (2^(f*BITS) * code) times scale * 2^(-f*BITS) plus -scale * zero."""
    dtype: tl.constexpr = tl.float16 if FP16 else tl.float32
    s = meta[2 * u].to(tl.float32)
    scale = _group_rows((s * (1.0 / (1 << (f * BITS)))).to(dtype), GROUPS, ROWS)
    shift = _group_rows((-s * meta[2 * u + 1].to(tl.float32)).to(dtype), GROUPS, ROWS)
    return _field(packed, f, BITS, FP16, FIELD_EXACT, ASM) * scale + shift


@triton.jit
def _key_dots(packed, meta, q_t, BITS: tl.constexpr, GROUPS: tl.constexpr, ROWS: tl.constexpr, FP16: tl.constexpr,
              ASM: tl.constexpr):
    """Scores of a key tile in column chunks packed (a tuple of [WARPS, N, C]): sum over fields f and chunks c of
    dequantized field_f of chunk c [WARPS, N, C] @ q_t[f * chunks + c] [WARPS, C, COLS]."""
    KP: tl.constexpr = 8 // BITS
    CHUNKS: tl.constexpr = len(packed)
    for f in tl.static_range(KP - 1, -1, -1):
        for c in tl.static_range(CHUNKS):
            k = _dequant_keys(packed[c], meta, f, f * CHUNKS + c, BITS, GROUPS, ROWS, FP16, ASM)
            if f == KP - 1 and c == 0:
                qk = tl.dot(k, q_t[f * CHUNKS + c])
            else:
                qk = tl.dot(k, q_t[f * CHUNKS + c], qk)                             # [WARPS, N, COLS]
    return qk


@triton.jit
def _true_scale_fields(qf, BITS: tl.constexpr, FP16: tl.constexpr):
    """`_query_fields`' fields (q_f * 2^(-f*BITS)) back at q's own scale (exact), transposed: a tuple of [KB, R] in
    the dot dtype."""
    q_t = ()
    for f in tl.static_range(8 // BITS):
        q_t = q_t + ((tl.trans(qf[f]).to(tl.float32) * (1 << (f * BITS))).to(tl.float16 if FP16 else tl.float32),)
    return q_t


@triton.constexpr_function
def _key_chunks(KB):
    """Column chunks of a key field of KB bytes per token: 2 from 128 bytes (head_dim 256 at 4 bits), else 1."""
    return 2 if KB >= 128 else 1


@triton.jit
def _chunk_operands(q_ptr, q_rows, row_ok, qk_scale, qf, KP: tl.constexpr, KB: tl.constexpr, CHUNKS: tl.constexpr,
                    WARPS: tl.constexpr, BITS: tl.constexpr, FP16: tl.constexpr):
    """The score dots' B operands, q at its own scale for each key field f and column chunk c: a tuple, u = f *
    CHUNKS + c, of [WARPS, KB / CHUNKS, R] in the dot dtype (qf: `_query_fields`' fields, used whole for one chunk;
    chunks load q's coordinates f * KB + c * KB / CHUNKS + i again, scaled and rounded as `_query_fields` does)."""
    R: tl.constexpr = row_ok.shape[0]
    KC: tl.constexpr = KB // CHUNKS
    q_t = ()
    if CHUNKS == 1:
        q_true = _true_scale_fields(qf, BITS, FP16)
        for f in tl.static_range(KP):
            q_t = q_t + (tl.broadcast_to(q_true[f][None, :, :], (WARPS, KB, R)),)
    else:
        for u in tl.static_range(KP * CHUNKS):
            x = tl.load(q_ptr + q_rows[:, None] + u * KC + tl.arange(0, KC)[None, :], mask=row_ok[:, None], other=0.0)
            x = (x.to(tl.float32) * qk_scale).to(tl.float16 if FP16 else tl.float32)  # [R, KC]
            q_t = q_t + (tl.broadcast_to(tl.trans(x)[None, :, :], (WARPS, KC, R)),)
    return q_t


@triton.jit
def _history_warp_channel_keys(q_ptr, q_rows, row_ok, qk_scale, kc_ptr, ks_ptr, kz_ptr, vc_ptr, vs_ptr, vz_ptr,
                               start, end, stride_kcn, stride_ksn, stride_vcn, stride_vsn, part_o_ptr,
                               part_lse_ptr, slot, D: tl.constexpr, K_BITS: tl.constexpr, V_BITS: tl.constexpr,
                               K_GROUP: tl.constexpr, V_GROUP: tl.constexpr, BLOCK_N: tl.constexpr,
                               WARPS: tl.constexpr, FP16: tl.constexpr, ASM: tl.constexpr):
    """Tokens [start, end) of one KV head in group-aligned tiles of BLOCK_N tokens, warp w owning the BLOCK_N / WARPS
    tokens of key groups from n0 / K_GROUP + w * GW on; stores o and lse like the other history loops. The code
    loads take no mask (a token from `end` on reads token end - 1, always stored) and only a split's first tile
    (from the group start below `start`) and its last (past `end`) mask scores, in a branch the others skip: on an
    H200 0.86-0.90x the time for KIVI-2 at head_dim 128 and 0.92-0.96x for KIVI-4 at batch 8-32 / 32k-100k, though
    it issues only a few instructions fewer (offline SASS per 128 tokens, KIVI-4 at 128: 984 -> 948; KIVI-2: 1115 ->
    1111; results/bench/bench_formats_whole_tiles_h200.md). The pair loop below keeps masking every tile: unmasked whole
    tiles took its 4-row programs to 219 registers and 1.06-1.10x the time (same file)."""
    qf, _ = _query_fields(q_ptr, q_rows, row_ok, qk_scale, D, K_BITS, FP16)
    KP: tl.constexpr = 8 // K_BITS
    KB: tl.constexpr = D // KP
    VG: tl.constexpr = D // V_GROUP
    BLOCK_W: tl.constexpr = BLOCK_N // WARPS                                         # tokens per warp
    GW: tl.constexpr = BLOCK_W // K_GROUP                                            # key groups per warp
    R: tl.constexpr = row_ok.shape[0]
    CHUNKS: tl.constexpr = _key_chunks(KB)
    KC: tl.constexpr = KB // CHUNKS                                                  # channels per chunk
    q_t = _chunk_operands(q_ptr, q_rows, row_ok, qk_scale, qf, KP, KB, CHUNKS, WARPS, K_BITS, FP16)
    m_i, l_i, pz_sum, acc = _empty_streams(WARPS, R, D, V_BITS, V_GROUP)
    sub = tl.arange(0, WARPS)[:, None] * BLOCK_W + tl.arange(0, BLOCK_W)[None, :]    # [WARPS, BLOCK_W]
    kb = tl.arange(0, KC)
    first = start - start % K_GROUP
    v_meta = _group_meta(vs_ptr, vz_ptr, first + sub, first + sub < end, stride_vsn, VG)
    if D >= KEY_META_AHEAD_MIN_D:                                                   # the first tile's, ahead
        k_ahead = _channel_meta(ks_ptr, kz_ptr, first // K_GROUP, end, stride_ksn, WARPS, GW, 1, K_GROUP, KP, KB,
                                CHUNKS)
    for n0 in range(first, end, BLOCK_N):
        offs_n = n0 + sub
        clamped = tl.minimum(offs_n, end - 1)                                        # in bounds: no load masks
        # the next tile's metadata is loaded a whole tile ahead: its global latency hides behind this tile
        v_next = _group_meta(vs_ptr, vz_ptr, offs_n + BLOCK_N, offs_n + BLOCK_N < end, stride_vsn, VG)
        if D >= KEY_META_AHEAD_MIN_D:
            k_meta = k_ahead
            k_ahead = _channel_meta(ks_ptr, kz_ptr, (n0 + BLOCK_N) // K_GROUP, end, stride_ksn, WARPS, GW, 1, K_GROUP,
                                    KP, KB, CHUNKS)
        else:                                                                        # this tile's, loaded here
            k_meta = _channel_meta(ks_ptr, kz_ptr, n0 // K_GROUP, end, stride_ksn, WARPS, GW, 1, K_GROUP, KP, KB,
                                   CHUNKS)
        packed = ()
        for c in tl.static_range(CHUNKS):
            packed = packed + (tl.load(kc_ptr + clamped[:, :, None] * stride_kcn + c * KC + kb[None, None, :]),)
        qk = _key_dots(packed, k_meta, q_t, K_BITS, GW, K_GROUP, FP16, ASM)          # [WARPS, BLOCK_W, R]
        if (n0 < start) | (n0 + BLOCK_N > end):                                      # a split's first or last tile
            qk = tl.where(((offs_n >= start) & (offs_n < end))[:, :, None], qk, float("-inf"))
        p, alpha, m_i, l_i = _warp_softmax_step(qk, m_i, l_i)
        tiles = _value_tiles(vc_ptr, clamped, stride_vcn, D, V_BITS, V_GROUP)
        acc, pz_sum = _value_step(acc, pz_sum, p, alpha, tiles, v_meta, D, V_BITS, V_GROUP, FP16, ASM)
        v_meta = v_next
    _store_warp_streams(m_i, l_i, pz_sum, acc, row_ok, slot, part_o_ptr, part_lse_ptr, D, V_BITS, V_GROUP)


@triton.jit
def _history_warp_channel_pairs(q_ptr, q_rows, row_ok, qk_scale, kc_ptr, ks_ptr, kz_ptr, vc_ptr, vs_ptr, vz_ptr,
                                start, end, stride_ksn, stride_vsn, part_o_ptr, part_lse_ptr, slot, D: tl.constexpr,
                                K_BITS: tl.constexpr, V_BITS: tl.constexpr, K_GROUP: tl.constexpr,
                                V_GROUP: tl.constexpr, BLOCK_N: tl.constexpr, WARPS: tl.constexpr,
                                COLUMNS: tl.constexpr, FP16: tl.constexpr, ASM: tl.constexpr):
    """`_history_warp_channel_keys` over pair rows (pairs.py: two 16-byte tokens per 32-byte row, head_dim 64 at 2
    bits, codes stored back to back), each warp's BLOCK_N / (2 * WARPS) pair rows one or more whole key groups. Each
    key field is dequantized with its row's group channel (scale, zero), repeated over the pair row's two tokens,
    against pairs.py's block-diagonal query:
        S2 [PW, 2R] = sum_f ((field_f(K pairs) - [z_gf, z_gf]) * [s_gf, s_gf]) [PW, 2KB] @ Q2_f [2KB, 2R]
    and the values are pairs.py's, with each of a token's V_GROUP-coordinate groups scaling its own fields."""
    qf, _ = _query_fields(q_ptr, q_rows, row_ok, qk_scale, D, K_BITS, FP16)
    KP: tl.constexpr = 8 // K_BITS
    VP: tl.constexpr = 8 // V_BITS
    KB: tl.constexpr = D // KP
    VB: tl.constexpr = D // VP
    VG: tl.constexpr = D // V_GROUP
    PR: tl.constexpr = BLOCK_N // 2                                                  # pair rows per tile
    PW: tl.constexpr = PR // WARPS                                                   # pair rows per warp
    GROUP_ROWS: tl.constexpr = K_GROUP // 2                                          # pair rows per key group
    GW: tl.constexpr = PW // GROUP_ROWS                                              # key groups per warp
    R: tl.constexpr = row_ok.shape[0]
    q_true = _true_scale_fields(qf, K_BITS, FP16)
    q2 = ()
    for f in tl.static_range(KP):
        q2 = q2 + (tl.broadcast_to(_block_diagonal(q_true[f], KB, R)[None, :, :], (WARPS, 2 * KB, 2 * R)),)
    # value pair rows stay bytes here: as 16-bit words (pairs.py) this loop was slower at batch 1 / 32k on the H100
    # (29 -> 32 us at head_dim 64; results/bench/bench_formats_words.md)
    m_i, l_i, pz_sum, acc = _empty_streams(WARPS, R, D, V_BITS, V_GROUP, 2, False)  # acc: [WARPS, 2VB, 2R] each
    sub = tl.arange(0, WARPS)[:, None] * PW + tl.arange(0, PW)[None, :]              # [WARPS, PW]
    kb = tl.arange(0, 2 * KB)
    first = (start - start % K_GROUP) // 2                                           # the first group's first pair
    v_meta = _pair_meta(vs_ptr, vz_ptr, first + sub, end, stride_vsn, VG, COLUMNS)
    for p0 in range(first, tl.cdiv(end, 2), PR):
        pairs = p0 + sub                                                             # [WARPS, PW]
        v_next = _pair_meta(vs_ptr, vz_ptr, pairs + PR, end, stride_vsn, VG, COLUMNS)   # a tile ahead
        k_meta = _channel_meta(ks_ptr, kz_ptr, p0 // GROUP_ROWS, end, stride_ksn, WARPS, GW, 2, K_GROUP, KP, KB, 1)
        k_token = 2 * pairs[:, :, None] + kb[None, None, :] // KB                    # [WARPS, PW, 2KB]
        packed = tl.load(kc_ptr + pairs[:, :, None] * (2 * KB) + kb[None, None, :], mask=k_token < end,
                         other=0)                                                    # [WARPS, PW, 2KB]
        qk = _key_dots((packed,), k_meta, q2, K_BITS, GW, GROUP_ROWS, FP16, ASM)     # [WARPS, PW, 2R]
        m_i, l_i, acc, pz_sum = _pair_attend(qk, pairs, start, end, m_i, l_i, acc, pz_sum, vc_ptr, v_meta, R, VB,
                                             V_BITS, VP // VG, FP16, ASM)
        v_meta = v_next
    _store_pair_streams(m_i, l_i, pz_sum, acc, row_ok, slot, part_o_ptr, part_lse_ptr, D, V_BITS, VP // VG, WARPS,
                        R, VB)

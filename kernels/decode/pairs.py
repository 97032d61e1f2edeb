"""Warp tiles over token PAIRS, for head dims whose packed token is 16 bytes (head_dim 64 at 2 bits).

A 16-byte row is too narrow for the compiler's pipelined path: Triton loads [tokens, 16] code tiles into registers
without cp.async and moves every unpacked fp16 value into the MMA layout through shared memory (256 STS.U16 + 256
LDS.U16 per 256-token tile, scripts/dev/decode_sass.py), which held head_dim 64 at ~10 % of copy bandwidth. Two
consecutive tokens of a contiguous history are one 32-byte row (byte b of pair row r belongs to token
2r + b // KB, the layout head_dim 128 loads at 72-100 % of copy), so this loop reads pair rows and keeps the
pairs apart in the dots themselves:

    S2 [PR, 2R]  = sum_f field_f(K pairs) [PR, 2KB] @ Q2_f [2KB, 2R],  Q2_f = [[q_f^T, 0], [0, q_f^T]]
    O2_f [2VB, 2R] += field_f(V pairs)^T [2VB, PR] @ P2' [PR, 2R]

Column c of S2 is query row c % R against the token of parity c // R of every pair; each column keeps its own
online-softmax stream (as each warp does), so the loop never mixes the two parities. O2_f's diagonal blocks
(bytes of parity p against columns of parity p) are the wanted sums; the off-diagonal blocks are discarded
after the loop: the dots do twice the MACs of the unpaired loop, on tensor cores that were idle. A 32-byte pair
row is 16 16-bit words, so the loop splits each field into its even and odd bytes as warp_tiles.py does (two
dots per field, Q2 built per half) where the launch says so (`uses_pair_words`); KIVI's value pair rows
(channel_keys.py) stay bytes. With DecodeConfig.wide_pairs, 4-row programs read head_dim 128's 32-byte tokens as 64-byte
pair rows the same way: not for the row width, but so that N = 2 x 4 rows fills the MMA's 8 columns at GQA 1-4
(`kernels.decode.launch.four_row_pairs`).
"""
from __future__ import annotations

import triton
import triton.language as tl

from kernels.decode.common import TINY_SCALE
from kernels.decode.packed import _query_fields
from kernels.decode.warp_tiles import _block_rows, _empty_streams, _half_field, _key_halves, _query_half, \
    _store_warp_streams, _warp_softmax_step


@triton.jit
def _block_diagonal(x, KB: tl.constexpr, R: tl.constexpr):
    """x [KB, R] -> [[x, 0], [0, x]] as [2KB, 2R] (row b, column c: x[b % KB, c % R] where b // KB == c // R)."""
    tiled = tl.reshape(tl.broadcast_to(x[None, :, None, :], (2, KB, 2, R)), (2 * KB, 2 * R))
    same = (tl.arange(0, 2 * KB) // KB)[:, None] == (tl.arange(0, 2 * R) // R)[None, :]
    return tl.where(same, tiled, 0.0)


@triton.jit
def _pair_meta(s_ptr, z_ptr, pairs, end, stride_n, GROUPS: tl.constexpr, COLUMNS: tl.constexpr):
    """(scale, zero) of both tokens of every pair row [W, PW] for each of a token's GROUPS groups: a tuple of GROUPS
    tuples, each of four [W, PW, 1] fp32 tensors s_even, z_even, s_odd, z_odd or, with COLUMNS, of two [W, PW, 2]
    tensors s, z in the stored dtype (a pair's two tokens are adjacent: one load each), which `_meta_columns`
    repeats over each parity's columns where they are used (`DecodeConfig.column_meta`)."""
    metas = ()
    if COLUMNS:
        token = 2 * pairs[:, :, None] + tl.arange(0, 2)[None, None, :]              # [W, PW, 2]
        for g in tl.static_range(GROUPS):
            s = tl.load(s_ptr + g + token * stride_n, mask=token < end, other=0.0)
            z = tl.load(z_ptr + g + token * stride_n, mask=token < end, other=0.0)
            metas = metas + ((s, z),)
    else:
        even = 2 * tl.expand_dims(pairs, -1)
        for g in tl.static_range(GROUPS):
            s_e = tl.load(s_ptr + g + even * stride_n, mask=even < end, other=0.0).to(tl.float32)
            z_e = tl.load(z_ptr + g + even * stride_n, mask=even < end, other=0.0).to(tl.float32)
            s_o = tl.load(s_ptr + g + (even + 1) * stride_n, mask=even + 1 < end, other=0.0).to(tl.float32)
            z_o = tl.load(z_ptr + g + (even + 1) * stride_n, mask=even + 1 < end, other=0.0).to(tl.float32)
            metas = metas + ((s_e, z_e, s_o, z_o),)
    return metas


@triton.jit
def _meta_columns(meta, like):
    """`_pair_meta`'s (s, z) of one group, each [W, PW, 2] -> each [W, PW, 2R] fp32 shaped like `like` [W, PW, 2R],
    column c holding its token's (parity c // R) value. Repeated after the loop-carried load, not before it, so the
    compiler moves them into the MMA layout with matrix stores and loads at their use, a tile after their load."""
    W: tl.constexpr = like.shape[0]
    PW: tl.constexpr = like.shape[1]
    R: tl.constexpr = like.shape[2] // 2
    s, z = meta
    s = tl.reshape(tl.broadcast_to(s[:, :, :, None], (W, PW, 2, R)), (W, PW, 2 * R)).to(tl.float32)
    z = tl.reshape(tl.broadcast_to(z[:, :, :, None], (W, PW, 2, R)), (W, PW, 2 * R)).to(tl.float32)
    return s, z


@triton.jit
def _fold_key_meta(qk, q_sum2, meta, R: tl.constexpr):
    """Raw pair scores [W, PR, 2R] (TINY fields) -> s * (q.c * 2^24 - z * sum(q)) with each column's token's
    (scale, zero) (`_pair_meta`'s either form). In the four-tensor form both parities are computed on the whole
    tile and selected: the [W, PR, 1] metadata then meets the dot's result directly and no [W, PR, 2R] tensor
    changes layout."""
    base = qk * TINY_SCALE
    q_sum2 = q_sum2[None, None, :]
    if len(meta) == 2:
        s, z = _meta_columns(meta, qk)
        out = (base - q_sum2 * z) * s
    else:
        s_e, z_e, s_o, z_o = meta
        odd = (tl.arange(0, 2 * R) >= R)[None, None, :]                              # [1, 1, 2R]
        out = tl.where(odd, (base - q_sum2 * z_o) * s_o, (base - q_sum2 * z_e) * s_e)
    return out


@triton.jit
def _scale_probs(p, meta, R: tl.constexpr):
    """p [W, PR, 2R] -> (p * scale, p * scale * zero) with each column's token's value (scale, zero) (`_pair_meta`'s
    either form)."""
    if len(meta) == 2:
        s, z = _meta_columns(meta, p)
        pv = p * s
        pvz = pv * z
    else:
        s_e, z_e, s_o, z_o = meta
        odd = (tl.arange(0, 2 * R) >= R)[None, None, :]
        pv = tl.where(odd, p * s_o, p * s_e)
        pvz = tl.where(odd, pv * z_o, pv * z_e)
    return pv, pvz


@triton.jit
def _pair_value_step(acc, pz_sum, p, alpha, packed, v_meta, R: tl.constexpr, V_BITS: tl.constexpr,
                     V_FIELDS: tl.constexpr, FP16: tl.constexpr, ASM: tl.constexpr):
    """acc_f = alpha * acc_f + field_f(V pairs)^T [2VB, PW] @ P2'_g [PW, 2R] for every value field of one transposed
    pair tile packed [W, 2VB, PW] (bytes), or for each half of every field where the tile is [W, VB, PW] 16-bit
    words (two accumulators per field, one row per word); P2'_g: p times the value scale of group g = f // V_FIELDS
    of each column's token, in the dot dtype; pz_sum_g = alpha * pz_sum_g + sum P2'_g * zero_g. v_meta:
    `_pair_meta`'s tuple."""
    VP: tl.constexpr = 8 // V_BITS
    dtype: tl.constexpr = tl.float16 if FP16 else tl.float32
    pv = ()
    new_pz = ()
    for g in tl.static_range(VP // V_FIELDS):
        pv_g, pvz_g = _scale_probs(p, v_meta[g], R)                                  # [W, PW, 2R] each
        pv = pv + (pv_g.to(dtype),)
        new_pz = new_pz + (pz_sum[g] * alpha + tl.sum(pvz_g, axis=1),)
    HALVES: tl.constexpr = len(acc) // VP
    new_acc = ()
    for f in tl.static_range(VP):
        for h in tl.static_range(HALVES):
            v = _half_field(packed, f, h, V_BITS, FP16, ASM)                        # [W, 2VB / halves, PW]
            acc_u = acc[f * HALVES + h]
            new_acc = new_acc + (tl.dot(v, pv[f // V_FIELDS], acc_u * alpha[:, None, :]),)
    return new_acc, new_pz


@triton.jit
def _inside(token, end, MASKED: tl.constexpr):
    """token < end where MASKED, else a constant all-true mask (the compiler drops it from the loads)."""
    if MASKED:
        ok = token < end
    else:
        ok = tl.full(token.shape, 1, tl.int1)
    return ok


@triton.jit
def _pair_attend(qk, pairs, start, end, m_i, l_i, acc, pz_sum, vc_ptr, v_meta, R: tl.constexpr, VB: tl.constexpr,
                 V_BITS: tl.constexpr, V_FIELDS: tl.constexpr, FP16: tl.constexpr, ASM: tl.constexpr,
                 MASKED: tl.constexpr = True):
    """One pair tile after its scores qk [W, PW, 2R]: tokens outside [start, end) masked (MASKED; a tile inside
    them needs no mask), the online-softmax step of every (warp, parity) stream, the value pair rows of `pairs`
    [W, PW] loaded and accumulated (`_pair_value_step`) -> the new m_i, l_i, acc, pz_sum."""
    if MASKED:
        column_parity = (tl.arange(0, 2 * R) // R)[None, None, :]
        token = 2 * pairs[:, :, None] + column_parity                                # [W, PW, 2R]
        qk = tl.where((token >= start) & (token < end), qk, float("-inf"))
    p, alpha, m_i, l_i = _warp_softmax_step(qk, m_i, l_i)                            # alpha: [W, 2R]
    if len(acc) > 8 // V_BITS:                                                       # two halves per field
        vw = tl.arange(0, VB)
        v_token = 2 * pairs[:, None, :] + vw[None, :, None] // (VB // 2)              # [W, VB, PW]
        v_ok = _inside(v_token, end, MASKED)
        packed = tl.load(vc_ptr.to(tl.pointer_type(tl.uint16)) + pairs[:, None, :] * VB + vw[None, :, None],
                         mask=v_ok, other=0)                                         # [W, VB, PW] words
    else:
        vb = tl.arange(0, 2 * VB)
        v_token = 2 * pairs[:, None, :] + vb[None, :, None] // VB                    # [W, 2VB, PW]
        v_ok = _inside(v_token, end, MASKED)
        packed = tl.load(vc_ptr + pairs[:, None, :] * (2 * VB) + vb[None, :, None], mask=v_ok,
                         other=0)                                                    # [W, 2VB, PW]
    acc, pz_sum = _pair_value_step(acc, pz_sum, p, alpha, packed, v_meta, R, V_BITS, V_FIELDS, FP16, ASM)
    return m_i, l_i, acc, pz_sum


@triton.jit
def _unpair_streams(x, W: tl.constexpr, R: tl.constexpr):
    """[W, 2R] per-(warp, parity) stream values -> [2W, R] (stream w * 2 + parity)."""
    return tl.reshape(x, (2 * W, R))


@triton.jit
def _diagonal_blocks(acc, W: tl.constexpr, VB: tl.constexpr, R: tl.constexpr):
    """O2 [W, 2VB, 2R] -> [2W, VB, R]: the parity-p bytes against the parity-p columns, stream w * 2 + p."""
    blocks = tl.reshape(acc, (W, 2, VB, 2, R))                                        # [W, p_byte, VB, p_col, R]
    same = (tl.arange(0, 2)[:, None] == tl.arange(0, 2)[None, :])[None, :, None, :, None]
    diag = tl.sum(tl.where(same, blocks, 0.0), axis=1)                                # [W, VB, p_col, R]
    return tl.reshape(tl.permute(diag, (0, 2, 1, 3)), (2 * W, VB, R))


@triton.jit
def _history_warp_pairs(q_ptr, q_rows, row_ok, qk_scale, kc_ptr, ks_ptr, kz_ptr, vc_ptr, vs_ptr, vz_ptr,
                        start, end, stride_ksn, stride_vsn, part_o_ptr, part_lse_ptr, slot,
                        D: tl.constexpr, K_BITS: tl.constexpr, V_BITS: tl.constexpr, BLOCK_N: tl.constexpr,
                        WARPS: tl.constexpr, WORDS: tl.constexpr, COLUMNS: tl.constexpr, FP16: tl.constexpr,
                        ASM: tl.constexpr, MASKED_TILES: tl.constexpr = False):
    """`_history_warp_tiles` over pair rows of a history whose codes are contiguous (token stride = bytes per
    token): tokens [start, end) of one KV head, BLOCK_N tokens (BLOCK_N / 2 pair rows) per tile, one sub-tile of
    pair rows per warp; the codes as 16-bit words where WORDS (`kernels.decode.launch.uses_pair_words`), else as
    bytes; the (scale, zero) in `_pair_meta`'s COLUMNS form where so. Tiles wholly inside [start, end) compile
    without masks, in a loop of their own, and a split's partial tiles (its last; its first at an odd start) follow
    masked; MASKED_TILES: one loop that masks every tile (`DecodeConfig.masked_pair_tiles`: the second loop body's
    registers spill under a 168-register cap). Stores o and lse like the other history loops."""
    qf, q_sum = _query_fields(q_ptr, q_rows, row_ok, qk_scale, D, K_BITS, FP16)
    KP: tl.constexpr = 8 // K_BITS
    VP: tl.constexpr = 8 // V_BITS
    KB: tl.constexpr = D // KP
    VB: tl.constexpr = D // VP
    PR: tl.constexpr = BLOCK_N // 2                                                  # pair rows per tile
    PW: tl.constexpr = PR // WARPS                                                   # pair rows per warp
    R: tl.constexpr = row_ok.shape[0]
    dtype: tl.constexpr = tl.float16 if FP16 else tl.float32
    KH: tl.constexpr = _key_halves(2 * D, K_BITS) if WORDS else 1                 # a pair row's key halves
    q2 = ()
    for f in tl.static_range(KP):
        for h in tl.static_range(KH):
            if KH == 1:
                x = qf[f]                                                            # [R, KB]
            else:  # coordinates 2j + h of field f
                x = _query_half(q_ptr, q_rows, row_ok, qk_scale, f * KB + h + 2 * tl.arange(0, KB // 2), f, K_BITS,
                                FP16)                                                # [R, KB / 2]
            q2 = q2 + (tl.broadcast_to(_block_diagonal(tl.trans(x), KB // KH, R).to(dtype)[None, :, :],
                                       (WARPS, 2 * KB // KH, 2 * R)),)               # [WARPS, 2KB / KH, 2R]
    q_sum2 = tl.reshape(tl.broadcast_to(q_sum[None, :], (2, R)), (2 * R,))           # [2R]
    m_i, l_i, pz_sum, acc = _empty_streams(WARPS, R, D, V_BITS, D, 2, WORDS)       # acc: [WARPS, 2VB / KH, 2R] each
    sub = tl.arange(0, WARPS)[:, None] * PW + tl.arange(0, PW)[None, :]              # [WARPS, PW]
    first = start // 2
    if MASKED_TILES:                                                                 # one loop, every tile masked
        lo = first
        hi = tl.cdiv(end, 2)
    else:                                                                            # whole tiles first, unmasked
        head = start % 2                                                             # its first pair holds start - 1
        lo = first + head * PR
        hi = lo + tl.maximum(end // 2 - lo, 0) // PR * PR                            # whole tiles inside [start, end)
    k_meta = _pair_meta(ks_ptr, kz_ptr, lo + sub, end, stride_ksn, 1, COLUMNS)
    v_meta = _pair_meta(vs_ptr, vz_ptr, lo + sub, end, stride_vsn, 1, COLUMNS)
    for p0 in range(lo, hi, PR):
        pairs = p0 + sub                                                             # [WARPS, PW]
        k_next = _pair_meta(ks_ptr, kz_ptr, pairs + PR, end, stride_ksn, 1, COLUMNS)  # a tile ahead
        v_next = _pair_meta(vs_ptr, vz_ptr, pairs + PR, end, stride_vsn, 1, COLUMNS)
        m_i, l_i, acc, pz_sum = _pair_tile(pairs, start, end, q2, q_sum2, k_meta, v_meta, m_i, l_i, acc, pz_sum,
                                           kc_ptr, vc_ptr, KB, KH, R, VB, K_BITS, V_BITS, FP16, ASM, MASKED_TILES)
        k_meta, v_meta = k_next, v_next
    if not MASKED_TILES:
        tail = (hi < tl.cdiv(end, 2)).to(tl.int32)
        for e in range(0, head + tail):  # the split's partial tiles (a head at an odd start, a tail), masked
            pairs = tl.where((e == 0) & (head == 1), first, hi) + sub
            k_edge = _pair_meta(ks_ptr, kz_ptr, pairs, end, stride_ksn, 1, COLUMNS)
            v_edge = _pair_meta(vs_ptr, vz_ptr, pairs, end, stride_vsn, 1, COLUMNS)
            m_i, l_i, acc, pz_sum = _pair_tile(pairs, start, end, q2, q_sum2, k_edge, v_edge, m_i, l_i, acc, pz_sum,
                                               kc_ptr, vc_ptr, KB, KH, R, VB, K_BITS, V_BITS, FP16, ASM, True)
    _store_pair_streams(m_i, l_i, pz_sum, acc, row_ok, slot, part_o_ptr, part_lse_ptr, D, V_BITS, VP, WARPS, R, VB)


@triton.jit
def _pair_tile(pairs, start, end, q2, q_sum2, k_meta, v_meta, m_i, l_i, acc, pz_sum, kc_ptr, vc_ptr, KB: tl.constexpr,
               KH: tl.constexpr, R: tl.constexpr, VB: tl.constexpr, K_BITS: tl.constexpr, V_BITS: tl.constexpr,
               FP16: tl.constexpr, ASM: tl.constexpr, MASKED: tl.constexpr):
    """One tile of `_history_warp_pairs`, pair rows `pairs` [W, PW] with their (scale, zero) k_meta / v_meta: the
    scores, then `_pair_attend` -> the new m_i, l_i, acc, pz_sum. MASKED: tokens outside [start, end) are neither
    loaded nor attended (a split's first tile at an odd start, its last); a tile inside compiles without masks
    (offline SASS per 128 tokens: head_dim 64's 4-row pairs on the large grid 246 -> 225; head_dim 128's wide
    column-meta pairs 368 -> 341, which keep the masked loop: `kernels.decode.launch.masked_pair_tile_launches`)."""
    KP: tl.constexpr = 8 // K_BITS
    kb = tl.arange(0, 2 * KB // KH)
    k_token = 2 * pairs[:, :, None] + kb[None, None, :] // (KB // KH)                # [W, PW, 2KB / KH]
    k_ok = _inside(k_token, end, MASKED)
    if KH == 2:
        packed = tl.load(kc_ptr.to(tl.pointer_type(tl.uint16)) + pairs[:, :, None] * KB + kb[None, None, :],
                         mask=k_ok, other=0)                                         # [W, PW, KB] words
    else:
        packed = tl.load(kc_ptr + pairs[:, :, None] * (2 * KB) + kb[None, None, :], mask=k_ok,
                         other=0)                                                    # [W, PW, 2KB]
    for f in tl.static_range(KP - 1, -1, -1):
        for h in tl.static_range(KH):
            k = _half_field(packed, f, h, K_BITS, FP16, ASM)
            if f == KP - 1 and h == 0:
                qk = tl.dot(k, q2[f * KH + h])
            else:
                qk = tl.dot(k, q2[f * KH + h], qk)                                   # [W, PW, 2R]
    qk = _fold_key_meta(qk, q_sum2, k_meta[0], R)
    return _pair_attend(qk, pairs, start, end, m_i, l_i, acc, pz_sum, vc_ptr, v_meta, R, VB, V_BITS, 8 // V_BITS,
                        FP16, ASM, MASKED)


@triton.jit
def _field_halves(streams, W: tl.constexpr, VB: tl.constexpr, R: tl.constexpr):
    """Per-field [2W, VB, R] streams -> their even and odd rows [2W, VB / 2, R] each, field by field: the halves
    `_store_warp_streams` expects where a field's bytes load as 16-bit words (`_block_rows`)."""
    halves = ()
    for f in tl.static_range(len(streams)):
        even, odd = tl.split(tl.permute(tl.reshape(streams[f], (2 * W, VB // 2, 2, R)), (0, 1, 3, 2)))
        halves = halves + (even, odd)
    return halves


@triton.jit
def _store_pair_streams(m_i, l_i, pz_sum, acc, row_ok, slot, part_o_ptr, part_lse_ptr, D: tl.constexpr,
                        V_BITS: tl.constexpr, V_FIELDS: tl.constexpr, W: tl.constexpr, R: tl.constexpr,
                        VB: tl.constexpr):
    """The 2 * W (warp, parity) streams as warp_tiles.py's [2W, R] streams (the diagonal blocks of the value
    accumulators), merged and stored by its epilogue."""
    VP: tl.constexpr = 8 // V_BITS
    HALVES: tl.constexpr = len(acc) // VP
    streams = ()
    for f in tl.static_range(VP):
        if HALVES == 1:
            streams = streams + (_diagonal_blocks(acc[f], W, VB, R),)                # [2W, VB, R]
        else:  # half h's row j is coordinate 2j + h of its token
            even = _diagonal_blocks(acc[2 * f], W, VB // 2, R)                       # [2W, VB / 2, R]
            odd = _diagonal_blocks(acc[2 * f + 1], W, VB // 2, R)
            streams = streams + (tl.reshape(tl.permute(tl.join(even, odd), (0, 1, 3, 2)), (2 * W, VB, R)),)
    if _block_rows(D, V_BITS, VB * V_FIELDS)[2] == 2:  # the store's fields in halves (head_dim 128: 32-byte fields)
        streams = _field_halves(streams, W, VB, R)
    pz = ()
    for g in tl.static_range(VP // V_FIELDS):
        pz = pz + (_unpair_streams(pz_sum[g], W, R),)
    _store_warp_streams(_unpair_streams(m_i, W, R), _unpair_streams(l_i, W, R), pz, streams, row_ok, slot,
                        part_o_ptr, part_lse_ptr, D, V_BITS, VB * V_FIELDS)

"""The warp-tile history loop (`DecodeConfig.warp_tiles`) for per-token layouts: one or more (scale, zero) groups per
token, each covering whole fields (a group of 128 at head_dim 256 and 2 bits: fields 0-1 and 2-3).

A field of >= HALF_WORD_ROWS bytes (head_dim 128 and 256 at 2 bits, 4-bit codes) loads as 16-bit words, word i =
bytes 2i and 2i + 1 of a token, and splits into two halves, its even and its odd bytes: two dots of half the K
(keys: the query's coordinates split to match, `_query_key_operands`) or of half the M (values: one accumulator
per half, row i of half h = coordinate 2i + h of the block). A register then holds two words of one MMA operand
row, so field f of half h is one AND (h = 0) or a shift and an AND (`_half_field_ptx`), and Triton moves the
words into the MMA layout with 16-bit matrix loads; byte tiles went through shared memory one byte at a time
(LDS.U8, `scripts/dev/decode_sass.py`)."""
from __future__ import annotations

import triton
import triton.language as tl

from kernels.decode.common import FIELD_TINY, TINY_SCALE, _store_lse
from kernels.decode.packed import _field, _load_token_meta, _query_fields, _split_meta

HALF_WORD_ROWS = 32       # row blocks of >= this many bytes load as 16-bit words (`_value_tiles`)


@triton.constexpr_function
def _block_rows(D, V_BITS, V_GROUP, PAIRED=1):
    """(row blocks per value field, bytes per block, halves per block): a field's D * bits / 8 bytes in one block, or
    one per (scale, zero) group narrower than a field; a block of >= HALF_WORD_ROWS bytes (PAIRED = 2: two tokens'
    blocks, pairs.py's pair rows) loads as 16-bit words and splits into its even and odd bytes (two halves)."""
    blocks = (D * V_BITS // 8 + V_GROUP - 1) // V_GROUP
    rows = D * V_BITS // 8 // blocks
    return blocks, rows, 2 if PAIRED * rows >= HALF_WORD_ROWS else 1


@triton.constexpr_function
def _key_halves(D, K_BITS):
    """Halves of a key field: 2 where its D * bits / 8 bytes load as >= 16 16-bit words (the MMA's K), else 1."""
    return 2 if D * K_BITS // 8 >= HALF_WORD_ROWS else 1


@triton.jit
def _group_meta(s_ptr, z_ptr, offs_n, mask_n, stride_n, GROUPS: tl.constexpr):
    """Per-token (scale, zero) of each of the GROUPS groups of tokens offs_n: a tuple of [..., 2] tensors."""
    metas = ()
    for g in tl.static_range(GROUPS):
        metas = metas + (_load_token_meta(s_ptr + g, z_ptr + g, offs_n, mask_n, stride_n),)
    return metas


@triton.jit
def _query_group_sums(q_ptr, q_rows, row_ok, qk_scale, q_sum, D: tl.constexpr, GROUPS: tl.constexpr,
                      FP16: tl.constexpr):
    """sum(q * qk_scale) over each group's coordinates, rounded to the dot dtype first as `_query_fields` rounds
    the dot's operands: a tuple of [R]. One group: (q_sum,) as `_query_fields` returned it."""
    if GROUPS == 1:
        return (q_sum,)
    WIDTH: tl.constexpr = D // GROUPS
    sums = ()
    for g in tl.static_range(GROUPS):
        c = g * WIDTH + tl.arange(0, WIDTH)
        x = tl.load(q_ptr + q_rows[:, None] + c[None, :], mask=row_ok[:, None], other=0.0)
        x = (x.to(tl.float32) * qk_scale).to(tl.float16 if FP16 else tl.float32)   # [R, WIDTH]
        sums = sums + (tl.sum(x.to(tl.float32), axis=1),)
    return sums


@triton.jit
def _query_half(q_ptr, q_rows, row_ok, qk_scale, coords, f: tl.constexpr, BITS: tl.constexpr, FP16: tl.constexpr):
    """q at coordinates `coords` of key field f, scaled and rounded as `_query_fields` makes its fields: [R, len]."""
    x = tl.load(q_ptr + q_rows[:, None] + coords[None, :], mask=row_ok[:, None], other=0.0)
    x = (x.to(tl.float32) * qk_scale).to(tl.float16 if FP16 else tl.float32)
    return x * (1.0 / (1 << (f * BITS)))                                            # exact power of two


@triton.jit
def _query_key_operands(q_ptr, q_rows, row_ok, qk_scale, qf, D: tl.constexpr, K_BITS: tl.constexpr,
                        WARPS: tl.constexpr, FP16: tl.constexpr):
    """The score dots' B operands, one per key field f and half h (`_key_halves`): q_f^T at the field's coordinates
    of byte parity h ([WARPS, KB / halves, R]), as `_query_fields` scales and rounds them (qf: its fields)."""
    KP: tl.constexpr = 8 // K_BITS
    KB: tl.constexpr = D // KP
    HALVES: tl.constexpr = _key_halves(D, K_BITS)
    R: tl.constexpr = row_ok.shape[0]
    half = tl.arange(0, KB // HALVES)
    q_t = ()
    for f in tl.static_range(KP):
        for h in tl.static_range(HALVES):
            if HALVES == 1:
                x = qf[f]                                                           # [R, KB]
            else:
                x = _query_half(q_ptr, q_rows, row_ok, qk_scale, f * KB + h + 2 * half, f, K_BITS, FP16)
            q_t = q_t + (tl.broadcast_to(tl.trans(x)[None, :, :], (WARPS, KB // HALVES, R)),)
    return q_t


@triton.jit
def _key_tile(kc_ptr, offs_n, stride_n, D: tl.constexpr, K_BITS: tl.constexpr):
    """One key tile of stored tokens offs_n [WARPS, BLOCK_W], loaded without a mask: [WARPS, BLOCK_W, KB] bytes, or
    [WARPS, BLOCK_W, KB / 2] 16-bit words where a field has two halves (`_key_halves`)."""
    KB: tl.constexpr = D * K_BITS // 8
    KH: tl.constexpr = _key_halves(D, K_BITS)
    if KH == 2:
        kw = tl.arange(0, KB // 2)
        words = kc_ptr.to(tl.pointer_type(tl.uint16)) + offs_n[:, :, None] * (stride_n // 2) + kw[None, None, :]
        tile = tl.load(words)
    else:
        kb = tl.arange(0, KB)
        tile = tl.load(kc_ptr + offs_n[:, :, None] * stride_n + kb[None, None, :])
    return tile


@triton.jit
def _history_warp_tiles(q_ptr, q_rows, row_ok, qk_scale, kc_ptr, ks_ptr, kz_ptr, vc_ptr, vs_ptr, vz_ptr,
                        start, end, stride_kcn, stride_ksn, stride_vcn, stride_vsn, part_o_ptr, part_lse_ptr, slot,
                        D: tl.constexpr, K_BITS: tl.constexpr, V_BITS: tl.constexpr, K_GROUP: tl.constexpr,
                        V_GROUP: tl.constexpr, BLOCK_N: tl.constexpr, WARPS: tl.constexpr, FP16: tl.constexpr,
                        ASM: tl.constexpr):
    """`_history_split` for per-token layouts with each tile cut into WARPS token sub-tiles, one per warp (the batch
    dim of 3-D dots), so that no value crosses warps inside the loop. Per sub-tile:
        S^T = sum_g s_g * (sum_{f in g} K_f [BLOCK_W, KB] @ q_f^T [KB, R] - z_g * sum(q_g))   (tokens: the MMA's M)
        O_f^T += V_f^T [VB, BLOCK_W] @ P'_g^T [BLOCK_W, R]   (P'_g = softmax weights x group g's value scale, fp16)
    with a [WARPS, R] running max / sum per sub-tile stream, merged across warps once after the loop. Both
    accumulators keep the query rows as the MMA's N, so the running max's rescale needs no data movement, and the
    value codes are loaded transposed ([VB, BLOCK_W] pointers) so that they stay in the cp.async pipeline. The
    fields are FIELD_TINY (no offset to subtract, no cancellation); TINY_SCALE is folded into the scales.
    Each tile's per-token (scale, zero) pairs are loaded one tile ahead. K_GROUP / V_GROUP: coordinates per
    (scale, zero) group, a multiple of the field width D * bits / 8 (D: one group, the single-group layout); the
    value helpers also serve V_GROUP narrower than a field (`_value_tiles`).
    """
    qf, q_sum = _query_fields(q_ptr, q_rows, row_ok, qk_scale, D, K_BITS, FP16)
    KG: tl.constexpr = D // K_GROUP                                                 # groups per token
    VG: tl.constexpr = D // V_GROUP
    BLOCK_W: tl.constexpr = BLOCK_N // WARPS
    R: tl.constexpr = row_ok.shape[0]
    q_sums = _query_group_sums(q_ptr, q_rows, row_ok, qk_scale, q_sum, D, KG, FP16)
    q_t = _query_key_operands(q_ptr, q_rows, row_ok, qk_scale, qf, D, K_BITS, WARPS, FP16)  # [WARPS, KB / KH, R]
    m_i, l_i, pz_sum, acc = _empty_streams(WARPS, R, D, V_BITS, V_GROUP)
    sub = tl.arange(0, WARPS)[:, None] * BLOCK_W + tl.arange(0, BLOCK_W)[None, :]   # [WARPS, BLOCK_W]
    k_meta = _group_meta(ks_ptr, kz_ptr, start + sub, start + sub < end, stride_ksn, KG)  # [WARPS, BLOCK_W, 2] each
    v_meta = _group_meta(vs_ptr, vz_ptr, start + sub, start + sub < end, stride_vsn, VG)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + sub
        # the next tile's metadata is loaded a whole tile ahead: its global latency hides behind this tile
        k_next = _group_meta(ks_ptr, kz_ptr, offs_n + BLOCK_N, offs_n + BLOCK_N < end, stride_ksn, KG)
        v_next = _group_meta(vs_ptr, vz_ptr, offs_n + BLOCK_N, offs_n + BLOCK_N < end, stride_vsn, VG)
        m_i, l_i, acc, pz_sum = _warp_tile(offs_n, end, n0 + BLOCK_N > end, q_t, q_sums, k_meta, v_meta, m_i, l_i,
                                           acc, pz_sum, kc_ptr, vc_ptr, stride_kcn, stride_vcn, D, K_BITS, V_BITS,
                                           K_GROUP, V_GROUP, FP16, ASM)
        k_meta, v_meta = k_next, v_next
    _store_warp_streams(m_i, l_i, pz_sum, acc, row_ok, slot, part_o_ptr, part_lse_ptr, D, V_BITS, V_GROUP)


@triton.jit
def _warp_tile(offs_n, end, partial, q_t, q_sums, k_meta, v_meta, m_i, l_i, acc, pz_sum, kc_ptr, vc_ptr, stride_kcn,
               stride_vcn, D: tl.constexpr, K_BITS: tl.constexpr, V_BITS: tl.constexpr, K_GROUP: tl.constexpr,
               V_GROUP: tl.constexpr, FP16: tl.constexpr, ASM: tl.constexpr):
    """One tile of `_history_warp_tiles`, tokens offs_n [WARPS, BLOCK_W] with their (scale, zero) k_meta / v_meta:
    the scores, the online-softmax step and the value dots -> the new m_i, l_i, acc, pz_sum. The code loads take no
    mask: a token from `end` on reads token end - 1 (always stored), and only a `partial` tile (the split's last,
    part of it past `end`) masks those tokens' scores, in a branch the other tiles skip (offline SASS per 128
    tokens, head_dim 128, those tiles: 589 -> 559 with 16 rows, 417 -> 394 with 8; `scripts/dev/decode_sass.py
    --layout int2-g16` / `--layout int2-wide`)."""
    KP: tl.constexpr = 8 // K_BITS
    KG: tl.constexpr = D // K_GROUP                                                 # groups per token
    K_FIELDS: tl.constexpr = KP // KG                                               # fields per group
    KH: tl.constexpr = _key_halves(D, K_BITS)
    clamped = tl.minimum(offs_n, end - 1)                                           # in bounds: no load masks
    packed = _key_tile(kc_ptr, clamped, stride_kcn, D, K_BITS)                     # [WARPS, BLOCK_W, KB / KH]
    for g in tl.static_range(KG):
        for f in tl.static_range(g * K_FIELDS + K_FIELDS - 1, g * K_FIELDS - 1, -1):
            for h in tl.static_range(KH):
                k = _half_field(packed, f, h, K_BITS, FP16, ASM)
                if f == g * K_FIELDS + K_FIELDS - 1 and h == 0:
                    dots = tl.dot(k, q_t[f * KH + h])
                else:
                    dots = tl.dot(k, q_t[f * KH + h], dots)                         # [WARPS, BLOCK_W, R]
        s, z = _split_meta(k_meta[g])                                               # [WARPS, BLOCK_W]
        scores = (dots * TINY_SCALE - q_sums[g][None, None, :] * z[:, :, None]) * s[:, :, None]
        if g == 0:
            qk = scores
        else:
            qk = qk + scores
    if partial:
        qk = tl.where((offs_n < end)[:, :, None], qk, float("-inf"))
    p, alpha, m_i, l_i = _warp_softmax_step(qk, m_i, l_i)
    tiles = _value_tiles(vc_ptr, clamped, stride_vcn, D, V_BITS, V_GROUP)
    acc, pz_sum = _value_step(acc, pz_sum, p, alpha, tiles, v_meta, D, V_BITS, V_GROUP, FP16, ASM)
    return m_i, l_i, acc, pz_sum


@triton.jit
def _empty_streams(WARPS: tl.constexpr, R: tl.constexpr, D: tl.constexpr, V_BITS: tl.constexpr,
                   V_GROUP: tl.constexpr, PAIRED: tl.constexpr = 1, WORDS: tl.constexpr = True):
    """The (warp, query row) softmax streams before any token: running max -inf and sum 0 [WARPS, PAIRED * R], per
    value group sum P' * zero [WARPS, PAIRED * R], per value field, row block and half (`_block_rows`) accumulator
    [WARPS, PAIRED * rows / halves, PAIRED * R] (PAIRED = 2: pairs.py's pair rows and block-diagonal columns).
    WORDS = False keeps byte tiles (one half) where `_block_rows` would take 16-bit words: pairs.py's value loop,
    whose callers pass it, reads the tile kind from the number of accumulators."""
    BLOCKS: tl.constexpr = _block_rows(D, V_BITS, V_GROUP, PAIRED)[0]
    ROWS: tl.constexpr = _block_rows(D, V_BITS, V_GROUP, PAIRED)[1]
    HALVES: tl.constexpr = _block_rows(D, V_BITS, V_GROUP, PAIRED)[2] if WORDS else 1
    pz_sum = ()
    for g in tl.static_range(D // V_GROUP):
        pz_sum = pz_sum + (tl.zeros((WARPS, PAIRED * R), tl.float32),)
    acc = ()
    for u in tl.static_range(8 // V_BITS * BLOCKS * HALVES):
        acc = acc + (tl.zeros((WARPS, PAIRED * ROWS // HALVES, PAIRED * R), tl.float32),)
    m_i = tl.full((WARPS, PAIRED * R), float("-inf"), tl.float32)
    return m_i, tl.zeros((WARPS, PAIRED * R), tl.float32), pz_sum, acc


@triton.jit
def _value_tiles(vc_ptr, offs_n, stride_n, D: tl.constexpr, V_BITS: tl.constexpr, V_GROUP: tl.constexpr):
    """One transposed value tile of stored tokens offs_n [WARPS, BLOCK_W], loaded without a mask: a tuple of code
    tiles per row block (`_block_rows`), transposed so that they stay in the cp.async pipeline: [WARPS, ROWS,
    BLOCK_W] bytes, or [WARPS, ROWS / 2, BLOCK_W] 16-bit words (bytes 2i and 2i + 1 of a token) where a block has two
    halves. Words reach the value MMA's A operand by 16-bit transposed matrix loads where bytes take one
    shared-memory load each."""
    BLOCKS: tl.constexpr = _block_rows(D, V_BITS, V_GROUP)[0]
    ROWS: tl.constexpr = _block_rows(D, V_BITS, V_GROUP)[1]
    HALVES: tl.constexpr = _block_rows(D, V_BITS, V_GROUP)[2]
    tiles = ()
    for j in tl.static_range(BLOCKS):
        rows = (j * ROWS) // HALVES + tl.arange(0, ROWS // HALVES)
        if HALVES == 2:
            words = vc_ptr.to(tl.pointer_type(tl.uint16)) + offs_n[:, None, :] * (stride_n // 2) + rows[None, :, None]
            tiles = tiles + (tl.load(words),)                                       # [WARPS, rows / 2, BLOCK_W]
        else:
            tiles = tiles + (tl.load(vc_ptr + offs_n[:, None, :] * stride_n + rows[None, :, None]),)  # [WARPS, rows, W]
    return tiles


@triton.constexpr_function
def _half_field_ptx(bits, f, h):
    """Inline PTX of `_half_field` (fp16), pack=2: input $1 holds two 16-bit words (tokens k and k + 1 of one row of
    the MMA's A operand), output $0 the fp16 pair (field f of byte h of each word, FIELD_TINY): one and.b32 of both
    lanes for the even bytes, a shift by 8 first for the odd ones (the bits it moves across lanes are masked)."""
    mask = (((1 << bits) - 1) << (f * bits)) * 0x10001
    if h == 0:
        return f"and.b32 $0, $1, {mask:#010x};"
    return "\n".join(["{", ".reg .b32 t;", "shr.b32 t, $1, 8;", f"and.b32 $0, t, {mask:#010x};", "}"])


@triton.jit
def _half_field(tile, f: tl.constexpr, h: tl.constexpr, BITS: tl.constexpr, FP16: tl.constexpr, ASM: tl.constexpr):
    """Field f of half h (the even bytes: 0, the odd: 1) of a tile's 16-bit words, as `_field` (FIELD_TINY) reads
    field f of bytes (on the GPU in inline PTX, `_half_field_ptx`); a byte tile (one half) is `_field` itself."""
    if tile.dtype != tl.uint16:
        return _field(tile, f, BITS, FP16, FIELD_TINY, ASM)
    if FP16:
        return tl.inline_asm_elementwise(_half_field_ptx(BITS, f, h), "=r,r", [tile], dtype=tl.float16,
                                         is_pure=True, pack=2)
    byte = (tile >> 8) & 0xFF if h == 1 else tile & 0xFF
    return _field(byte, f, BITS, FP16, FIELD_TINY, ASM)


@triton.jit
def _warp_softmax_step(qk, m_i, l_i):
    """One online-softmax step of every (warp, query row) stream: qk [WARPS, BLOCK_W, R] (masked -inf) ->
    p, alpha [WARPS, R], the new running max and sum."""
    m_new = tl.maximum(m_i, tl.max(qk, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)                                                   # [WARPS, R]
    p = tl.exp2(qk - m_safe[:, None, :])
    return p, alpha, m_new, l_i * alpha + tl.sum(p, axis=1)


@triton.jit
def _value_step(acc, pz_sum, p, alpha, tiles, v_meta, D: tl.constexpr, V_BITS: tl.constexpr, V_GROUP: tl.constexpr,
                FP16: tl.constexpr, ASM: tl.constexpr):
    """acc_u = alpha * acc_u + V_u^T @ P'_g for every field f and row block j (u = f * blocks + j) of one transposed
    value tile (`_value_tiles`), P'_g = p x the value scale of the block's group g (fp16); pz_sum_g = alpha *
    pz_sum_g + sum P'_g * zero_g."""
    VB: tl.constexpr = D * V_BITS // 8
    BLOCKS: tl.constexpr = _block_rows(D, V_BITS, V_GROUP)[0]
    ROWS: tl.constexpr = _block_rows(D, V_BITS, V_GROUP)[1]
    HALVES: tl.constexpr = _block_rows(D, V_BITS, V_GROUP)[2]
    dtype: tl.constexpr = tl.float16 if FP16 else tl.float32
    pv = ()
    new_pz = ()
    for g in tl.static_range(D // V_GROUP):
        s, z = _split_meta(v_meta[g])
        pv_g = (p * s[:, :, None]).to(dtype)                                        # [WARPS, BLOCK_W, R]
        pv = pv + (pv_g,)
        new_pz = new_pz + (pz_sum[g] * alpha + tl.sum(pv_g.to(tl.float32) * z[:, :, None], axis=1),)
    new_acc = ()
    for f in tl.static_range(8 // V_BITS):
        for j in tl.static_range(BLOCKS):
            group_pv = pv[(f * VB + j * ROWS) // V_GROUP]                          # the block's group
            for h in tl.static_range(HALVES):
                v = _half_field(tiles[j], f, h, V_BITS, FP16, ASM)                  # [WARPS, rows / halves, BLOCK_W]
                acc_u = acc[(f * BLOCKS + j) * HALVES + h]
                new_acc = new_acc + (tl.dot(v, group_pv, acc_u * alpha[:, None, :]),)
    return new_acc, new_pz


@triton.jit
def _store_warp_streams(m_i, l_i, pz_sum, acc, row_ok, slot, part_o_ptr, part_lse_ptr, D: tl.constexpr,
                        V_BITS: tl.constexpr, V_GROUP: tl.constexpr):
    """Merge the [WARPS, R] softmax streams of each query row; store the normalized o and the lse."""
    VB: tl.constexpr = D * V_BITS // 8
    BLOCKS: tl.constexpr = _block_rows(D, V_BITS, V_GROUP)[0]
    ROWS: tl.constexpr = _block_rows(D, V_BITS, V_GROUP)[1]
    HALVES: tl.constexpr = _block_rows(D, V_BITS, V_GROUP)[2]
    rows = tl.arange(0, ROWS // HALVES)
    m = tl.max(m_i, axis=0)                                                         # [R]
    weight = tl.exp2(m_i - tl.where(m == float("-inf"), 0.0, m)[None, :])           # [WARPS, R]
    l_safe = _store_lse(part_lse_ptr, slot, row_ok, m, tl.sum(l_i * weight, axis=0))
    for f in tl.static_range(8 // V_BITS):
        for j in tl.static_range(BLOCKS):
            pz = tl.sum(pz_sum[(f * VB + j * ROWS) // V_GROUP] * weight, axis=0)    # [R]
            for h in tl.static_range(HALVES):
                acc_u = acc[(f * BLOCKS + j) * HALVES + h]
                out = tl.sum(acc_u * weight[:, None, :], axis=0) * (TINY_SCALE / (1 << (f * V_BITS)))
                coords = f * VB + j * ROWS + HALVES * rows + h                      # [ROWS / HALVES]
                tl.store(part_o_ptr + slot[None, :] * D + coords[:, None], (out - pz[None, :]) / l_safe[None, :],
                         mask=row_ok[None, :])

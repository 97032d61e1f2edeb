"""TurboQuant's packed history on warp tiles (stage 1 of `kernels.turbo.decode`): each warp owns a token sub-tile, the
tokens are the score MMA's M and the value MMA's K, and nothing crosses warps inside the loop, as
kernels/decode/warp_tiles.py does for INT2.

A row's b-bit codes are one little-endian bit stream in which every 8 codes fill one b-byte word: word g (bytes
g*b .. g*b + b-1, as an int32) holds coordinates 8g .. 8g + 7, code j at bits b*j. So no code is cut out of a byte it
shares with another word: field j of every word (coordinates 8g + j) is one shift and one AND, the same for every row.
A key row's words come from aligned 16- / 32-bit loads (`_aligned_words`: its rows start 4-byte aligned, which
`check_turbo_inputs` asks); a value row's are joined from its bytes (`_words`), so that its fields reach the MMA
layout as bytes. On an H200 the keys' aligned loads took 0.72-1.00x the time of byte joins (median 0.93 / 0.83 /
0.75 at head_dim 64 / 128 / 256); aligned loads for the values as well were 1.13-1.46x slower: their fields then
reached the MMA through 16-bit shared-memory moves (results/bench/bench_formats_turbo_words_h200.md). Chunk j (the K of
one dot) is field j of the W = D / 8 words, padded with zero rows to KC = max(W, 16) (the MMA's 16 at head_dim 64: its
padding costs unpacking, not bytes).

Keys never materialise as vectors: a chunk's codes pick their centroids (on the GPU up to 3 bits a byte-table lookup
in inline PTX, `_centroid_ptx`; otherwise a tree of selects on the code's bits), and
    q.k_n = (norm_n / |c_n|) * sum_j centroids_j(K_n) [BLOCK_W, KC] @ q_j^T [KC, R]      (q_j: q at coordinates 8g + j)
with |c_n|^2 a dot of the same centroids squared against ones (norm correction). Values keep their codes, exact
(INT2's `_field` with FIELD_TINY: 2^-24 * code, fp16 subnormals on the GPU; the 2^24 returns at the store), and fold
scale and zero as INT2 does:
    O_j^T += codes_j(V)^T [KC, BLOCK_W] @ (P * s)^T [BLOCK_W, R],    minus sum_n p_n s_n z_n at the store.
"""
from __future__ import annotations

import triton
import triton.language as tl

from kernels.decode.common import FIELD_TINY, TINY_SCALE, _store_lse
from kernels.decode.packed import _field, _load_token_meta, _split_meta
from kernels.decode.warp_tiles import _warp_softmax_step


@triton.jit
def _centroid_table(cent_ptr, LEVELS: tl.constexpr):
    """The codebook's LEVELS centroids as a tuple of fp32 scalars."""
    table = ()
    for i in tl.static_range(LEVELS):
        table = table + (tl.load(cent_ptr + i).to(tl.float32),)
    return table


@triton.jit
def _centroids(codes, table, BITS: tl.constexpr):
    """table[codes] (fp32): a binary tree of selects on the code's bits, lowest bit first (2^BITS - 1 selects and
    BITS bit tests per code)."""
    level = table
    for bit in tl.static_range(BITS):
        on = (codes & (1 << bit)) != 0
        picked = ()
        for i in tl.static_range((1 << BITS) >> (bit + 1)):
            picked = picked + (tl.where(on, level[2 * i + 1], level[2 * i]),)
        level = picked
    return level[0]


@triton.constexpr_function
def _centroid_ptx(byte_table):
    """Inline PTX of a 3-bit (or 2-bit) centroid lookup, pack=4: input $2 holds 4 codes, one per byte (b0 lowest);
    outputs $0 = fp16 pair (c[b0], c[b1]), $1 = (c[b2], c[b3]), element 2j in the low half of $j.

    byte_table = (lo bytes of the fp16 centroids 0-3, of 4-7, hi bytes of 0-3, of 4-7). prmt.b32 picks, per output
    byte, one of its two sources' 8 bytes by a selector nibble: x | x >> 4 puts b0 and b1 in the low two nibbles
    (a code < 8 leaves the nibble's sign-mode bit clear), >> 16 of that b2 and b3; the low and the high bytes of
    two centroids are picked apart and interleaved by a third prmt (selector 0x5140)."""
    lo_a, lo_b, hi_a, hi_b = byte_table
    lines = ["{", ".reg .b32 s01, s23, la, lb, ha, hb, p, q;",
             f"mov.b32 la, {lo_a:#010x};", f"mov.b32 lb, {lo_b:#010x};",
             f"mov.b32 ha, {hi_a:#010x};", f"mov.b32 hb, {hi_b:#010x};",
             "shr.b32 s01, $2, 4;", "or.b32 s01, s01, $2;", "shr.b32 s23, s01, 16;"]
    for out, sel in (("$0", "s01"), ("$1", "s23")):
        lines += [f"prmt.b32 p, la, lb, {sel};", f"prmt.b32 q, ha, hb, {sel};", f"prmt.b32 {out}, p, q, 0x5140;"]
    return "\n".join(lines + ["}"])


@triton.jit
def _key_centroids(codes, table, BITS: tl.constexpr, BYTE_TABLE: tl.constexpr, FP16: tl.constexpr):
    """Centroids of codes in the dot dtype: on the GPU up to 3 bits a byte-table lookup in inline PTX
    (`_centroid_ptx`, 3 instructions per code against 2^BITS - 1 selects); otherwise `_centroids`, rounded."""
    if FP16 and BITS <= 3:
        vals = tl.inline_asm_elementwise(_centroid_ptx(BYTE_TABLE), "=r,=r,r", [codes.to(tl.uint8)],
                                         dtype=tl.float16, is_pure=True, pack=4)
    else:
        vals = _centroids(codes, table, BITS).to(tl.float16 if FP16 else tl.float32)
    return vals


@triton.jit
def _words(c_ptr, tok, ok, word, stride_n, BITS: tl.constexpr):
    """The words (8 codes in BITS bytes, little-endian; int32) number `word` of token rows `tok` (masked by ok; the
    three broadcast to the result's shape), joined from their bytes."""
    ptrs = c_ptr + tok * stride_n + word * BITS
    words = tl.load(ptrs, mask=ok, other=0).to(tl.int32)
    for k in tl.static_range(1, BITS):
        words = words | (tl.load(ptrs + k, mask=ok, other=0).to(tl.int32) << (8 * k))
    return words


@triton.jit
def _aligned_words(c_ptr, tok, stride_n, KC: tl.constexpr, WORDS: tl.constexpr, BITS: tl.constexpr):
    """Words 0 .. KC - 1 (8 codes in BITS bytes, little-endian; int32) of the stored token rows tok [W, BLOCK_W, 1]
    (words from WORDS on are padding, 0): [W, BLOCK_W, KC]. Rows start 4-byte aligned
    (`check_turbo_inputs`), so a 2- or 4-byte word is one load, and every 4 words of 3 bytes are three uint32 loads
    u0, u1, u2: (u0, u0 >> 24 | u1 << 8, u1 >> 16 | u2 << 16, u2 >> 8), their bits above the 24th left for the
    field shifts to drop."""
    if BITS == 3:
        m = tl.arange(0, KC // 4)[None, None, :]                                    # 4 words per 12 bytes
        m_ok = m < WORDS // 4
        u = c_ptr.to(tl.pointer_type(tl.uint32)) + tok * (stride_n // 4) + 3 * m
        u0 = tl.load(u, mask=m_ok, other=0)
        u1 = tl.load(u + 1, mask=m_ok, other=0)
        u2 = tl.load(u + 2, mask=m_ok, other=0)
        pairs = tl.join(tl.join(u0, (u1 >> 16) | (u2 << 16)), tl.join((u0 >> 24) | (u1 << 8), u2 >> 8))
        words = tl.reshape(pairs, (u0.shape[0], u0.shape[1], KC))                   # word 4m + 2a + b at [m, a, b]
    else:
        word = tl.arange(0, KC)[None, None, :]
        unit: tl.constexpr = tl.uint16 if BITS == 2 else tl.uint32
        ptrs = c_ptr.to(tl.pointer_type(unit)) + tok * (stride_n // BITS) + word
        words = tl.load(ptrs, mask=word < WORDS, other=0).to(tl.uint32)
    return words.to(tl.int32, bitcast=True)


@triton.jit
def _query_chunks(q_ptr, q_rows, row_ok, qk_scale, word, word_ok, WARPS: tl.constexpr, FP16: tl.constexpr):
    """q times qk_scale at each chunk's coordinates 8 * word + j (0 on padding rows), as the score dots' B operands:
    a tuple of 8 [WARPS, KC, R] tensors in the dot dtype."""
    chunks = ()
    for j in tl.static_range(8):
        x = tl.load(q_ptr + q_rows[:, None] + (8 * word + j)[None, :], mask=row_ok[:, None] & word_ok[None, :],
                    other=0.0)
        x = (x.to(tl.float32) * qk_scale).to(tl.float16 if FP16 else tl.float32)      # [R, KC]
        chunks = chunks + (tl.broadcast_to(tl.trans(x)[None, :, :], (WARPS, x.shape[1], x.shape[0])),)
    return chunks


@triton.jit
def _key_scores(kc_ptr, offs_n, norm, stride_kcn, q_t, table, word, word_ok, D: tl.constexpr,
                BITS: tl.constexpr, BYTE_TABLE: tl.constexpr, NORM_CORRECTION: tl.constexpr, FP16: tl.constexpr):
    """Logits [WARPS, BLOCK_W, R] of one key sub-tile per warp (stored tokens offs_n [WARPS, BLOCK_W], loaded without
    a token mask; their fp32 norms): (norm / |c|) * sum over chunks of centroids @ q_j^T, unmasked (the caller masks
    tokens outside its split). |c|^2 is a dot too: the squared centroids against ones (0 on padding rows), so that
    it lands in the scores' layout, every column the same sum."""
    words = _aligned_words(kc_ptr, offs_n[:, :, None], stride_kcn, word.shape[0], D // 8, BITS)  # [WARPS, BLOCK_W, KC]
    ones = tl.broadcast_to(word_ok[None, :, None], q_t[0].shape).to(q_t[0].dtype)  # [WARPS, KC, R]
    for c in tl.static_range(len(q_t)):
        cent = _key_centroids((words >> (BITS * c)) & ((1 << BITS) - 1), table, BITS, BYTE_TABLE, FP16)
        if c == 0:
            dots = tl.dot(cent, q_t[c])                                             # [WARPS, BLOCK_W, R]
            squares = tl.dot(cent * cent, ones)
        else:
            dots = tl.dot(cent, q_t[c], dots)
            squares = tl.dot(cent * cent, ones, squares)
    factor = norm[:, :, None]
    if NORM_CORRECTION:
        factor = factor / tl.sqrt(squares)
    return dots * factor


@triton.jit
def _value_step(acc, pz_sum, p, alpha, vc_ptr, offs_n, v_meta, stride_vcn, word, word_ok, BITS: tl.constexpr,
                FP16: tl.constexpr):
    """acc_c = alpha * acc_c + codes_c^T @ (p * s) for every chunk c of one value sub-tile per warp (stored tokens
    offs_n, loaded without a token mask); pz_sum = alpha * pz_sum + sum p * s * z."""
    dtype: tl.constexpr = tl.float16 if FP16 else tl.float32
    s, z = _split_meta(v_meta)                                                      # [WARPS, BLOCK_W]
    pv = (p * s[:, :, None]).to(dtype)                                              # [WARPS, BLOCK_W, R]
    pz_sum = pz_sum * alpha + tl.sum(pv.to(tl.float32) * z[:, :, None], axis=1)
    words = _words(vc_ptr, offs_n[:, None, :], word_ok[None, :, None], word[None, :, None], stride_vcn,
                   BITS)                                                            # [WARPS, KC, BLOCK_W]
    new_acc = ()
    for c in tl.static_range(len(acc)):                                              # field c of every word
        vals = _field(words >> (BITS * c), 0, BITS, FP16, FIELD_TINY, False)            # [WARPS, KC, BLOCK_W]
        new_acc = new_acc + (tl.dot(vals, pv, acc[c] * alpha[:, None, :]),)
    return new_acc, pz_sum


@triton.jit
def _store_streams(m_i, l_i, pz_sum, acc, word, word_ok, row_ok, slot, part_o_ptr, part_lse_ptr, D: tl.constexpr,
                   FP16: tl.constexpr):
    """Merge the [WARPS, R] softmax streams of each query row; store the normalized o (chunk j's row i at coordinate
    8 * word[i] + j, padding rows not) and the lse."""
    m = tl.max(m_i, axis=0)                                                         # [R]
    weight = tl.exp2(m_i - tl.where(m == float("-inf"), 0.0, m)[None, :])           # [WARPS, R]
    l_safe = _store_lse(part_lse_ptr, slot, row_ok, m, tl.sum(l_i * weight, axis=0))
    pz = tl.sum(pz_sum * weight, axis=0)                                            # [R]
    for c in tl.static_range(len(acc)):
        out = tl.sum(acc[c] * weight[:, None, :], axis=0) * TINY_SCALE                   # [KC, R]
        tl.store(part_o_ptr + slot[None, :] * D + (8 * word + c)[:, None], (out - pz[None, :]) / l_safe[None, :],
                 mask=word_ok[:, None] & row_ok[None, :])


@triton.jit
def _turbo_warp_tiles(q_ptr, q_rows, row_ok, qk_scale, kc_ptr, kn_ptr, vc_ptr, vs_ptr, vz_ptr, cent_ptr,
                      start, end, stride_kcn, stride_knn, stride_vcn, stride_vsn, part_o_ptr, part_lse_ptr, slot,
                      D: tl.constexpr, K_BITS: tl.constexpr, V_BITS: tl.constexpr, KC: tl.constexpr,
                      BYTE_TABLE: tl.constexpr, NORM_CORRECTION: tl.constexpr, BLOCK_N: tl.constexpr,
                      WARPS: tl.constexpr, FP16: tl.constexpr):
    """Online softmax over TurboQuant history tokens [start, end) of one KV head, a BLOCK_N / WARPS token sub-tile per
    warp with a [WARPS, R] running max / sum per sub-tile stream, merged across warps after the loop; stores o and
    lse. The key norms and the value (scale, zero) pairs are loaded one tile ahead. The code loads take no token
    mask (a token from `end` on reads token end - 1, always stored; its norm and value scale load as 0), and only a
    split's last tile, part of it past `end`, masks scores, in a branch the other tiles skip (H200: 0.87-0.98x the time
    at head_dim 64 and 128, batch 8-32 / 32k-100k, results/bench/bench_formats_whole_tiles_h200.md)."""
    BLOCK_W: tl.constexpr = BLOCK_N // WARPS
    R: tl.constexpr = row_ok.shape[0]
    word = tl.arange(0, KC)                                                         # [KC] a chunk's rows
    word_ok = word < D // 8                                                         # the rest pads to the MMA's 16
    q_t = _query_chunks(q_ptr, q_rows, row_ok, qk_scale, word, word_ok, WARPS, FP16)
    table = _centroid_table(cent_ptr, 1 << K_BITS)
    m_i = tl.full((WARPS, R), float("-inf"), tl.float32)
    l_i = tl.zeros((WARPS, R), tl.float32)
    pz_sum = tl.zeros((WARPS, R), tl.float32)
    acc = ()
    for c in tl.static_range(8):
        acc = acc + (tl.zeros((WARPS, KC, R), tl.float32),)
    sub = tl.arange(0, WARPS)[:, None] * BLOCK_W + tl.arange(0, BLOCK_W)[None, :]   # [WARPS, BLOCK_W]
    norm = tl.load(kn_ptr + (start + sub) * stride_knn, mask=start + sub < end, other=0.0).to(tl.float32)
    v_meta = _load_token_meta(vs_ptr, vz_ptr, start + sub, start + sub < end, stride_vsn)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + sub
        clamped = tl.minimum(offs_n, end - 1)                                       # in bounds: no load masks
        ahead = offs_n + BLOCK_N
        norm_next = tl.load(kn_ptr + ahead * stride_knn, mask=ahead < end, other=0.0).to(tl.float32)
        v_next = _load_token_meta(vs_ptr, vz_ptr, ahead, ahead < end, stride_vsn)
        qk = _key_scores(kc_ptr, clamped, norm, stride_kcn, q_t, table, word, word_ok, D, K_BITS, BYTE_TABLE,
                         NORM_CORRECTION, FP16)                                     # [WARPS, BLOCK_W, R]
        if n0 + BLOCK_N > end:                                                      # the split's last tile
            qk = tl.where((offs_n < end)[:, :, None], qk, float("-inf"))
        p, alpha, m_i, l_i = _warp_softmax_step(qk, m_i, l_i)
        acc, pz_sum = _value_step(acc, pz_sum, p, alpha, vc_ptr, clamped, v_meta, stride_vcn, word, word_ok,
                                  V_BITS, FP16)
        norm, v_meta = norm_next, v_next
    _store_streams(m_i, l_i, pz_sum, acc, word, word_ok, row_ok, slot, part_o_ptr, part_lse_ptr, D, FP16)

"""Triton decode attention over a packed low-bit history plus a full-precision segment.

Two launches (flash-decoding):
* stage 1, grid `(S_hist + S_fp, B * H_kv, row blocks)`: program (s, b*H_kv + h, r) owns query rows
  16r..16r+15 of KV head h (its GROUP query heads x T_q tokens, head-major; one block for a decode step
  up to GQA 16; a chunk of T_q tokens takes more; 16-row blocks are the only row tile verified on
  the GPU: 64-row tiles gave wrong or NaN results there on a 200-token history, while the interpreter
  was right). Splits s < S_hist walk 1/S_hist
  of the sequence's packed history in BLOCK_N-token tiles. Each tile's bytes are loaded once
  ([BLOCK_N, D*bits/8], coalesced, software-pipelined) and never reshaped: with p codes per byte,
  "field" f of every byte (bits f*b..f*b+b-1, coordinates f*D/p + j) is masked in place, no shifts or
  int->float conversions: for the single-group token layout the masked bits read as fp16 are the exact
  subnormal 2^-24 * 2^(f*b) * code (FIELD_TINY, one AND per fp16 pair), otherwise they are OR-ed into
  the mantissa of 1024.0 and the 1024 subtracted (FIELD_EXACT; `DecodeConfig.asm_unpack` does either in
  inline PTX, one instruction per pair and field where ptxas emits two). Scores are sum_f q_f @ field_f^T
  (q_f = q's f-th column block times 2^(-f*b)), chained in one fp32 accumulator; values keep one
  accumulator per field. For the single-group token layout the per-token (scale, zero) are folded around
  the dots instead of dequantizing elements (and 2^24 into the scales):
      q.k_n = s_n * (q.c_n - z_n * sum(q)),    sum_n p_n v_n = sum_n (p_n s_n) c_n - sum_n p_n s_n z_n.
  With `DecodeConfig.warp_tiles` (the GPU default at every grid size) that layout runs `_history_warp_tiles`:
  each warp owns a token sub-tile, the tokens are the score MMA's M (no padded query rows), and nothing
  crosses warps inside the loop.
  Grouped token layouts and the KIVI channel layout dequantize each field instead.
  Splits s >= S_hist attend to the fp segment (BF16 sink + recent) with the causal rule for the
  T_q new tokens. Each split stores its normalized partial output and base-2 log-sum-exp.
* stage 2, grid `(B * H_kv, GROUP * T_q)`: log-sum-exp merge of all splits into `out`.

The number of history splits fills the GPU (`DecodeConfig.programs_per_sm` programs per SM), with at
least `min_split_tiles` tiles per split. On the GPU the dot operands are fp16 (fp32 accumulation);
under TRITON_INTERPRET everything is fp32 and matches `decode_attention_reference` to ~1e-6.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
import triton
import triton.language as tl

from kernels.dispatch import interpreter_forced
from kernels.reference import check_decode_inputs
from kernels.format import QuantSpec

HEAD_DIMS = (64, 128, 256)
MAX_ROWS = 128            # GROUP * T_q query rows per KV head
ROW_BLOCK = 16            # query rows per program (the MMA's M)
WARP_TILE_ROWS = 8        # query rows per program with DecodeConfig.warp_tiles (the MMA's N), up to GQA 8
TOKEN, TOKEN_GROUPED, CHANNEL = 0, 1, 2
LOG2E = 1.4426950408889634
FIELD_EXACT, FIELD_TINY = tl.constexpr(0), tl.constexpr(1)  # `_field` modes
TINY_SCALE = tl.constexpr(16777216.0)  # 2^24: FIELD_TINY values are 2^-24 * 2^(f*bits) * code


@dataclass(frozen=True)
class DecodeConfig:
    """Tile sizes and launch parameters of stage 1."""

    block_n: int = 128        # history tokens per tile
    block_f: int = 64         # fp-segment tokens per tile
    num_warps: int = 4
    num_stages: int = 3
    programs_per_sm: int = 8  # split target when B*H_kv < #SMs (half of it for larger batches)
    min_split_tiles: int = 4  # never split below this many tiles per program
    maxnreg: int | None = None  # register cap per thread (None: the compiler's choice); GPU only
    asm_unpack: bool = False  # unpack the packed fields in inline PTX (`_field_ptx`); GPU only
    merge_block: int = 16     # splits merged per iteration of stage 2
    warp_tiles: bool = False  # single-group token layouts: one token sub-tile per warp (`_history_warp_tiles`)


def is_small_grid(units: int, sms: int) -> bool:
    """At most one (sequence, KV head) unit per 8 SMs (batch 1-2 at 8 KV heads on an H100): `default_config`'s
    small_grid tiles (at batch 8 they were slower than the large-grid ones, sweep_decode_splits.md)."""
    return units <= sms // 8


def default_config(head_dim: int, on_gpu: bool, small_grid: bool = False, single_group: bool = True) -> DecodeConfig:
    """Fixed heuristic table (no autotune: it does not run under the interpreter).

    single_group: both K and V are single-group token layouts (`single_group_layouts`), the ones warp tiles
    serve. Other layouts (KIVI's per-channel keys, grouped INT4) take the row-major loop, whose large-grid tile
    stays at 128 tokens with the inline-PTX unpack: at 256 tokens and 3 stages its pipeline buffers need
    323 KB of shared memory at head_dim 128 (H100: 227 KB).

    small_grid: very few (sequence, KV head) units (`is_small_grid`). There two pipeline stages with a
    128-register cap were 11-16 % faster at batch 1 / 128k and slower at batch 32, 4 programs per SM a further
    3-5 % at batch 1 (H100 sweeps: results/bench/sweep_decode_tiles.md, sweep_decode_splits.md and their git
    history), merge_block=64 up to 10 % at batch 1 and neutral elsewhere. Warp tiles beat the row-major loop
    everywhere on single-group layouts once the values became the MMA's A operand: 9 % less time at batch 1 /
    128k (128-token tiles), 17 % at 8 / 32k and 37 % at 32 / 100k (256-token tiles; sweep_decode_tiles.md).
    There a 168-register cap (3 blocks per SM instead of 2) saves a further 4-6 %, 32-token fp-segment tiles
    1-2 %. Rescaling only when a running max grows was slower (it needs a block barrier). asm_unpack (inline
    PTX) stopped paying once single-group fields became FIELD_TINY (ptxas emits one LOP3 per pair itself; 0-3 %
    slower in the final sweep): off for those, kept in the large-grid row-major tile of the other layouts.
    """
    if not on_gpu:
        return DecodeConfig(block_n=64, block_f=32, num_warps=4, num_stages=1)
    if head_dim > 128:
        return DecodeConfig(block_n=64, block_f=32, num_warps=8, num_stages=2, merge_block=64)
    if small_grid:
        return DecodeConfig(block_n=128, block_f=64, num_warps=4, num_stages=2, maxnreg=128, merge_block=64,
                            programs_per_sm=4, warp_tiles=True)
    if not single_group:
        return DecodeConfig(block_n=128, block_f=64, num_warps=4, num_stages=3, asm_unpack=True, merge_block=64)
    return DecodeConfig(block_n=256, block_f=32, num_warps=4, num_stages=3, maxnreg=168, merge_block=64,
                        warp_tiles=True)


@triton.constexpr_function
def _field_ptx(bits, f, mode):
    """Inline PTX of `_field` (fp16) for one pack=4 block: input $2 holds 4 packed bytes b0..b3 (element k
    = byte k, b0 lowest); outputs $0 = fp16 pair (b0, b1), $1 = (b2, b3), element 2j in the low half of $j.

    prmt.b32 with selector 0x4140 / 0x4342 and a zero second source zero-extends b0, b1 / b2, b3 into the
    two 16-bit lanes. FIELD_TINY: one and.b32 per pair keeps field f of each lane, which read as fp16 is the
    subnormal 2^-24 * 2^(f*bits) * code (the byte's 8 bits fit the 10-bit mantissa; H100 tensor cores keep
    fp16 subnormals). FIELD_EXACT: one lop3.b32 (a & b) | c (LUT 0xEA) per pair also ORs in 1024.0 (0x6400),
    the exact fp16 1024 + 2^(f*bits) * code, and one sub.f16x2 per pair removes the 1024 exactly.
    """
    mask = (((1 << bits) - 1) << (f * bits)) * 0x10001                     # field f in both lanes
    lines = ["{", ".reg .b32 b01, b23, magic;", "mov.b32 magic, 0x64006400;",
             "prmt.b32 b01, $2, 0, 0x4140;", "prmt.b32 b23, $2, 0, 0x4342;"]
    for out, lanes in (("$0", "b01"), ("$1", "b23")):
        if mode == FIELD_TINY:
            lines.append(f"and.b32 {out}, {lanes}, {mask:#010x};")
            continue
        lines.append(f"lop3.b32 {out}, {lanes}, {mask:#010x}, magic, 0xea;")
        lines.append(f"sub.f16x2 {out}, {out}, magic;")
    return "\n".join(lines + ["}"])


@triton.jit
def _field(packed, f: tl.constexpr, BITS: tl.constexpr, FP16: tl.constexpr, MODE: tl.constexpr,
           ASM: tl.constexpr):
    """Field f of every packed byte as exact floats 2^(f*BITS) * code (FIELD_EXACT), or times 2^-24
    (FIELD_TINY: fp16 subnormals, no offset to remove; the caller scales the dot products back by TINY_SCALE).

    The masked field is itself the subnormal's mantissa, or is OR-ed into the mantissa of 1024.0 (fp16) or 2^23
    (fp32) and the offset subtracted: no shifts and no int->float conversions (those issue at 1/8 of the FP32
    rate on Hopper). ptxas emits the fp16 AND and OR as two LOP3s per pair of values; ASM (fp16 only)
    runs `_field_ptx` instead, one single-output block per field (ptxas shares the byte-spreading PRMTs
    between the fields' blocks).
    """
    MASK: tl.constexpr = ((1 << BITS) - 1) << (f * BITS)
    if FP16 and ASM:
        vals = tl.inline_asm_elementwise(_field_ptx(BITS, f, MODE), "=r,=r,r", [packed],
                                         dtype=tl.float16, is_pure=True, pack=4)
    elif FP16 and MODE == FIELD_TINY:
        vals = (packed & MASK).to(tl.int16).to(tl.float16, bitcast=True)
    elif FP16:
        vals = (((packed & MASK).to(tl.int16) | 0x6400).to(tl.int16)).to(tl.float16, bitcast=True) - 1024.0
    else:
        vals = ((packed & MASK).to(tl.int32) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
        if MODE == FIELD_TINY:
            vals = vals * (1.0 / TINY_SCALE)
    return vals


@triton.jit
def _dequant_field(vals, s_ptr, z_ptr, tok, coord, ok, stride_n, f: tl.constexpr, BITS: tl.constexpr,
                   GROUP: tl.constexpr, LAYOUT: tl.constexpr):
    """2^(f*BITS) * code -> 2^(f*BITS) * (code - zero) * scale, with grouped-token or channel metadata."""
    if LAYOUT == 2:
        meta = (tok // GROUP) * stride_n + coord
    else:
        meta = tok * stride_n + coord // GROUP
    s = tl.load(s_ptr + meta, mask=ok, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + meta, mask=ok, other=0.0).to(tl.float32)
    return vals * s.to(vals.dtype) - (z * s * (1 << (f * BITS))).to(vals.dtype)


@triton.jit
def _load_token_meta(s_ptr, z_ptr, offs_n, mask_n, stride_n):
    """Per-token (scale, zero) as one [..., 2] tensor in their stored dtype, so that moving them into the MMA's
    layout takes one shared-memory round trip and barrier, not two."""
    which = tl.arange(0, 2)
    ptrs = tl.where(which == 0, s_ptr, z_ptr) + tl.expand_dims(offs_n * stride_n, -1)
    return tl.load(ptrs, mask=tl.expand_dims(mask_n, -1), other=0.0)


@triton.jit
def _prefetch_meta(s_ptr, z_ptr, offs_n, end, stride_n, LAYOUT: tl.constexpr):
    """`_load_token_meta` of tokens offs_n < end for the single-group token layout; a placeholder otherwise
    (grouped and channel layouts load their metadata per field)."""
    if LAYOUT == 0:
        return _load_token_meta(s_ptr, z_ptr, offs_n, offs_n < end, stride_n)
    return tl.zeros((offs_n.shape[0], 2), s_ptr.dtype.element_ty)


@triton.jit
def _split_meta(meta):
    """[..., 2] stored (scale, zero) -> fp32 scale, zero (as masked sums over the pair: unlike tl.split, they
    stay in the layout the pair was moved to, with no second shared-memory round trip)."""
    meta = meta.to(tl.float32)
    first = tl.arange(0, 2) == 0
    return tl.sum(tl.where(first, meta, 0.0), axis=-1), tl.sum(tl.where(first, 0.0, meta), axis=-1)


@triton.jit
def _query_fields(q_ptr, q_rows, row_ok, qk_scale, D: tl.constexpr, BITS: tl.constexpr, FP16: tl.constexpr):
    """q split like the packed keys: field f = q[:, f*NB:(f+1)*NB] * 2^(-f*BITS), [BLOCK_R, NB] each.

    Field f of the codes is 2^(f*BITS) * code (times 2^-24 as FIELD_TINY), so sum_f q_f @ field_f = q . codes
    (times 2^-24). Also returns sum(q) for the zero points.
    """
    P: tl.constexpr = 8 // BITS
    NB: tl.constexpr = D // P
    nb = tl.arange(0, NB)
    fields = ()
    q_sum = tl.zeros(row_ok.shape, tl.float32)                                     # [BLOCK_R]
    for f in tl.static_range(P):
        x = tl.load(q_ptr + q_rows[:, None] + f * NB + nb[None, :], mask=row_ok[:, None], other=0.0)
        x = (x.to(tl.float32) * qk_scale).to(tl.float16 if FP16 else tl.float32)   # [BLOCK_R, NB]
        q_sum += tl.sum(x.to(tl.float32), axis=1)
        fields = fields + (x * (1.0 / (1 << (f * BITS))),)                          # exact power of two
    return fields, q_sum


@triton.jit
def _scores(q_fields, q_sum, c_ptr, s_ptr, z_ptr, meta, offs_n, mask_n, stride_cn, stride_sn,
            D: tl.constexpr, BITS: tl.constexpr, LAYOUT: tl.constexpr, GROUP: tl.constexpr,
            FP16: tl.constexpr, ASM: tl.constexpr):
    """Logits [BLOCK_R, BLOCK_N] of one packed K tile: sum_f q_f @ field_f^T in one fp32 accumulator.
    meta: the tile's `_load_token_meta` (single-group layout); other layouts load their metadata here."""
    P: tl.constexpr = 8 // BITS
    NB: tl.constexpr = D // P
    nb = tl.arange(0, NB)
    packed = tl.load(c_ptr + offs_n[:, None] * stride_cn + nb[None, :], mask=mask_n[:, None], other=0)
    packed = tl.trans(packed)                                                      # [NB, BLOCK_N]
    for f in tl.static_range(P - 1, -1, -1):
        k = _field(packed, f, BITS, FP16, FIELD_TINY if LAYOUT == 0 else FIELD_EXACT, ASM)
        if LAYOUT != 0:
            k = _dequant_field(k, s_ptr, z_ptr, offs_n[None, :], f * NB + nb[:, None], mask_n[None, :],
                               stride_sn, f, BITS, GROUP, LAYOUT)
        if f == P - 1:
            qk = tl.dot(q_fields[f], k)
        else:
            qk = tl.dot(q_fields[f], k, qk)
    if LAYOUT == 0:  # q.(c - z) * s
        s, z = _split_meta(meta)
        qk = (qk * TINY_SCALE - q_sum[:, None] * z[None, :]) * s[None, :]
    return qk


@triton.jit
def _accumulate_values(acc, p, alpha, pz_sum, c_ptr, s_ptr, z_ptr, meta, offs_n, mask_n, stride_cn, stride_sn,
                       D: tl.constexpr, BITS: tl.constexpr, LAYOUT: tl.constexpr, GROUP: tl.constexpr,
                       FP16: tl.constexpr, ASM: tl.constexpr):
    """acc_f = alpha * acc_f + p' @ field_f for every field of one packed V tile.

    Single-group token layout (meta: the tile's `_load_token_meta`): p' = p * scale (per token) and the
    running pz_sum = sum p' * zero
    lets the epilogue remove the zero points; the fields are FIELD_TINY there (the epilogue scales by
    TINY_SCALE). Other layouts dequantize exact fields.
    """
    P: tl.constexpr = 8 // BITS
    NB: tl.constexpr = D // P
    nb = tl.arange(0, NB)
    packed = tl.load(c_ptr + offs_n[:, None] * stride_cn + nb[None, :], mask=mask_n[:, None], other=0)
    dtype: tl.constexpr = tl.float16 if FP16 else tl.float32
    if LAYOUT == 0:
        s, z = _split_meta(meta)
        pv = (p * s[None, :]).to(dtype)                                            # [BLOCK_R, BLOCK_N]
        pz_sum = pz_sum * alpha + tl.sum(pv.to(tl.float32) * z[None, :], axis=1)
    else:
        pv = p.to(dtype)
    new_acc = ()
    for f in tl.static_range(P):
        v = _field(packed, f, BITS, FP16, FIELD_TINY if LAYOUT == 0 else FIELD_EXACT, ASM)  # [BLOCK_N, NB]
        if LAYOUT != 0:
            v = _dequant_field(v, s_ptr, z_ptr, offs_n[:, None], f * NB + nb[None, :], mask_n[:, None],
                               stride_sn, f, BITS, GROUP, LAYOUT)
        new_acc = new_acc + (tl.dot(pv, v, acc[f] * alpha[:, None]),)
    return new_acc, pz_sum


@triton.jit
def _softmax_step(qk, m_i, l_i):
    """One base-2 online-softmax step; rows with no valid key so far stay at m=-inf, l=0."""
    m_new = tl.maximum(m_i, tl.max(qk, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(qk - m_safe[:, None])                                              # [BLOCK_R, BLOCK_N]
    return p, alpha, m_new, l_i * alpha + tl.sum(p, axis=1)


@triton.jit
def _split_bounds(lo, hi, split, n_splits, BLOCK: tl.constexpr):
    """[start, end) of this split of [lo, hi), in whole tiles of BLOCK tokens."""
    per_split = tl.cdiv(tl.cdiv(tl.maximum(hi - lo, 0), n_splits), BLOCK) * BLOCK
    start = lo + split * per_split
    return start, tl.minimum(start + per_split, hi)


@triton.jit
def _store_lse(part_lse_ptr, slot, row_ok, m_i, l_i):
    """Store base-2 log-sum-exp (-inf for rows without keys); return the safe normalizer."""
    has_keys = l_i > 0
    l_safe = tl.where(has_keys, l_i, 1.0)
    tl.store(part_lse_ptr + slot, tl.where(has_keys, m_i + tl.log2(l_safe), float("-inf")), mask=row_ok)
    return l_safe


@triton.jit
def _history_split(q_ptr, q_rows, row_ok, qk_scale, kc_ptr, ks_ptr, kz_ptr, vc_ptr, vs_ptr, vz_ptr,
                   start, end, stride_kcn, stride_ksn, stride_vcn, stride_vsn, part_o_ptr, part_lse_ptr, slot,
                   D: tl.constexpr, K_BITS: tl.constexpr, V_BITS: tl.constexpr, K_LAYOUT: tl.constexpr,
                   V_LAYOUT: tl.constexpr, K_GROUP: tl.constexpr, V_GROUP: tl.constexpr,
                   BLOCK_N: tl.constexpr, FP16: tl.constexpr, ASM: tl.constexpr):
    """Online softmax over packed history tokens [start, end) of one KV head; stores o and lse."""
    q_fields, q_sum = _query_fields(q_ptr, q_rows, row_ok, qk_scale, D, K_BITS, FP16)
    P: tl.constexpr = 8 // V_BITS
    NB: tl.constexpr = D // P
    m_i = tl.full(row_ok.shape, float("-inf"), tl.float32)                          # [BLOCK_R]
    l_i = tl.zeros(row_ok.shape, tl.float32)
    pz_sum = tl.zeros(row_ok.shape, tl.float32)
    acc = ()
    for f in tl.static_range(P):
        acc = acc + (tl.zeros((row_ok.shape[0], NB), tl.float32),)                 # [BLOCK_R, NB] per field
    k_meta = _prefetch_meta(ks_ptr, kz_ptr, start + tl.arange(0, BLOCK_N), end, stride_ksn, K_LAYOUT)
    v_meta = _prefetch_meta(vs_ptr, vz_ptr, start + tl.arange(0, BLOCK_N), end, stride_vsn, V_LAYOUT)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        k_next = _prefetch_meta(ks_ptr, kz_ptr, offs_n + BLOCK_N, end, stride_ksn, K_LAYOUT)  # a tile ahead
        v_next = _prefetch_meta(vs_ptr, vz_ptr, offs_n + BLOCK_N, end, stride_vsn, V_LAYOUT)
        qk = _scores(q_fields, q_sum, kc_ptr, ks_ptr, kz_ptr, k_meta, offs_n, mask_n, stride_kcn, stride_ksn,
                     D, K_BITS, K_LAYOUT, K_GROUP, FP16, ASM)                        # [BLOCK_R, BLOCK_N]
        p, alpha, m_i, l_i = _softmax_step(tl.where(mask_n[None, :], qk, float("-inf")), m_i, l_i)
        acc, pz_sum = _accumulate_values(acc, p, alpha, pz_sum, vc_ptr, vs_ptr, vz_ptr, v_meta, offs_n, mask_n,
                                         stride_vcn, stride_vsn, D, V_BITS, V_LAYOUT, V_GROUP, FP16, ASM)
        k_meta, v_meta = k_next, v_next
    l_safe = _store_lse(part_lse_ptr, slot, row_ok, m_i, l_i)
    nb = tl.arange(0, NB)
    for f in tl.static_range(P):
        out = acc[f] * ((TINY_SCALE if V_LAYOUT == 0 else 1.0) / (1 << (f * V_BITS))) - pz_sum[:, None]
        tl.store(part_o_ptr + slot[:, None] * D + f * NB + nb[None, :], out / l_safe[:, None],
                 mask=row_ok[:, None])


@triton.jit
def _history_warp_tiles(q_ptr, q_rows, row_ok, qk_scale, kc_ptr, ks_ptr, kz_ptr, vc_ptr, vs_ptr, vz_ptr,
                        start, end, stride_kcn, stride_ksn, stride_vcn, stride_vsn, part_o_ptr, part_lse_ptr, slot,
                        D: tl.constexpr, K_BITS: tl.constexpr, V_BITS: tl.constexpr, BLOCK_N: tl.constexpr,
                        WARPS: tl.constexpr, FP16: tl.constexpr, ASM: tl.constexpr):
    """`_history_split` for the single-group token layout with each tile cut into WARPS token sub-tiles, one per
    warp (the batch dim of 3-D dots), so that no value crosses warps inside the loop. Per sub-tile:
        S^T = sum_f K_f [BLOCK_W, KB] @ q_f^T [KB, R]     (tokens are the MMA's M: no padded query rows)
        O_f^T += V_f^T [VB, BLOCK_W] @ P'^T [BLOCK_W, R]  (P' = softmax weights x value scale, fp16)
    with a [WARPS, R] running max / sum per sub-tile stream, merged across warps once after the loop. Both
    accumulators keep the query rows as the MMA's N, so the running max's rescale needs no data movement, and the
    value codes are loaded transposed ([VB, BLOCK_W] pointers) so that they stay in the cp.async pipeline. The
    fields are FIELD_TINY (no offset to subtract, no cancellation); TINY_SCALE is folded into the scales.
    Each tile's per-token (scale, zero) pairs are loaded one tile ahead.
    """
    qf, q_sum = _query_fields(q_ptr, q_rows, row_ok, qk_scale, D, K_BITS, FP16)
    KP: tl.constexpr = 8 // K_BITS
    VP: tl.constexpr = 8 // V_BITS
    KB: tl.constexpr = D // KP
    VB: tl.constexpr = D // VP
    BLOCK_W: tl.constexpr = BLOCK_N // WARPS
    R: tl.constexpr = row_ok.shape[0]
    dtype: tl.constexpr = tl.float16 if FP16 else tl.float32
    q_t = ()
    for f in tl.static_range(KP):
        q_t = q_t + (tl.broadcast_to(tl.trans(qf[f])[None, :, :], (WARPS, KB, R)),)   # [WARPS, KB, R]
    m_i = tl.full((WARPS, R), float("-inf"), tl.float32)
    l_i = tl.zeros((WARPS, R), tl.float32)
    pz_sum = tl.zeros((WARPS, R), tl.float32)                                       # sum P' * zero
    acc = ()
    for f in tl.static_range(VP):
        acc = acc + (tl.zeros((WARPS, VB, R), tl.float32),)                          # [WARPS, VB, R] per field
    sub = tl.arange(0, WARPS)[:, None] * BLOCK_W + tl.arange(0, BLOCK_W)[None, :]   # [WARPS, BLOCK_W]
    kb = tl.arange(0, KB)
    vb = tl.arange(0, VB)
    k_meta = _load_token_meta(ks_ptr, kz_ptr, start + sub, start + sub < end, stride_ksn)  # [WARPS, BLOCK_W, 2]
    v_meta = _load_token_meta(vs_ptr, vz_ptr, start + sub, start + sub < end, stride_vsn)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + sub
        mask_n = offs_n < end
        # the next tile's metadata is loaded a whole tile ahead: its global latency hides behind this tile
        k_next = _load_token_meta(ks_ptr, kz_ptr, offs_n + BLOCK_N, offs_n + BLOCK_N < end, stride_ksn)
        v_next = _load_token_meta(vs_ptr, vz_ptr, offs_n + BLOCK_N, offs_n + BLOCK_N < end, stride_vsn)
        packed = tl.load(kc_ptr + offs_n[:, :, None] * stride_kcn + kb[None, None, :], mask=mask_n[:, :, None],
                         other=0)                                                   # [WARPS, BLOCK_W, KB]
        for f in tl.static_range(KP - 1, -1, -1):
            k = _field(packed, f, K_BITS, FP16, FIELD_TINY, ASM)
            if f == KP - 1:
                qk = tl.dot(k, q_t[f])
            else:
                qk = tl.dot(k, q_t[f], qk)                                          # [WARPS, BLOCK_W, R]
        s, z = _split_meta(k_meta)                                                  # [WARPS, BLOCK_W]
        qk = (qk * TINY_SCALE - q_sum[None, None, :] * z[:, :, None]) * s[:, :, None]
        qk = tl.where(mask_n[:, :, None], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)                                               # [WARPS, R]
        p = tl.exp2(qk - m_safe[:, None, :])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
        packed = tl.load(vc_ptr + offs_n[:, None, :] * stride_vcn + vb[None, :, None], mask=mask_n[:, None, :],
                         other=0)                                                   # [WARPS, VB, BLOCK_W]
        s, z = _split_meta(v_meta)
        pv = (p * s[:, :, None]).to(dtype)                                          # [WARPS, BLOCK_W, R]
        pz_sum = pz_sum * alpha + tl.sum(pv.to(tl.float32) * z[:, :, None], axis=1)
        new_acc = ()
        for f in tl.static_range(VP):
            v = _field(packed, f, V_BITS, FP16, FIELD_TINY, ASM)                    # [WARPS, VB, BLOCK_W]
            new_acc = new_acc + (tl.dot(v, pv, acc[f] * alpha[:, None, :]),)
        acc = new_acc
        k_meta, v_meta = k_next, v_next
    m = tl.max(m_i, axis=0)                                                         # [R]
    weight = tl.exp2(m_i - tl.where(m == float("-inf"), 0.0, m)[None, :])           # [WARPS, R]
    l_safe = _store_lse(part_lse_ptr, slot, row_ok, m, tl.sum(l_i * weight, axis=0))
    pz = tl.sum(pz_sum * weight, axis=0)
    for f in tl.static_range(VP):
        out = tl.sum(acc[f] * weight[:, None, :], axis=0) * (TINY_SCALE / (1 << (f * V_BITS))) - pz[None, :]
        tl.store(part_o_ptr + slot[None, :] * D + f * VB + vb[:, None], out / l_safe[None, :],
                 mask=row_ok[None, :])


@triton.jit
def _fp_split(q_ptr, q_rows, row_ok, qk_scale, fk_ptr, fv_ptr, start, end, limit, stride_fn,
              part_o_ptr, part_lse_ptr, slot, D: tl.constexpr, BLOCK_F: tl.constexpr, FP16: tl.constexpr):
    """Online softmax over fp-segment tokens [start, end); row r sees positions < limit[r]."""
    d = tl.arange(0, D)
    dtype: tl.constexpr = tl.float16 if FP16 else tl.float32
    q = tl.load(q_ptr + q_rows[:, None] + d[None, :], mask=row_ok[:, None], other=0.0)
    q = (q.to(tl.float32) * qk_scale).to(dtype)                                    # [BLOCK_R, D]
    m_i = tl.full(row_ok.shape, float("-inf"), tl.float32)
    l_i = tl.zeros(row_ok.shape, tl.float32)
    acc = tl.zeros((row_ok.shape[0], D), tl.float32)
    for n0 in range(start, end, BLOCK_F):
        offs_n = n0 + tl.arange(0, BLOCK_F)
        mask_n = offs_n < end
        ptrs = offs_n[:, None] * stride_fn + d[None, :]                           # [BLOCK_F, D]
        k = tl.load(fk_ptr + ptrs, mask=mask_n[:, None], other=0.0).to(tl.float32).to(dtype)
        visible = mask_n[None, :] & (offs_n[None, :] < limit[:, None])
        qk = tl.where(visible, tl.dot(q, tl.trans(k)), float("-inf"))
        p, alpha, m_i, l_i = _softmax_step(qk, m_i, l_i)
        v = tl.load(fv_ptr + ptrs, mask=mask_n[:, None], other=0.0).to(tl.float32).to(dtype)
        acc = tl.dot(p.to(dtype), v, acc * alpha[:, None])
    l_safe = _store_lse(part_lse_ptr, slot, row_ok, m_i, l_i)
    tl.store(part_o_ptr + slot[:, None] * D + d[None, :], acc / l_safe[:, None], mask=row_ok[:, None])


@triton.jit
def _decode_stage1_kernel(
    q_ptr, kc_ptr, ks_ptr, kz_ptr, vc_ptr, vs_ptr, vz_ptr, fk_ptr, fv_ptr,
    hist_len_ptr, fp_len_ptr, hist_start_ptr, fp_start_ptr, part_o_ptr, part_lse_ptr,
    qk_scale, kv_heads, q_tokens, n_rows, n_hist_splits, n_fp_splits,
    stride_qb, stride_qh, stride_qt,
    stride_kcb, stride_kch, stride_kcn, stride_ksb, stride_ksh, stride_ksn,
    stride_vcb, stride_vch, stride_vcn, stride_vsb, stride_vsh, stride_vsn,
    stride_fb, stride_fh, stride_fn,
    GROUP: tl.constexpr, D: tl.constexpr, K_BITS: tl.constexpr, V_BITS: tl.constexpr,
    K_LAYOUT: tl.constexpr, V_LAYOUT: tl.constexpr, K_GROUP: tl.constexpr, V_GROUP: tl.constexpr,
    WARP_TILES: tl.constexpr, WARPS: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_F: tl.constexpr, FP16: tl.constexpr,
    ASM_UNPACK: tl.constexpr,
):
    split = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // kv_heads).to(tl.int64)
    h = (bh % kv_heads).to(tl.int64)
    rows = tl.program_id(2) * BLOCK_R + tl.arange(0, BLOCK_R)                      # query rows: head-major
    row_ok = rows < n_rows
    q_rows = b * stride_qb + (h * GROUP + rows // q_tokens) * stride_qh + (rows % q_tokens) * stride_qt
    slot = (bh.to(tl.int64) * (n_hist_splits + n_fp_splits) + split) * n_rows + rows  # [BLOCK_R]
    if split < n_hist_splits:
        start, end = _split_bounds(tl.load(hist_start_ptr + b), tl.load(hist_len_ptr + b), split,
                                   n_hist_splits, BLOCK_N)
        kc, vc = kc_ptr + b * stride_kcb + h * stride_kch, vc_ptr + b * stride_vcb + h * stride_vch
        k_meta, v_meta = b * stride_ksb + h * stride_ksh, b * stride_vsb + h * stride_vsh
        if WARP_TILES:
            _history_warp_tiles(q_ptr, q_rows, row_ok, qk_scale, kc, ks_ptr + k_meta, kz_ptr + k_meta,
                                vc, vs_ptr + v_meta, vz_ptr + v_meta, start, end, stride_kcn, stride_ksn,
                                stride_vcn, stride_vsn, part_o_ptr, part_lse_ptr, slot, D, K_BITS, V_BITS,
                                BLOCK_N, WARPS, FP16, ASM_UNPACK)
        else:
            _history_split(q_ptr, q_rows, row_ok, qk_scale, kc, ks_ptr + k_meta, kz_ptr + k_meta,
                           vc, vs_ptr + v_meta, vz_ptr + v_meta, start, end, stride_kcn, stride_ksn,
                           stride_vcn, stride_vsn, part_o_ptr, part_lse_ptr, slot, D, K_BITS, V_BITS,
                           K_LAYOUT, V_LAYOUT, K_GROUP, V_GROUP, BLOCK_N, FP16, ASM_UNPACK)
    else:
        fp_len = tl.load(fp_len_ptr + b)
        start, end = _split_bounds(tl.load(fp_start_ptr + b), fp_len, split - n_hist_splits, n_fp_splits,
                                   BLOCK_F)
        limit = fp_len - q_tokens + 1 + rows % q_tokens                            # [BLOCK_R] causal
        base = b * stride_fb + h * stride_fh
        _fp_split(q_ptr, q_rows, row_ok, qk_scale, fk_ptr + base, fv_ptr + base, start, end, limit, stride_fn,
                  part_o_ptr, part_lse_ptr, slot, D, BLOCK_F, FP16)


@triton.jit
def _decode_stage2_kernel(part_o_ptr, part_lse_ptr, out_ptr, n_splits, kv_heads, q_tokens, n_rows,
                          stride_ob, stride_oh, stride_ot,
                          GROUP: tl.constexpr, D: tl.constexpr, BLOCK_S: tl.constexpr):
    """Merge the splits of one query row: out = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M)."""
    bh = tl.program_id(0)
    row = tl.program_id(1)
    d = tl.arange(0, D)
    m = tl.full((), float("-inf"), tl.float32)
    den = tl.zeros((), tl.float32)
    acc = tl.zeros((D,), tl.float32)
    for s0 in range(0, n_splits, BLOCK_S):
        splits = s0 + tl.arange(0, BLOCK_S)
        ok = splits < n_splits
        slot = (bh.to(tl.int64) * n_splits + splits) * n_rows + row                # [BLOCK_S]
        lse = tl.load(part_lse_ptr + slot, mask=ok, other=float("-inf"))
        o = tl.load(part_o_ptr + slot[:, None] * D + d[None, :], mask=ok[:, None], other=0.0)  # [BLOCK_S, D]
        m_new = tl.maximum(m, tl.max(lse, axis=0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - m_safe)
        w = tl.exp2(lse - m_safe)
        den = den * alpha + tl.sum(w, axis=0)
        acc = acc * alpha + tl.sum(w[:, None] * o, axis=0)
        m = m_new
    out = acc / tl.where(den > 0, den, 1.0)
    b = (bh // kv_heads).to(tl.int64)
    head = (bh % kv_heads) * GROUP + row // q_tokens
    tl.store(out_ptr + b * stride_ob + head * stride_oh + (row % q_tokens) * stride_ot + d,
             out.to(out_ptr.dtype.element_ty))


@lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _split_target(cfg: DecodeConfig, units: int, device: torch.device) -> int:
    """Programs to aim for: deep splitting for small batches, half as deep once B*H_kv fills the SMs
    (measured on an H100: 8/SM is best at batch 1-8, 4/SM at batch 32, Qwen3-8B shapes)."""
    sms = _sm_count(device.index or 0)
    per_sm = cfg.programs_per_sm if units < sms else max(1, cfg.programs_per_sm // 2)
    return per_sm * sms


def _num_splits(units: int, tokens: int, block: int, target_programs: int, min_tiles: int) -> int:
    """Splits per (sequence, KV head): enough programs for the target, at least min_tiles tiles each."""
    if tokens == 0:
        return 0
    most = triton.cdiv(tokens, block * min_tiles)
    return max(1, min(triton.cdiv(target_programs, units), most))


def _layout(spec: QuantSpec, head_dim: int) -> int:
    if spec.axis == "channel":
        return CHANNEL
    return TOKEN if spec.group == head_dim else TOKEN_GROUPED


def single_group_layouts(k_spec: QuantSpec, v_spec: QuantSpec, head_dim: int) -> bool:
    """K and V both hold one (scale, zero) per token and head: the layouts warp tiles serve."""
    return _layout(k_spec, head_dim) == TOKEN == _layout(v_spec, head_dim)


def uses_warp_tiles(cfg: DecodeConfig, k_spec: QuantSpec, v_spec: QuantSpec, head_dim: int) -> bool:
    """DecodeConfig.warp_tiles applies to single-group token layouts with >= 16 tokens per warp and tile (the
    MMA's M for the scores, its K for the values); other launches take the row-major history loop."""
    return cfg.warp_tiles and cfg.block_n // cfg.num_warps >= 16 and single_group_layouts(k_spec, v_spec, head_dim)


def _check_kernel_support(q, tensors, k_spec, v_spec, fp_k, fp_v, k_scale, k_zero, v_scale, v_zero) -> None:
    head_dim = q.shape[-1]
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {head_dim}.")
    rows = (q.shape[1] // fp_k.shape[1]) * q.shape[2]
    if rows > MAX_ROWS:
        raise ValueError(f"GQA group x T_q = {rows} query rows per KV head exceeds {MAX_ROWS}.")
    for name, spec in (("k", k_spec), ("v", v_spec)):
        if spec.container_bits not in (2, 4, 8):
            raise ValueError(f"{name}_spec: unsupported bits {spec.bits}.")
        if spec.axis == "token" and spec.group & (spec.group - 1):
            raise ValueError(f"{name}_spec: token-axis group must be a power of two, got {spec.group}.")
    if any(t.device != q.device for t in tensors):
        raise ValueError("all decode inputs must be on the same device as q.")
    if any(t.dim() and t.stride(-1) != 1 for t in tensors):
        raise ValueError("every decode input must be contiguous in its last dim.")
    if k_scale.stride() != k_zero.stride() or v_scale.stride() != v_zero.stride() or fp_k.stride() != fp_v.stride():
        raise ValueError("scale/zero pairs and fp_k/fp_v must share strides.")


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
    _check_kernel_support(q, tensors, k_spec, v_spec, fp_k, fp_v, k_scale, k_zero, v_scale, v_zero)
    batch, q_heads, q_tokens, head_dim = q.shape
    kv_heads, n_hist, n_fp = fp_k.shape[1], k_codes.shape[2], fp_k.shape[2]
    group, on_gpu = q_heads // kv_heads, q.is_cuda and not interpreter_forced()
    n_rows = group * q_tokens
    small_grid = on_gpu and is_small_grid(batch * kv_heads, _sm_count(q.device.index or 0))
    cfg = config or default_config(head_dim, on_gpu, small_grid, single_group_layouts(k_spec, v_spec, head_dim))
    target = _split_target(cfg, batch * kv_heads, q.device) if on_gpu else 1
    hist_splits = num_splits if num_splits is not None and n_hist else \
        _num_splits(batch * kv_heads, n_hist, cfg.block_n, target, cfg.min_split_tiles)
    fp_splits = _num_splits(batch * kv_heads, n_fp, cfg.block_f, target, cfg.min_split_tiles)
    n_splits = hist_splits + fp_splits
    out = q.new_empty(batch, q_heads, q_tokens, head_dim)
    if n_splits == 0 or out.numel() == 0:
        return out.zero_()
    warp_tiles = uses_warp_tiles(cfg, k_spec, v_spec, head_dim)
    row_block = WARP_TILE_ROWS if warp_tiles and n_rows <= WARP_TILE_ROWS else ROW_BLOCK
    part_o = q.new_empty(batch * kv_heads, n_splits, n_rows, head_dim, dtype=torch.float32)
    part_lse = q.new_empty(batch * kv_heads, n_splits, n_rows, dtype=torch.float32)
    _decode_stage1_kernel[(n_splits, batch * kv_heads, triton.cdiv(n_rows, row_block))](
        q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, fp_k, fp_v,
        hist_len, fp_len, hist_start, fp_start, part_o, part_lse,
        sm_scale * LOG2E, kv_heads, q_tokens, n_rows, hist_splits, fp_splits,
        *q.stride()[:3], *k_codes.stride()[:3], *k_scale.stride()[:3],
        *v_codes.stride()[:3], *v_scale.stride()[:3], *fp_k.stride()[:3],
        GROUP=group, D=head_dim, K_BITS=k_spec.container_bits, V_BITS=v_spec.container_bits,
        K_LAYOUT=_layout(k_spec, head_dim), V_LAYOUT=_layout(v_spec, head_dim),
        K_GROUP=k_spec.group, V_GROUP=v_spec.group,
        WARP_TILES=warp_tiles, WARPS=cfg.num_warps, BLOCK_R=row_block, BLOCK_N=cfg.block_n, BLOCK_F=cfg.block_f,
        FP16=on_gpu, ASM_UNPACK=on_gpu and cfg.asm_unpack, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **({"maxnreg": cfg.maxnreg} if on_gpu and cfg.maxnreg else {}),
    )
    _decode_stage2_kernel[(batch * kv_heads, n_rows)](
        part_o, part_lse, out, n_splits, kv_heads, q_tokens, n_rows, *out.stride()[:3],
        GROUP=group, D=head_dim, BLOCK_S=cfg.merge_block, num_warps=4,
    )
    return out

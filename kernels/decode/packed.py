"""Stage 1 over the packed low-bit history: field unpack (FIELD_TINY / FIELD_EXACT, optional inline PTX),
per-token metadata, scores and value accumulation, and the row-major history loop (`_history_split`; the warp-tile
loops are in warp_tiles.py and pairs.py). See kernels/decode/__init__.py for the scheme."""
from __future__ import annotations

import triton
import triton.language as tl

from kernels.decode.common import FIELD_EXACT, FIELD_TINY, TINY_SCALE, _softmax_step, _store_lse

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

"""Triton write path: rotate, clip, quantize and pack KV rows in one launch.

`quantize_pack(x, spec, rotation)` returns the same (codes, scale, zero) as
`kernels.reference.quantize_pack_reference` (i.e. `kernels.format.quantize(x @ R, spec)`, x @ R rounded to x's
dtype as the harness stores rotated rows), bit for bit: every division is IEEE (`div_rn`, or on the GPU a
reciprocal and one exact Markstein correction), FMA contraction is off, metadata is rounded to its storage
dtype before the codes are computed, and the clip threshold is the exact order statistic.
Two caveats: the fused rotation is a tiled `tl.dot` (on the GPU with R's 16-bit dtype, or tf32 for
an fp32 R), so `x @ R` itself may differ from torch's in the last bits; and the Lloyd-Max mean and
variance are sums whose order differs from torch's.

Grid: token axis `(cdiv(T, BLOCK_T), A)` with BLOCK_T rows per program; channel axis (KIVI keys)
`(T // G, A)` with the G rows of one token group per program. `A` is the product of the leading dims.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

from kernels.dispatch import HEAD_DIMS, interpreter_forced
from kernels.format import (LLOYD_MAX_OUTER_CENTROID, LLOYD_MAX_THRESHOLD, LLOYD_MAX_VARIANCE_FLOOR,
                            RANGE_FLOOR, QuantSpec)

SCALE_KINDS = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
SPARE_LOW_BITS = {torch.float32: 0, torch.float16: 13, torch.bfloat16: 16}  # zero low bits of the value as fp32
ASYMMETRIC, SYMMETRIC, LLOYD_MAX = 0, 1, 2
MAX_CHANNEL_GROUP = 128
MAX_TOP_BY_DESCENT = 16  # the default clip descends (TOP-1 passes) up to this TOP, then selects by radix
CLIP_METHODS = ("extract", "radix", "descend", "distinct")  # how `_clip_rows` finds tau (CLIP_METHOD: the index)

_FLOOR = tl.constexpr(RANGE_FLOOR)
_LM_THRESHOLD = tl.constexpr(LLOYD_MAX_THRESHOLD)
_LM_VAR_FLOOR = tl.constexpr(LLOYD_MAX_VARIANCE_FLOOR)
_FP16_MAX = tl.constexpr(float(torch.finfo(torch.float16).max))
_FP16_TINY = tl.constexpr(float(torch.finfo(torch.float16).tiny))
_BF16_MAX = tl.constexpr(float(torch.finfo(torch.bfloat16).max))
_FP32_MAX = tl.constexpr(float(torch.finfo(torch.float32).max))
_FP32_TINY = tl.constexpr(float(torch.finfo(torch.float32).tiny))  # = bf16 tiny


@triton.jit
def _round_bf16(x):
    """fp32 -> nearest-even bf16 value, as fp32 (bit arithmetic: the interpreter's cast truncates)."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _rounded(x, KIND: tl.constexpr, FAST: tl.constexpr):
    """fp32 -> the nearest value of SCALE_KINDS' dtype KIND, as fp32 (what torch's cast to that dtype gives;
    FAST: the GPU's conversion instruction, where the interpreter's bf16 cast truncates)."""
    if KIND == 1:
        return x.to(tl.float16).to(tl.float32)
    elif KIND == 2 and FAST:
        return x.to(tl.bfloat16).to(tl.float32)
    elif KIND == 2:
        return _round_bf16(x)
    else:
        return x


@triton.jit
def _stored(x, SCALE_KIND: tl.constexpr):
    """Clamp to the storage dtype's finite range and round to it (fp32 in, fp32 out)."""
    if SCALE_KIND == 1:
        top: tl.constexpr = _FP16_MAX
    elif SCALE_KIND == 2:
        top: tl.constexpr = _BF16_MAX
    else:
        top: tl.constexpr = _FP32_MAX
    return _rounded(tl.clamp(x, -top, top), SCALE_KIND, False)


@triton.jit
def _stored_scale(x, offset, SCALE_KIND: tl.constexpr):
    """Stored scale, raised to |offset| / (dtype max / 2) (the zero point about offset / scale stays finite) and
    to the storage dtype's smallest normal, as `kernels.format._stored_scale`."""
    if SCALE_KIND == 1:
        x = tl.maximum(x, tl.math.div_rn(tl.abs(offset), _FP16_MAX / 2))
        return tl.maximum(_stored(x, SCALE_KIND), _FP16_TINY)
    elif SCALE_KIND == 2:
        x = tl.maximum(x, tl.math.div_rn(tl.abs(offset), _BF16_MAX / 2))
    else:
        x = tl.maximum(x, tl.math.div_rn(tl.abs(offset), _FP32_MAX / 2))
    return tl.maximum(_stored(x, SCALE_KIND), _FP32_TINY)


@triton.jit
def _divide(a, b, FAST: tl.constexpr):
    """IEEE a / b (round to nearest) for a [.., G] tile and a per-group b [.., 1].

    FAST (compiled GPU code): one correctly rounded reciprocal per group, then per element q = a * (1/b)
    and one Markstein correction q + fma(-q, b, a) * (1/b), which is the correctly rounded quotient when
    1/b is correctly rounded and q is within an ulp of a / b (the GPU tests compare every code with torch's
    division). Three instructions where div_rn issues about ten; the interpreter has no true fma, so it keeps
    div_rn.
    """
    if FAST:
        inv = tl.math.div_rn(tl.full(b.shape, 1.0, tl.float32), b)
        q = a * inv
        return tl.fma(tl.fma(q, -b, a), inv, q)                 # -b per group: no negation per element
    return tl.math.div_rn(a, b)


@triton.jit
def _asymmetric(g, AXIS: tl.constexpr, MAX_CODE: tl.constexpr, SCALE_KIND: tl.constexpr, FAST: tl.constexpr):
    """Min-max asymmetric grid with a fractional zero point (METHOD_OSCAR §6.1)."""
    low = tl.min(g, axis=AXIS, keep_dims=True)
    high = tl.max(g, axis=AXIS, keep_dims=True)
    scale = _stored_scale(tl.math.div_rn(tl.maximum(high - low, _FLOOR), MAX_CODE * 1.0), low, SCALE_KIND)
    zero = _stored(tl.math.div_rn(-low, scale), SCALE_KIND)
    shifted = _divide(g, scale, FAST) + zero + 0.5
    if FAST:  # floor and the clamp at 0 in one saturating conversion
        return tl.minimum(libdevice.float2uint_rd(shifted), MAX_CODE), scale, zero
    return tl.clamp(tl.floor(shifted), 0.0, MAX_CODE * 1.0).to(tl.int32), scale, zero


@triton.jit
def _symmetric(g, AXIS: tl.constexpr, BITS: tl.constexpr, SCALE_KIND: tl.constexpr, FAST: tl.constexpr):
    """Signed grid stored as code = q + 2^(bits-1) with the constant zero 2^(bits-1)."""
    half: tl.constexpr = 2 ** (BITS - 1)
    peak = tl.maximum(tl.max(tl.abs(g), axis=AXIS, keep_dims=True), _FLOOR)
    scale = _stored_scale(tl.math.div_rn(peak, (half - 1) * 1.0), 0.0, SCALE_KIND)
    signed = tl.clamp(tl.floor(_divide(g, scale, FAST) + 0.5), -half * 1.0, (half - 1) * 1.0)
    return signed + half, scale, tl.zeros_like(scale) + half


@triton.jit
def _lloyd_max(g, lm_factor, AXIS: tl.constexpr, GROUP: tl.constexpr, SCALE_KIND: tl.constexpr,
               FAST: tl.constexpr):
    """Gaussian Lloyd-Max thresholds with a stretched uniform grid (METHOD_OSCAR §6.6)."""
    mean = tl.math.div_rn(tl.sum(g, axis=AXIS, keep_dims=True), GROUP * 1.0)
    diff = g - mean
    var = tl.math.div_rn(tl.sum(diff * diff, axis=AXIS, keep_dims=True), GROUP * 1.0) + _LM_VAR_FLOOR
    std = tl.math.sqrt_rn(var)
    z = _divide(diff, std, FAST)
    codes = (z >= -_LM_THRESHOLD).to(tl.float32) + (z >= 0.0).to(tl.float32) + (z >= _LM_THRESHOLD).to(tl.float32)
    scale = _stored_scale(lm_factor * std, mean, SCALE_KIND)
    zero = _stored(1.5 - tl.math.div_rn(mean, scale), SCALE_KIND)
    return codes, scale, zero


@triton.jit
def _rotate(x_rows, r_ptr, row_ok, cols, D: tl.constexpr, ROT_BLOCK: tl.constexpr, BLOCK_T: tl.constexpr,
            ROT_FP32: tl.constexpr):
    """x @ R for BLOCK_T rows, accumulated over ROT_BLOCK-wide slices of the input dim."""
    acc = tl.zeros((BLOCK_T, D), tl.float32)                                    # [BLOCK_T, D]
    for k0 in tl.static_range(0, D, ROT_BLOCK):
        ks = k0 + tl.arange(0, ROT_BLOCK)
        xk = tl.load(x_rows + ks[None, :], mask=row_ok[:, None], other=0.0)     # [BLOCK_T, RB]
        rk = tl.load(r_ptr + ks[:, None] * D + cols[None, :])                   # [RB, D]
        if ROT_FP32:
            acc = tl.dot(xk.to(tl.float32), rk.to(tl.float32), acc)
        else:
            acc = tl.dot(xk.to(rk.dtype), rk, acc)
    return acc


@triton.jit
def _tau_by_extraction(mag, CLIP_INDEX: tl.constexpr):
    """tau of each row [BLOCK_T, 1]: remove the TOP-1 largest |x| one at a time (an argmax each), then the max."""
    TOP: tl.constexpr = mag.shape[1] - CLIP_INDEX
    cols = tl.arange(0, mag.shape[1])
    for _ in tl.static_range(TOP - 1):
        top = tl.argmax(mag, axis=1, tie_break_left=True)                         # [BLOCK_T]
        mag = tl.where(cols[None, :] == top[:, None], -1.0, mag)
    return tl.max(mag, axis=1)[:, None]                                           # [BLOCK_T, 1]


@triton.jit
def _tau_by_radix(mag, CLIP_INDEX: tl.constexpr):
    """tau of each row [BLOCK_T, 1] by a radix select: for non-negative floats the int32 bit pattern is monotone,
    so tau's pattern is the largest v with #{|x| < v} <= CLIP_INDEX, built greedily from the high bit."""
    bits = mag.to(tl.int32, bitcast=True)                                         # [BLOCK_T, D]
    tau_bits = tl.zeros((mag.shape[0],), tl.int32)
    for bit in tl.static_range(30, -1, -1):
        trial = tau_bits | (1 << bit)
        below = tl.sum((bits < trial[:, None]).to(tl.int32), axis=1)
        tau_bits = tl.where(below <= CLIP_INDEX, trial, tau_bits)
    return tau_bits.to(tl.float32, bitcast=True)[:, None]                         # [BLOCK_T, 1]


@triton.jit
def _descend_counting(bits, CLIP_INDEX: tl.constexpr):
    """tau's int32 pattern of each row [BLOCK_T] from |x|'s patterns [BLOCK_T, D], descending through the distinct
    values from the max, TOP-1 steps.

    On the int32 patterns of non-negative floats (monotone), gap = v - level as uint32 is >= 2^31 exactly where
    v < level, so one pass over the row gives both #{v < level} (the gaps' top bits) and the next distinct value
    below level (level + the largest gap). The descent stops, and level stays, once #{v >= level} >= TOP: then
    level is the TOP-th largest with its ties counted. Three integer operations per value and step.
    """
    TOP: tl.constexpr = bits.shape[1] - CLIP_INDEX
    level = tl.max(bits, axis=1)                                                  # [BLOCK_T]
    for _ in tl.static_range(TOP - 1):
        gap = (bits - level[:, None]).to(tl.uint32, bitcast=True)                 # [BLOCK_T, D]
        below = tl.sum((gap >> 31).to(tl.int32), axis=1)                          # [BLOCK_T]
        lower = level + tl.max(gap, axis=1).to(tl.int32, bitcast=True)
        level = tl.where(below > CLIP_INDEX, lower, level)
    return level


@triton.jit
def _descend_distinct(keys, STEPS: tl.constexpr):
    """The key STEPS distinct keys below the max of each row [BLOCK_T], from non-negative int32 keys
    [BLOCK_T, D]: level + the largest uint32 gap (key - level) is the next key below level (as in
    `_descend_counting`, without the count). Two integer operations per key and step."""
    level = tl.max(keys, axis=1)                                                  # [BLOCK_T]
    for _ in tl.static_range(STEPS):
        gap = (keys - level[:, None]).to(tl.uint32, bitcast=True)                 # [BLOCK_T, D]
        level = level + tl.max(gap, axis=1).to(tl.int32, bitcast=True)
    return level


@triton.jit
def _tau_by_descent(bits, CLIP_INDEX: tl.constexpr):
    """tau of each row [BLOCK_T, 1] from |x|'s int32 patterns by `_descend_counting` (exact with any ties)."""
    level = _descend_counting(bits, CLIP_INDEX)
    return level.to(tl.float32, bitcast=True)[:, None]                            # [BLOCK_T, 1]


@triton.jit
def _tau_by_distinct_descent(bits, CLIP_INDEX: tl.constexpr, SPARE_BITS: tl.constexpr):
    """tau of each row [BLOCK_T, 1] from |x|'s int32 patterns [BLOCK_T, D] by `_descend_distinct`, which is the
    TOP-th largest when no two values tie.

    With 2^SPARE_BITS >= D (|x| came from 16-bit floats, whose fp32 patterns end in SPARE_BITS zero bits) the
    column index fills those bits, so no two keys tie and tau is the key with them cleared. Otherwise a row whose
    TOP largest values hold a tie has more than TOP values >= the result; a tile with such a row is redone by
    `_descend_counting`.
    """
    TOP: tl.constexpr = bits.shape[1] - CLIP_INDEX
    if (1 << SPARE_BITS) >= bits.shape[1]:
        cols = tl.arange(0, bits.shape[1])
        level = _descend_distinct(bits | cols[None, :], TOP - 1) & -(1 << SPARE_BITS)
    else:
        level = _descend_distinct(bits, TOP - 1)
        at_least = tl.sum((bits >= level[:, None]).to(tl.int32), axis=1)          # [BLOCK_T]
        if tl.max(at_least, axis=0) > TOP:
            level = _descend_counting(bits, CLIP_INDEX)
    return level.to(tl.float32, bitcast=True)[:, None]                            # [BLOCK_T, 1]


@triton.jit
def _clip_rows(x, CLIP_INDEX: tl.constexpr, CLIP_METHOD: tl.constexpr, SPARE_BITS: tl.constexpr):
    """Clamp each row to [-tau, tau], tau = sort_ascending(|x|)[clip_index] (the TOP-th largest |x|, TOP =
    D - CLIP_INDEX), exactly; CLIP_METHOD indexes CLIP_METHODS (how tau is found, never what it is)."""
    bits = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF                              # |x|'s patterns [BLOCK_T, D]
    if CLIP_METHOD == 0:
        tau = _tau_by_extraction(tl.abs(x), CLIP_INDEX)
    elif CLIP_METHOD == 1:
        tau = _tau_by_radix(tl.abs(x), CLIP_INDEX)
    elif CLIP_METHOD == 2:
        tau = _tau_by_descent(bits, CLIP_INDEX)
    else:
        tau = _tau_by_distinct_descent(bits, CLIP_INDEX, SPARE_BITS)
    return tl.minimum(tl.maximum(x, -tau), tau)


@triton.jit
def _pack(codes, BLOCK_T: tl.constexpr, D: tl.constexpr, BITS: tl.constexpr):
    """codes [BLOCK_T, D] -> bytes [BLOCK_T, D/p]; byte j holds coordinates j + m*(D/p) at bit m*BITS."""
    P: tl.constexpr = 8 // BITS
    quarters = tl.reshape(codes.to(tl.int32), (BLOCK_T, P, D // P))             # [BLOCK_T, P, NB]
    shifts = tl.arange(0, P) * BITS
    return tl.sum(quarters << shifts[None, :, None], axis=1).to(tl.uint8)      # [BLOCK_T, NB]


@triton.jit
def _quantize_pack_kernel(
    x_ptr, r_ptr, codes_ptr, scale_ptr, zero_ptr, offsets_ptr,
    n_tokens, lm_factor, heads,
    stride_xa, stride_xt, stride_ca, stride_ct, stride_sa, stride_st,
    ROW_OFFSETS: tl.constexpr, D: tl.constexpr, BITS: tl.constexpr, MAX_CODE: tl.constexpr, GROUP: tl.constexpr,
    CHANNEL: tl.constexpr, VARIANT: tl.constexpr, CLIP: tl.constexpr, CLIP_INDEX: tl.constexpr,
    CLIP_METHOD: tl.constexpr, SPARE_BITS: tl.constexpr,
    ROTATE: tl.constexpr, ROT_FP32: tl.constexpr, ROT_BLOCK: tl.constexpr, ROTATED_KIND: tl.constexpr,
    SCALE_KIND: tl.constexpr, BLOCK_T: tl.constexpr, FAST_DIV: tl.constexpr,
):
    pid_t = tl.program_id(0)
    pid_a = tl.program_id(1).to(tl.int64)
    rows = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)                               # [BLOCK_T]
    row_ok = rows < n_tokens
    cols = tl.arange(0, D)
    x_rows = x_ptr + pid_a * stride_xa + rows[:, None] * stride_xt               # [BLOCK_T, 1]
    if ROTATE:
        x = _rotate(x_rows, r_ptr, row_ok, cols, D, ROT_BLOCK, BLOCK_T, ROT_FP32)
        x = _rounded(x, ROTATED_KIND, FAST_DIV)                                  # x @ R in x's dtype
    else:
        x = tl.load(x_rows + cols[None, :], mask=row_ok[:, None], other=0.0).to(tl.float32)
    if CLIP:
        x = _clip_rows(x, CLIP_INDEX, CLIP_METHOD, SPARE_BITS)

    if CHANNEL:
        g = x                                                                    # [G, D]: one token group
        AXIS: tl.constexpr = 0
    else:
        g = tl.reshape(x, (BLOCK_T, D // GROUP, GROUP))                          # [BLOCK_T, NG, G]
        AXIS: tl.constexpr = 2
    if VARIANT == 2:  # LLOYD_MAX, SYMMETRIC, else ASYMMETRIC
        codes, scale, zero = _lloyd_max(g, lm_factor, AXIS, GROUP, SCALE_KIND, FAST_DIV)
    elif VARIANT == 1:
        codes, scale, zero = _symmetric(g, AXIS, BITS, SCALE_KIND, FAST_DIV)
    else:
        codes, scale, zero = _asymmetric(g, AXIS, MAX_CODE, SCALE_KIND, FAST_DIV)

    packed = _pack(tl.reshape(codes, (BLOCK_T, D)), BLOCK_T, D, BITS)           # [BLOCK_T, NB]
    nb = tl.arange(0, D * BITS // 8)
    first = 0                                                                    # output row of input row 0
    if ROW_OFFSETS:                                                              # per sequence, read here
        first = tl.load(offsets_ptr + pid_a // heads).to(tl.int64)
    out_rows = rows + first                                                      # [BLOCK_T]
    tl.store(codes_ptr + pid_a * stride_ca + out_rows[:, None] * stride_ct + nb[None, :], packed,
             mask=row_ok[:, None])
    if CHANNEL:
        meta = pid_a * stride_sa + (pid_t + first // GROUP) * stride_st + cols    # [D]
        tl.store(scale_ptr + meta, tl.reshape(scale, (D,)))
        tl.store(zero_ptr + meta, tl.reshape(zero, (D,)))
    else:
        groups = tl.arange(0, D // GROUP)
        meta = pid_a * stride_sa + out_rows[:, None] * stride_st + groups[None, :]   # [BLOCK_T, NG]
        tl.store(scale_ptr + meta, tl.reshape(scale, (BLOCK_T, D // GROUP)), mask=row_ok[:, None])
        tl.store(zero_ptr + meta, tl.reshape(zero, (BLOCK_T, D // GROUP)), mask=row_ok[:, None])


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _check_inputs(x: torch.Tensor, spec: QuantSpec, rotation: torch.Tensor | None) -> None:
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"x must be fp32, fp16 or bf16, got {x.dtype}.")
    if x.dim() < 2:
        raise ValueError(f"x must be [..., T, D], got shape {tuple(x.shape)}.")
    head_dim, tokens = x.shape[-1], x.shape[-2]
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {head_dim}.")
    if spec.container_bits not in (2, 4, 8):
        raise ValueError(f"unsupported bits {spec.bits}.")
    if spec.axis == "token" and not (_is_pow2(spec.group) and 16 <= spec.group <= head_dim):
        raise ValueError(f"token-axis group must be a power of two in [16, {head_dim}], got {spec.group}.")
    if spec.axis == "channel" and not (_is_pow2(spec.group) and 16 <= spec.group <= MAX_CHANNEL_GROUP):
        raise ValueError(f"channel-axis group must be a power of two in [16, {MAX_CHANNEL_GROUP}], got {spec.group}.")
    if spec.axis == "channel" and tokens % spec.group != 0:
        raise ValueError(f"channel-axis group {spec.group} does not divide the {tokens} tokens.")
    if rotation is not None and (tuple(rotation.shape) != (head_dim, head_dim) or rotation.dtype not in
                                 (torch.float32, torch.float16, torch.bfloat16) or rotation.device != x.device):
        raise ValueError(f"rotation must be a float [{head_dim}, {head_dim}] tensor on {x.device}, got "
                         f"{rotation.dtype} {tuple(rotation.shape)} on {rotation.device}.")


def packed_shapes(shape, spec: QuantSpec) -> tuple[list[int], list[int]]:
    """(codes shape, scale/zero shape) that quantizing rows of `shape` [..., T, D] per `spec` produces."""
    *lead, tokens, head_dim = shape
    meta = [tokens, head_dim // spec.group] if spec.axis == "token" else [tokens // spec.group, head_dim]
    return [*lead, tokens, head_dim * spec.container_bits // 8], [*lead, *meta]


def _as_3d(t: torch.Tensor, name: str) -> torch.Tensor:
    """View [..., R, C] as [A, R, C] without copying (out tensors are written in place)."""
    if t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dim, got strides {t.stride()}.")
    try:
        return t.view(-1, t.shape[-2], t.shape[-1])
    except RuntimeError as err:
        raise ValueError(f"{name} leading dims must be mergeable into one (a view), got strides {t.stride()}.") from err


def _allocate_or_check(x, spec, out, any_rows: bool = False):
    """(codes, scale, zero): new, or `out` checked against x's packed shapes (any_rows: any length of the token-like
    axis, dim -2, at least x's)."""
    codes_shape, meta_shape = packed_shapes(x.shape, spec)
    dtype = spec.torch_scale_dtype
    if out is None:
        if any_rows:
            raise ValueError("row_offsets writes into `out`: pass the packed buffers.")
        return (x.new_empty(codes_shape, dtype=torch.uint8), x.new_empty(meta_shape, dtype=dtype),
                x.new_empty(meta_shape, dtype=dtype))
    for name, t, shape, want in zip(("codes", "scale", "zero"), out, (codes_shape, meta_shape, meta_shape),
                                    (torch.uint8, dtype, dtype)):
        got = list(t.shape)
        if any_rows:                                            # every dim as x's but the token-like one, >= x's
            fits = got[:-2] + got[-1:] == shape[:-2] + shape[-1:] and got[-2] >= shape[-2]
        else:
            fits = got == shape
        if not fits or t.dtype != want or t.device != x.device:
            raise ValueError(f"out {name} must be {want} {shape} on {x.device}"
                             f"{' (any rows at dim -2)' if any_rows else ''}, got {t.dtype} {got}.")
    return out


def _check_row_offsets(x: torch.Tensor, row_offsets: torch.Tensor) -> None:
    if x.dim() != 4 or row_offsets.shape != (x.shape[0],) or row_offsets.dtype != torch.int32 \
            or row_offsets.device != x.device:
        raise ValueError(f"row_offsets must be int32 [B] on {x.device} for x [B, H, T, D], got "
                         f"{row_offsets.dtype} {list(row_offsets.shape)} for x {list(x.shape)}.")


def _variant(spec: QuantSpec) -> int:
    return LLOYD_MAX if spec.lloyd_max else SYMMETRIC if spec.symmetric else ASYMMETRIC


def default_write_tile(head_dim: int, spec: QuantSpec, rotate: bool, tokens: int | None = None) -> tuple[int, int]:
    """(block_t, num_warps) of a launch. Token axis without a rotation: one warp per program, 1,024 elements. H100,
    [16, 8, 4096, 128] bf16 (bench_kernels.py --write-tiles): 8x1 against the former 16 rows x 4 warps: INT2 0.0807
    vs 0.0886 ms, INT4 g32 0.0757 vs 0.0813, clip 0.262 vs 0.267. With a rotation, 64 rows x 4 warps (the dot
    becomes one warpgroup MMA and R is staged once per 64 rows, not per 16): offline SASS (scripts/dev/write_sass.py,
    INT2 g128) 84 instructions per row against 117 at 16x1 without a clip, 165 against 202 with the descent clip;
    on the H100 16x1 was 0.302 ms with the former extraction clip. Fewer than 64 rows per (sequence, head), a decode
    step's write (tokens: rows per program row), keep 16 x 1: a 64-row tile would compute 63 masked rows per token.
    Channel axis (KIVI keys): one token group."""
    if spec.axis == "channel":
        return spec.group, 4
    if rotate:
        return (64, 4) if tokens is None or tokens >= 64 else (16, 1)
    return max(8, 1024 // head_dim), 1


def default_rot_block(head_dim: int, block_t: int) -> int:
    """Input coordinates per slice of the fused rotation's tl.dot (`_rotate`). H200, [16, 8, 4096, 128] bf16, 64-row
    tiles (bench_kernels.py --write-tiles 64x4r64,64x4r128; results/bench/bench_kernels_write_epilogue.md): slices of
    32 / 64 / 128 took the rotated write 0.1014 / 0.0789 / 0.0833 ms and clip + rotation 0.1464 / 0.1279 / 0.1239
    ms (fewer dependent load-and-MMA rounds per tile; 128 doubles the shared memory of 64 for the same sum). Smaller
    tiles (a decode step's rows) keep 32, not timed: one warp would hold a 64-wide slice of R in 128 registers per
    thread."""
    return min(64, head_dim) if block_t >= 64 else 32


def clip_index(head_dim: int, spec: QuantSpec) -> int:
    """Position of tau in the ascending |x| of a row (`kernels.format.clip_rows`); 0 without a clip."""
    if spec.clip_ratio is None:
        return 0
    return min(max(int(spec.clip_ratio * head_dim), 0), head_dim - 1)


def default_clip_method(head_dim: int, spec: QuantSpec, x_dtype: torch.dtype) -> str:
    """How `_clip_rows` finds tau by default: while few values lie above it (the OSCAR ratios keep 5-11), the
    distinct descent with column keys where the values have spare low bits (16-bit x; a rotation's rows are
    rounded to x's dtype first), else the counting descent; the radix select beyond MAX_TOP_BY_DESCENT. Offline
    SASS, INT2 g128 clip 0.96 at the default tiles (scripts/dev/write_sass.py on e9e1a07): 212 instructions per row
    against 263 by the counting descent without a rotation, 130 against 161 with a bf16 one."""
    if head_dim - clip_index(head_dim, spec) > MAX_TOP_BY_DESCENT:
        return "radix"
    return "distinct" if SPARE_LOW_BITS[x_dtype] else "descend"


def launch_constants(head_dim: int, spec: QuantSpec, x_dtype: torch.dtype, rotate: bool, rotation_fp32: bool,
                     interpret: bool, block_t: int | None = None, clip_method: str | None = None,
                     tokens: int | None = None, rot_block: int | None = None) -> dict:
    """The constexpr arguments of `_quantize_pack_kernel` for one launch (block_t None: `default_write_tile` for
    `tokens` rows per (sequence, head); a channel-axis program is always one token group)."""
    clip_method = clip_method or default_clip_method(head_dim, spec, x_dtype)
    if clip_method not in CLIP_METHODS:
        raise ValueError(f"clip_method must be one of {CLIP_METHODS}, got {clip_method!r}.")
    if rot_block is not None and (not _is_pow2(rot_block) or not 16 <= rot_block <= head_dim):
        raise ValueError(f"rot_block must be a power of two from 16 to head_dim {head_dim}, got {rot_block}.")
    block_t = spec.group if spec.axis == "channel" else block_t or default_write_tile(head_dim, spec, rotate, tokens)[0]
    return dict(D=head_dim, BITS=spec.container_bits, MAX_CODE=spec.max_code, GROUP=spec.group,
                CHANNEL=spec.axis == "channel", VARIANT=_variant(spec), CLIP=spec.clip_ratio is not None,
                CLIP_INDEX=clip_index(head_dim, spec), CLIP_METHOD=CLIP_METHODS.index(clip_method),
                SPARE_BITS=SPARE_LOW_BITS[x_dtype],
                ROTATE=rotate, ROT_FP32=interpret or rotation_fp32,
                ROT_BLOCK=rot_block or default_rot_block(head_dim, block_t), ROTATED_KIND=SCALE_KINDS[x_dtype],
                SCALE_KIND=SCALE_KINDS[spec.torch_scale_dtype], BLOCK_T=block_t, FAST_DIV=not interpret)


def quantize_pack(x: torch.Tensor, spec: QuantSpec, rotation: torch.Tensor | None = None, out=None,
                  block_t: int | None = None, num_warps: int | None = None, clip_method: str | None = None,
                  row_offsets: torch.Tensor | None = None, rot_block: int | None = None):
    """Quantize x [..., T, D] (optionally `x @ rotation` first) -> (codes, scale, zero) per `spec`.

    codes: uint8 [..., T, D*bits/8]; scale, zero: token axis [..., T, D/G], channel axis [..., T/G, D].
    `out=(codes, scale, zero)` writes into preallocated (possibly strided) views, e.g. cache slices.
    row_offsets (int32 [B] on x's device, x [B, H, T, D]; needs `out`, whose token axis may hold more rows): sequence
    b's tokens go to out's token rows row_offsets[b] .. + T - 1, read on the device (a CUDA graph replays the launch
    at whatever offsets the tensor then holds: harness/demotion_graph.py). Channel axis: offsets must be multiples of
    the group; nothing checks that the rows fit.
    block_t (token axis, a power of two) and num_warps override `default_write_tile`, clip_method (one of
    CLIP_METHODS) `default_clip_method`, rot_block `default_rot_block` (the rotation's slice width): benchmark
    knobs that never change the result.
    """
    _check_inputs(x, spec, rotation)
    codes, scale, zero = _allocate_or_check(x, spec, out, any_rows=row_offsets is not None)
    if row_offsets is not None:
        _check_row_offsets(x, row_offsets)
    if scale.stride() != zero.stride():
        raise ValueError(f"scale and zero must share strides, got {scale.stride()} and {zero.stride()}.")
    tokens, head_dim = x.shape[-2], x.shape[-1]
    x3 = x.reshape(-1, tokens, head_dim)                                      # [A, T, D]
    if x3.stride(-1) != 1:
        x3 = x3.contiguous()
    c3, s3, z3 = _as_3d(codes, "codes"), _as_3d(scale, "scale"), _as_3d(zero, "zero")
    if x3.shape[0] == 0 or tokens == 0:
        return codes, scale, zero
    num_warps = num_warps or default_write_tile(head_dim, spec, rotation is not None, tokens)[1]
    interpret = interpreter_forced() or not x.is_cuda
    rot = rotation.contiguous() if rotation is not None else x3
    constants = launch_constants(head_dim, spec, x.dtype, rotate=rotation is not None,
                                 rotation_fp32=rot.dtype == torch.float32, interpret=interpret, block_t=block_t,
                                 clip_method=clip_method, tokens=tokens, rot_block=rot_block)
    lm_factor = (2 * LLOYD_MAX_OUTER_CENTROID / 3) * spec.lm_ratio
    grid = (triton.cdiv(tokens, constants["BLOCK_T"]), x3.shape[0])
    heads = x.shape[1] if row_offsets is not None else 1                       # programs per sequence's offset
    _quantize_pack_kernel[grid](
        x3, rot, c3, s3, z3, row_offsets if row_offsets is not None else x3, tokens, lm_factor, heads,
        x3.stride(0), x3.stride(1), c3.stride(0), c3.stride(1), s3.stride(0), s3.stride(1),
        ROW_OFFSETS=row_offsets is not None, **constants, num_warps=num_warps, enable_fp_fusion=False,
    )
    return codes, scale, zero

"""Triton write path of TurboQuant: rows [..., T, D] -> tight codes plus fp16 metadata, in one launch.

`quantize_pack_turbo(x, spec, boundaries)` stores what baselines/turboquant_format.py's `quantize_keys` /
`quantize_values` store, bit for bit:
* keys (already rotated): the L2 norm, accumulated in fp64 (its squares are exact there) and rounded to fp32 as the
  reference does, stored in fp16; each coordinate of the unit vector x / max(norm, NORM_FLOOR) (an IEEE
  division) becomes the number of codebook boundaries at or below it (torch.bucketize(right=True));
* values: the stock asymmetric min-max grid over the whole head_dim (kernels/quant.py's `_asymmetric`,
  fp16 scale and zero).
Codes are packed 8 to a word of `bits` bytes (kernels/turbo/layout.py). FMA contraction is off, as in
kernels/quant.py. Grid `(cdiv(T, BLOCK_T), A)`, A the product of the leading dims.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels.dispatch import HEAD_DIMS, interpreter_forced
from kernels.quant import SCALE_KINDS, _asymmetric, _divide, _stored, default_write_tile
from kernels.turbo.layout import CODES_PER_WORD, KINDS, NORM_FLOOR, TIGHT_BITS, part_shapes

FP16_KIND = tl.constexpr(SCALE_KINDS[torch.float16])     # norms, scales and zeros are stored in fp16
_NORM_FLOOR = tl.constexpr(NORM_FLOOR)
_WORD = tl.constexpr(CODES_PER_WORD)


@triton.jit
def _codebook_codes(x, bounds_ptr, LEVELS: tl.constexpr, FAST: tl.constexpr):
    """x [BLOCK_T, D] fp32 -> (codes [BLOCK_T, D] int32: boundaries <= x / |x|, norm [BLOCK_T, 1] fp32)."""
    x64 = x.to(tl.float64)
    norm = tl.sqrt(tl.sum(x64 * x64, axis=1, keep_dims=True)).to(tl.float32)   # [BLOCK_T, 1]; fp64 sqrt is IEEE
    unit = _divide(x, tl.maximum(norm, _NORM_FLOOR), FAST)                              # [BLOCK_T, D]
    codes = tl.zeros(x.shape, tl.int32)
    for i in tl.static_range(LEVELS - 1):
        codes += (unit >= tl.load(bounds_ptr + i)).to(tl.int32)
    return codes, norm


@triton.jit
def _store_tight(row_ptrs, codes, row_ok, D: tl.constexpr, BITS: tl.constexpr):
    """Store codes [BLOCK_T, D] (< 2^BITS) at row_ptrs [BLOCK_T]: word w of a row is bytes w*BITS .. w*BITS+BITS-1,
    little-endian, holding codes 8w .. 8w+7 with code j at bit j*BITS."""
    W: tl.constexpr = D // _WORD
    words = tl.reshape(codes, (codes.shape[0], W, _WORD))                         # [BLOCK_T, W, 8]
    word = tl.sum(words << (tl.arange(0, _WORD) * BITS)[None, None, :], axis=2)   # [BLOCK_T, W]: disjoint bits
    k = tl.arange(0, 4)                                                           # a word's bytes (BITS <= 4)
    bytes_ = (word[:, :, None] >> (8 * k)[None, None, :]) & 0xFF                  # [BLOCK_T, W, 4]
    offs = tl.arange(0, W)[None, :, None] * BITS + k[None, None, :]
    tl.store(row_ptrs[:, None, None] + offs, bytes_.to(tl.uint8),
             mask=row_ok[:, None, None] & (k < BITS)[None, None, :])


@triton.jit
def _quantize_pack_turbo_kernel(
    x_ptr, bounds_ptr, codes_ptr, scale_ptr, zero_ptr, n_tokens,
    stride_xa, stride_xt, stride_ca, stride_ct, stride_sa, stride_st,
    D: tl.constexpr, BITS: tl.constexpr, KEY: tl.constexpr, BLOCK_T: tl.constexpr, FAST_DIV: tl.constexpr,
):
    pid_t = tl.program_id(0)
    pid_a = tl.program_id(1).to(tl.int64)
    rows = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)                                # [BLOCK_T]
    row_ok = rows < n_tokens
    cols = tl.arange(0, D)
    x = tl.load(x_ptr + pid_a * stride_xa + rows[:, None] * stride_xt + cols[None, :], mask=row_ok[:, None],
                other=0.0).to(tl.float32)                                         # [BLOCK_T, D]
    meta = pid_a * stride_sa + rows[:, None] * stride_st                          # [BLOCK_T, 1]
    if KEY:
        codes, norm = _codebook_codes(x, bounds_ptr, 1 << BITS, FAST_DIV)
        tl.store(scale_ptr + meta, _stored(norm, FP16_KIND), mask=row_ok[:, None])
    else:
        levels, scale, zero = _asymmetric(x, 1, (1 << BITS) - 1, FP16_KIND, FAST_DIV)
        codes = levels.to(tl.int32)
        tl.store(scale_ptr + meta, scale, mask=row_ok[:, None])
        tl.store(zero_ptr + meta, zero, mask=row_ok[:, None])
    _store_tight(codes_ptr + pid_a * stride_ca + rows * stride_ct, codes, row_ok, D, BITS)


def _check_inputs(x: torch.Tensor, spec, boundaries: torch.Tensor | None) -> None:
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16) or x.dim() < 2:
        raise ValueError(f"x must be fp32, fp16 or bf16 [..., T, D], got {x.dtype} {tuple(x.shape)}.")
    if x.shape[-1] not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {x.shape[-1]}.")
    if spec.kind not in KINDS or spec.bits not in TIGHT_BITS:
        raise ValueError(f"TurboQuant stores {KINDS} with {TIGHT_BITS}-bit codes, got {spec.kind} {spec.bits}-bit.")
    levels = 2 ** spec.bits
    if spec.kind == "key" and (boundaries is None or tuple(boundaries.shape) != (levels - 1,)
                               or boundaries.dtype != torch.float32 or boundaries.device != x.device):
        raise ValueError(f"keys need the codebook's {levels - 1} boundaries as fp32 on {x.device}, got "
                         f"{None if boundaries is None else (boundaries.dtype, tuple(boundaries.shape))}.")


def quantize_pack_turbo(x: torch.Tensor, spec, boundaries: torch.Tensor | None = None):
    """x [..., T, D] -> (codes uint8 [..., T, D*bits/8], scale fp16 [..., T, 1], zero fp16 [..., T, 0 | 1]).

    spec: kind "key" (scale = the norm, no zero; `boundaries` fp32 [2^bits - 1], sorted) or "value", and bits.
    """
    _check_inputs(x, spec, boundaries)
    tokens, head_dim = x.shape[-2], x.shape[-1]
    x3 = x.reshape(math.prod(x.shape[:-2]), tokens, head_dim)                     # [A, T, D]
    if x3.stride(-1) != 1:
        x3 = x3.contiguous()
    codes, scale, zero = (x.new_empty(shape, dtype=dtype) for shape, dtype in part_shapes(x3.shape, spec).values())
    if x3.numel():
        block_t, num_warps = default_write_tile(head_dim, spec, rotate=False)
        interpret = interpreter_forced() or not x.is_cuda
        key = spec.kind == "key"                 # values read no codebook, keys write no zero: stand-in pointers
        _quantize_pack_turbo_kernel[(triton.cdiv(tokens, block_t), x3.shape[0])](
            x3, boundaries if key else x3, codes, scale, scale if key else zero, tokens,
            x3.stride(0), x3.stride(1), codes.stride(0), codes.stride(1), scale.stride(0), scale.stride(1),
            D=head_dim, BITS=spec.bits, KEY=key, BLOCK_T=block_t, FAST_DIV=not interpret,
            num_warps=num_warps, enable_fp_fusion=False,
        )
    shapes = part_shapes(x.shape, spec)
    return tuple(part.view(shape) for part, (shape, _) in zip((codes, scale, zero), shapes.values()))

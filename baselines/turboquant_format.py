"""TurboQuant's stored format (vLLM `turboquant_*`): Lloyd-Max keys with an fp16 norm, uniform values.

    spec = TurboSpec("key", bits=3, group=128)
    qt = quantize_keys(k_rot, spec, boundaries)        # k_rot: [B, H_kv, T, D], already Hadamard-rotated
    k_hat = dequantize_keys(qt, centroids)             # float32 [B, H_kv, T, D]

Keys (per token and head): the L2 norm is stored in fp16 (accumulated in fp64, where each square is exact, then
rounded to fp32: torch's fp32 `norm` sums in an order that depends on the CPU's vector width and differs on CUDA,
so this is what kernels/turbo reproduces bit for bit); the unit vector's coordinates (about
N(0, 1/D) after the rotation) are each replaced by the index of the nearest centroid of the Lloyd-Max
codebook of N(0, 1/D). Dequantization looks the centroids up, re-normalises that vector to unit length
when `norm_correction` is on (vLLM's `_nc` presets), and scales it by the stored norm.
Values (per token and head): the harness's stock asymmetric min-max quantizer over the whole head_dim
(kernels/format.py; fp16 scale and zero, the same grid as vLLM's, which stores the minimum where the
harness stores the zero point -min/scale: 32 bits either way).
Codes of both are packed tight, 8 codes of b bits in b bytes (vLLM's layout, kernels/turbo/layout.py), not in
the 4-bit container kernels/format.py uses for INT3, so the bytes held are exactly what `bits_per_element` counts:
K `bits + 16 / D`, V `bits + 32 / D` per element. This module is the reference of the Triton kernels in
kernels/turbo (write path bit for bit, decode attention to fp32 rounding).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.format import QuantSpec, QuantizedTensor, quantize, unpack_codes
from kernels.turbo.layout import CODES_PER_WORD, KINDS, NORM_FLOOR, TIGHT_BITS

FP16_MAX = torch.finfo(torch.float16).max


@dataclass(frozen=True)
class TurboSpec:
    """How TurboQuant stores K or V: `kind` key (codebook + norm) or value (uniform + scale/zero).

    group = head_dim: one norm, or one scale and zero, per token and head. axis is always "token"
    (read by the cache and the fidelity task, as for a kernels.format.QuantSpec).
    """

    kind: str
    bits: int = 3
    group: int = 128
    norm_correction: bool = True
    axis: str = "token"
    scale_dtype: str = "float16"

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"TurboSpec kind must be one of {KINDS}, got {self.kind!r}.")
        if self.bits not in TIGHT_BITS:
            raise ValueError(f"TurboQuant codes are {TIGHT_BITS} bits, got {self.bits}.")
        if self.group % CODES_PER_WORD:
            raise ValueError(f"TurboQuant packs {CODES_PER_WORD} codes at a time; head_dim {self.group} "
                             "is not a multiple of that.")

    @property
    def torch_scale_dtype(self) -> torch.dtype:
        return torch.float16

    def bits_per_element(self) -> float:
        """Code bits plus fp16 metadata: one norm (keys) or a scale and a zero (values) per head_dim elements."""
        return self.bits + (16 if self.kind == "key" else 32) / self.group


# ---------------------------------------------------------------------------------------- packing
def pack_tight(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 codes [..., D] (< 2^bits) -> bytes [..., D * bits / 8]: each run of 8 codes is one little-endian
    word of 8 * bits bits, code j at bit j * bits."""
    words = codes.reshape(*codes.shape[:-1], -1, CODES_PER_WORD).to(torch.int64)          # [..., D/8, 8]
    shifts = torch.arange(CODES_PER_WORD, device=codes.device) * bits
    word = (words << shifts).sum(dim=-1, keepdim=True)                                    # [..., D/8, 1]
    byte_shifts = torch.arange(bits, device=codes.device) * 8
    return ((word >> byte_shifts) & 0xFF).to(torch.uint8).reshape(*codes.shape[:-1], -1)  # [..., D*b/8]


def unpack_tight(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of `pack_tight`: bytes [..., n] -> uint8 codes [..., n * 8 / bits]."""
    chunks = packed.reshape(*packed.shape[:-1], -1, bits).to(torch.int64)                 # [..., D/8, b]
    byte_shifts = torch.arange(bits, device=packed.device) * 8
    word = (chunks << byte_shifts).sum(dim=-1, keepdim=True)                              # [..., D/8, 1]
    shifts = torch.arange(CODES_PER_WORD, device=packed.device) * bits
    return ((word >> shifts) & (2 ** bits - 1)).to(torch.uint8).reshape(*packed.shape[:-1], -1)


# ---------------------------------------------------------------------------------------- keys
def _fp16(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-FP16_MAX, FP16_MAX).to(torch.float16)


def quantize_keys(x: torch.Tensor, spec: TurboSpec, boundaries: torch.Tensor) -> QuantizedTensor:
    """x [..., T, D] (rotated keys) -> tight codes [..., T, D*b/8], fp16 norm [..., T, 1], no zero ([..., T, 0]).

    boundaries [2^b - 1]: the codebook's sorted decision thresholds (a value on a threshold takes the upper cell).
    """
    x = x.float()
    norm = x.double().square().sum(dim=-1, keepdim=True).sqrt().float()  # [..., T, 1]: the same on every device
    unit = x / norm.clamp_min(NORM_FLOOR)                                 # [..., T, D]
    codes = torch.bucketize(unit, boundaries.to(unit.device, torch.float32), right=True).to(torch.uint8)
    return QuantizedTensor(codes=pack_tight(codes, spec.bits), scale=_fp16(norm),
                           zero=norm.new_empty(*norm.shape[:-1], 0, dtype=torch.float16), spec=spec,
                           head_dim=x.shape[-1])


def dequantize_keys(qt: QuantizedTensor, centroids: torch.Tensor) -> torch.Tensor:
    """float32 [..., T, D]: centroid vectors (re-normalised to unit length with norm correction) times the norm."""
    codes = unpack_tight(qt.codes, qt.spec.bits).long()                   # [..., T, D]
    unit = centroids.to(codes.device, torch.float32)[codes]              # [..., T, D]
    if qt.spec.norm_correction:
        unit = unit / unit.norm(dim=-1, keepdim=True)
    return unit * qt.scale.float()


# ---------------------------------------------------------------------------------------- values
def _uniform_spec(spec: TurboSpec) -> QuantSpec:
    return QuantSpec(bits=spec.bits, group=spec.group, axis="token", scale_dtype="float16")


def quantize_values(x: torch.Tensor, spec: TurboSpec) -> QuantizedTensor:
    """x [..., T, D] -> tight codes [..., T, D*b/8], fp16 scale and zero [..., T, 1] (stock asymmetric min-max)."""
    stock = quantize(x, _uniform_spec(spec))
    codes = unpack_codes(stock.codes, spec.bits)                          # [..., T, D]
    return QuantizedTensor(pack_tight(codes, spec.bits), stock.scale, stock.zero, spec, x.shape[-1])


def dequantize_values(qt: QuantizedTensor) -> torch.Tensor:
    """float32 [..., T, D] = (code - zero) * scale, one scale and zero per token and head."""
    codes = unpack_tight(qt.codes, qt.spec.bits).float()                  # [..., T, D]
    return (codes - qt.zero.float()) * qt.scale.float()

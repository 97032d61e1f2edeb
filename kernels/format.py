"""Reference (pure PyTorch) KV quantization primitives shared by every quantizer and kernel.

This module is the single definition of the stored format: the Triton kernels in `kernels/` must
reproduce its codes, scales and zeros bit-exactly, and the fake-quant path calls it directly. It
imports only torch, math and dataclasses so the GPU box and the kernels can import it cheaply.

    from kernels.format import QuantSpec, quantize, dequantize
    spec = QuantSpec(bits=2, group=128, clip_ratio=0.96)
    qt = quantize(k_rot, spec)          # k_rot: [B, H_kv, T, D]
    k_hat = dequantize(qt)              # float32, same shape

Every variant dequantizes with one formula, `x_hat = (code - zero) * scale` (METHOD_OSCAR §6):
* uniform asymmetric min-max (the released OSCAR quantizer, §6.1), fractional zero point;
* symmetric signed grid (BASELINES §2.1 convention (a)), stored as `code = q + 2^(bits-1)` with an
  integer zero so the same formula holds;
* Gaussian Lloyd-Max decision thresholds with a uniform reconstruction grid (§6.6, INT2 only);
* optional per-row quantile clipping before the range is measured (§5, token axis only).
Groups run along head_dim for each token ("token" axis) or along tokens for each channel
("channel" axis, KIVI keys). Codes are packed with the "quartered" layout of §6.4.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

CONTAINER_BITS = {2: 2, 3: 4, 4: 4, 8: 8}  # INT3 is stored in a 4-bit container
SCALE_DTYPES = {"float16": torch.float16, "float32": torch.float32, "bfloat16": torch.bfloat16}
AXES = ("token", "channel")
RANGE_FLOOR = 1e-8                 # smallest range (or max |x|) used to build a scale
LLOYD_MAX_THRESHOLD = 0.98107      # outer decision threshold of the 4-level Gaussian Lloyd-Max quantizer
LLOYD_MAX_OUTER_CENTROID = 1.50956
LLOYD_MAX_VARIANCE_FLOOR = 1e-8


@dataclass(frozen=True)
class QuantSpec:
    """How one tensor (K or V) is quantized and stored.

    axis="token": groups of `group` consecutive head_dim elements of each token.
    axis="channel": groups of `group` consecutive tokens of each channel (KIVI keys).
    clip_ratio: OSCAR per-row quantile clip (tau = sorted |x| at floor(ratio * D)), or None.
    lloyd_max / lm_ratio: §6.6 thresholds with a uniform grid stretched by lm_ratio (INT2 only).
    """

    bits: int = 2
    group: int = 128
    axis: str = "token"
    symmetric: bool = False
    scale_dtype: str = "float16"
    clip_ratio: float | None = None
    lloyd_max: bool = False
    lm_ratio: float = 1.16

    def __post_init__(self):
        if self.bits not in CONTAINER_BITS:
            raise ValueError(f"bits must be one of {sorted(CONTAINER_BITS)}, got {self.bits}.")
        if not isinstance(self.group, int) or self.group < 1:
            raise ValueError(f"group must be a positive integer, got {self.group!r}.")
        if self.axis not in AXES:
            raise ValueError(f"axis must be one of {AXES}, got {self.axis!r}.")
        if self.scale_dtype not in SCALE_DTYPES:
            raise ValueError(f"scale_dtype must be one of {sorted(SCALE_DTYPES)}, got {self.scale_dtype!r}.")
        if self.clip_ratio is not None and not 0.0 < self.clip_ratio <= 1.0:
            raise ValueError(f"clip_ratio must be in (0, 1] or None, got {self.clip_ratio}.")
        if self.clip_ratio is not None and self.axis == "channel":
            raise ValueError("clip_ratio clips whole head rows, so it is only defined for axis='token'.")
        self._check_lloyd_max()

    def _check_lloyd_max(self):
        if not self.lloyd_max:
            return
        if self.bits != 2:
            raise ValueError(f"lloyd_max thresholds are defined for 2 bits only, got bits={self.bits}.")
        if self.symmetric or self.axis != "token":
            raise ValueError("lloyd_max needs symmetric=False and axis='token'.")
        if self.lm_ratio <= 0:
            raise ValueError(f"lm_ratio must be positive, got {self.lm_ratio}.")

    @property
    def container_bits(self) -> int:
        """Storage bits per code (INT3 uses a 4-bit container)."""
        return CONTAINER_BITS[self.bits]

    @property
    def codes_per_byte(self) -> int:
        return 8 // self.container_bits

    @property
    def max_code(self) -> int:
        return 2 ** self.bits - 1

    @property
    def torch_scale_dtype(self) -> torch.dtype:
        return SCALE_DTYPES[self.scale_dtype]


@dataclass
class QuantizedTensor:
    """Packed codes plus per-group metadata for a `[..., T, D]` tensor.

    codes: uint8 `[..., T, D // spec.codes_per_byte]` (§6.4 layout along head_dim).
    scale, zero: spec.scale_dtype; token axis `[..., T, D // group]`, channel axis `[..., T // group, D]`.
    """

    codes: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor
    spec: QuantSpec
    head_dim: int


# ---------------------------------------------------------------------------------------- packing
def _container(bits: int) -> int:
    if bits not in CONTAINER_BITS:
        raise ValueError(f"bits must be one of {sorted(CONTAINER_BITS)}, got {bits}.")
    return CONTAINER_BITS[bits]


def _bit_offsets(per_byte: int, container: int, device) -> torch.Tensor:
    return torch.arange(per_byte, device=device, dtype=torch.int32) * container  # [p]


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack uint8 codes `[..., D]` into bytes `[..., D * container_bits / 8]`.

    With p codes per byte and n = D / p bytes, byte j holds the codes of coordinates j + m*n
    (m = 0..p-1) at bit offset m * container_bits (METHOD_OSCAR §6.4, generalised).
    """
    if codes.dtype != torch.uint8:
        raise ValueError(f"codes must be uint8, got {codes.dtype}.")
    container = _container(bits)
    if codes.shape[-1] % (8 // container) != 0:
        raise ValueError(f"last dim {codes.shape[-1]} is not divisible by {8 // container} codes per byte.")
    if codes.numel() and int(codes.max()) >= 2 ** container:
        raise ValueError(f"codes must be below {2 ** container} to fit a {container}-bit container.")
    return _pack(codes, container)


def _pack(codes: torch.Tensor, container: int) -> torch.Tensor:
    """pack_codes without validation (quantize produces valid codes; avoids a device sync)."""
    per_byte = 8 // container
    n_bytes = codes.shape[-1] // per_byte
    quarters = codes.reshape(*codes.shape[:-1], per_byte, n_bytes).to(torch.int32)  # [..., p, n]
    offsets = _bit_offsets(per_byte, container, codes.device)[:, None]                # [p, 1]
    return (quarters << offsets).sum(dim=-2).to(torch.uint8)                          # [..., n]


def unpack_codes(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of `pack_codes`: bytes `[..., n]` -> uint8 codes `[..., n * codes_per_byte]`."""
    if packed.dtype != torch.uint8:
        raise ValueError(f"packed codes must be uint8, got {packed.dtype}.")
    container = _container(bits)
    per_byte = 8 // container
    offsets = _bit_offsets(per_byte, container, packed.device)[:, None]               # [p, 1]
    fields = (packed.to(torch.int32).unsqueeze(-2) >> offsets) & (2 ** container - 1)  # [..., p, n]
    return fields.reshape(*packed.shape[:-1], -1).to(torch.uint8)                     # [..., p*n]


# ---------------------------------------------------------------------------------------- clipping
def clip_rows(x: torch.Tensor, ratio: float) -> torch.Tensor:
    """Clamp each row of `x` [..., D] to [-tau, tau], tau = sort_ascending(|x|)[floor(ratio * D)]."""
    head_dim = x.shape[-1]
    index = min(max(math.floor(ratio * head_dim), 0), head_dim - 1)
    tau = x.abs().sort(dim=-1).values[..., index:index + 1]  # [..., 1]
    return torch.minimum(torch.maximum(x, -tau), tau)


# ---------------------------------------------------------------------------------------- quantize
def _check_head_dim(head_dim: int, spec: QuantSpec) -> None:
    if head_dim % spec.codes_per_byte != 0:
        raise ValueError(f"head_dim {head_dim} is not divisible by {spec.codes_per_byte} codes per byte.")
    if spec.axis == "token" and head_dim % spec.group != 0:
        raise ValueError(f"group {spec.group} does not divide head_dim {head_dim}.")


def _check_shape(x: torch.Tensor, spec: QuantSpec) -> None:
    if not x.is_floating_point():
        raise ValueError(f"quantize expects a floating-point tensor, got {x.dtype}.")
    if x.dim() < 2:
        raise ValueError(f"quantize expects a [..., T, D] tensor, got shape {tuple(x.shape)}.")
    tokens = x.shape[-2]
    _check_head_dim(x.shape[-1], spec)
    if spec.axis == "channel" and tokens % spec.group != 0:
        raise ValueError(f"group {spec.group} does not divide the {tokens} tokens (channel axis).")


def _grouped(x: torch.Tensor, spec: QuantSpec) -> tuple[torch.Tensor, int]:
    """View x [..., T, D] with each group's elements along one dim; returns (view, that dim)."""
    *lead, tokens, head_dim = x.shape
    if spec.axis == "token":
        return x.reshape(*lead, tokens, head_dim // spec.group, spec.group), -1  # [..., T, D/G, G]
    return x.reshape(*lead, tokens // spec.group, spec.group, head_dim), -2     # [..., T/G, G, D]


def _stored(values: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """Round fp32 metadata to the storage dtype, saturating at its finite range, and return it as fp32."""
    info = torch.finfo(spec.torch_scale_dtype)
    return values.clamp(-info.max, info.max).to(spec.torch_scale_dtype).float()


def _stored_scale(scale: torch.Tensor, offset: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """Stored scale, raised where needed so the zero point (about offset / scale) stays finite.

    The floors are the dtype's smallest normal (a constant group never divides by zero) and
    |offset| / (max / 2) (a near-constant group far from 0 keeps |zero| below the dtype's max).
    Neither binds on ordinary data; both matter for fp16 metadata.
    """
    info = torch.finfo(spec.torch_scale_dtype)
    scale = torch.maximum(scale, offset.abs() / (info.max / 2))
    return _stored(scale, spec).clamp_min(info.tiny)


def _asymmetric(groups: torch.Tensor, dim: int, spec: QuantSpec):
    low = groups.amin(dim=dim, keepdim=True)
    high = groups.amax(dim=dim, keepdim=True)
    scale = _stored_scale((high - low).clamp_min(RANGE_FLOOR) / spec.max_code, low, spec)
    zero = _stored(-low / scale, spec)
    codes = torch.floor(groups / scale + zero + 0.5).clamp(0, spec.max_code)
    return codes, scale, zero


def _symmetric(groups: torch.Tensor, dim: int, spec: QuantSpec):
    half = 2 ** (spec.bits - 1)
    peak = groups.abs().amax(dim=dim, keepdim=True).clamp_min(RANGE_FLOOR)
    scale = _stored_scale(peak / (half - 1), torch.zeros_like(peak), spec)
    signed = torch.floor(groups / scale + 0.5).clamp(-half, half - 1)
    return signed + half, scale, torch.full_like(scale, float(half))


def _lloyd_max(groups: torch.Tensor, dim: int, spec: QuantSpec):
    mean = groups.mean(dim=dim, keepdim=True)
    std = torch.sqrt(((groups - mean) ** 2).mean(dim=dim, keepdim=True) + LLOYD_MAX_VARIANCE_FLOOR)
    z = (groups - mean) / std
    codes = (z >= -LLOYD_MAX_THRESHOLD).float() + (z >= 0).float() + (z >= LLOYD_MAX_THRESHOLD).float()
    scale = _stored_scale((2 * LLOYD_MAX_OUTER_CENTROID / 3) * spec.lm_ratio * std, mean, spec)
    zero = _stored(1.5 - mean / scale, spec)
    return codes, scale, zero


def quantize(x: torch.Tensor, spec: QuantSpec) -> QuantizedTensor:
    """Quantize x [..., T, D] (fp32 math) into packed codes and stored-dtype scale/zero."""
    _check_shape(x, spec)
    x = x.float()
    if spec.clip_ratio is not None:
        x = clip_rows(x, spec.clip_ratio)
    groups, dim = _grouped(x, spec)
    variant = _lloyd_max if spec.lloyd_max else _symmetric if spec.symmetric else _asymmetric
    codes, scale, zero = variant(groups, dim, spec)
    codes = codes.to(torch.uint8).reshape(x.shape)  # [..., T, D]
    return QuantizedTensor(
        codes=_pack(codes, spec.container_bits),
        scale=scale.squeeze(dim).to(spec.torch_scale_dtype),
        zero=zero.squeeze(dim).to(spec.torch_scale_dtype),
        spec=spec,
        head_dim=x.shape[-1],
    )


def dequantize(qt: QuantizedTensor) -> torch.Tensor:
    """float32 reconstruction `(code - zero) * scale`, shape [..., T, D]."""
    codes = unpack_codes(qt.codes, qt.spec.bits).float()  # [..., T, D]
    groups, dim = _grouped(codes, qt.spec)
    scale = qt.scale.float().unsqueeze(dim)
    zero = qt.zero.float().unsqueeze(dim)
    return ((groups - zero) * scale).reshape(codes.shape)


def bits_per_element(spec: QuantSpec, head_dim: int) -> float:
    """Stored bits per element of the quantized region: container bits + scale and zero per group.

    Symmetric specs still store a (constant) zero slot, so INT2 G=128 fp16 reports 2.25 (BASELINES §2.1).
    """
    _check_head_dim(head_dim, spec)
    metadata_bits = torch.finfo(spec.torch_scale_dtype).bits
    return spec.container_bits + 2 * metadata_bits / spec.group

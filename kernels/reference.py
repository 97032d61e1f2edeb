"""Pure-PyTorch oracle of the write-path kernel (kernels/quant.py), with its signature (fp32 math).

It wraps `kernels.format` (the single definition of the stored format). The decode oracle lives beside
the decode kernels: kernels/decode/reference.py.
"""
from __future__ import annotations

import torch

from kernels.format import QuantSpec, quantize


def quantize_pack_reference(x: torch.Tensor, spec: QuantSpec, rotation: torch.Tensor | None = None):
    """Rotate (optional: `x @ R` in fp32, rounded to x's dtype as the harness stores rotated rows), clip, quantize
    and pack x [..., T, D] -> (codes, scale, zero)."""
    if rotation is not None:
        x = (x.float() @ rotation.float()).to(x.dtype)  # [..., T, D]
    qt = quantize(x.float(), spec)
    return qt.codes, qt.scale, qt.zero

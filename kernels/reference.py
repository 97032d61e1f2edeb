"""Pure-PyTorch oracle of the write-path kernel (kernels/quant.py), with its signature (fp32 math).

It wraps `kernels.format` (the single definition of the stored format). The decode oracle lives beside
the decode kernels: kernels/decode/reference.py.
"""
from __future__ import annotations

import torch

from kernels.format import QuantSpec, quantize


def quantize_pack_reference(x: torch.Tensor, spec: QuantSpec, rotation: torch.Tensor | None = None):
    """Rotate (optional, fp32 `x @ R`), clip, quantize and pack x [..., T, D] -> (codes, scale, zero)."""
    x = x.float()
    if rotation is not None:
        x = x @ rotation.float()  # [..., T, D]
    qt = quantize(x, spec)
    return qt.codes, qt.scale, qt.zero

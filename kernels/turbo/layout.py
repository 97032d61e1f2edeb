"""TurboQuant's stored layout (vLLM `turboquant_*`): the constants its reference (baselines/turboquant_format.py)
and its Triton kernels (kernels/turbo) share, and the shapes of its parts.

Per token and KV head, for head_dim D and b-bit codes:
* keys: codes [D * b / 8] uint8, the L2 norm [1] fp16, no zero point ([0]);
* values: codes [D * b / 8] uint8, scale [1] and zero [1] fp16.
The codes of a row are one little-endian bit stream, coordinate d at bits d*b .. d*b + b - 1: each run of
8 codes is a word of b bytes (vLLM's tight layout, not kernels/format.py's 4-bit container for INT3).
"""
from __future__ import annotations

import torch

TIGHT_BITS = (2, 3, 4)
CODES_PER_WORD = 8                 # 8 codes of b bits fill exactly b bytes
NORM_FLOOR = 1e-30                 # a zero key has a zero norm; its (unused) unit vector is taken as 0
KINDS = ("key", "value")


def part_shapes(shape, spec) -> dict[str, tuple[list[int], torch.dtype]]:
    """{part: (shape, dtype)} of rows of `shape` [..., T, D] stored per `spec` (kind "key" or "value", bits)."""
    *lead, tokens, head_dim = shape
    zero_width = 0 if spec.kind == "key" else 1
    return {"codes": ([*lead, tokens, head_dim * spec.bits // 8], torch.uint8),
            "scale": ([*lead, tokens, 1], torch.float16),
            "zero": ([*lead, tokens, zero_width], torch.float16)}

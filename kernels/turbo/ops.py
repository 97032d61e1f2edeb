"""`TurboKernels`: TurboQuant's write and decode kernels with its codebook bound (the interface of kernels/ops.py)."""
from __future__ import annotations

import torch

from kernels.turbo.decode import centroid_byte_table, decode_attention_turbo
from kernels.turbo.layout import part_shapes
from kernels.turbo.write import quantize_pack_turbo


class TurboKernels:
    """The kernels of one codebook: centroids fp32 [2^b] and their boundaries fp32 [2^b - 1] (sorted), copied once
    to each device that asks for them (a CUDA graph replays the copies' addresses)."""

    def __init__(self, centroids: torch.Tensor, boundaries: torch.Tensor):
        self.centroids, self.boundaries = centroids.float().contiguous(), boundaries.float().contiguous()
        self.byte_table = centroid_byte_table(self.centroids)
        self._on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def codebook(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(centroids, boundaries) on `device`."""
        if device not in self._on:
            self._on[device] = (self.centroids.to(device), self.boundaries.to(device))
        return self._on[device]

    def quantize_pack(self, rows: torch.Tensor, spec):
        return quantize_pack_turbo(rows, spec, self.codebook(rows.device)[1])

    def part_shapes(self, shape, spec) -> dict[str, tuple[list[int], torch.dtype]]:
        return part_shapes(shape, spec)

    def decode_attention(self, q, *operands, **kwargs) -> torch.Tensor:
        return decode_attention_turbo(q, *operands, centroids=self.codebook(q.device)[0], byte_table=self.byte_table,
                                      **kwargs)

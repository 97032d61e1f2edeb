"""Hadamard matrices: the data-free rotations of QuaRot / SAW-INT4, and OSCAR's H factor.

Row-vector convention: a rotation R [D, D] acts as `x -> x @ R` on the last dim.

    from harness.hadamard import hadamard, block_hadamard
    H = hadamard(128)                 # [128, 128] float64, H = H^T = H^-1
"""
from __future__ import annotations

import math

import torch


def log2_exact(d: int, what: str) -> int:
    if not isinstance(d, int) or d < 1 or d & (d - 1):
        raise ValueError(f"{what} must be a power of two, got {d}.")
    return d.bit_length() - 1


def hadamard(d: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Normalised Sylvester Hadamard [d, d] (scipy.linalg.hadamard / sqrt(d)): H[i, j] = (-1)^popcount(i & j) /
    sqrt(d); H = H^T = H^-1."""
    from scipy.linalg import hadamard as sylvester
    log2_exact(d, "Hadamard size")
    return torch.from_numpy(sylvester(d)).to(dtype) / math.sqrt(d)


def block_hadamard(d: int, block: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Block-diagonal [d, d] with d / block copies of hadamard(block) (SAW-INT4, OSCAR-fork QuaRot)."""
    log2_exact(block, "Hadamard block size")
    if d < 1 or d % block != 0:
        raise ValueError(f"Hadamard block size {block} does not divide dimension {d}.")
    return torch.kron(torch.eye(d // block, dtype=dtype), hadamard(block, dtype))

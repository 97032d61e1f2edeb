"""Choose between the Triton kernels and the pure-PyTorch references for a device."""
from __future__ import annotations

import os

import torch

MODES = ("auto", "triton", "reference")
HEAD_DIMS = (64, 128, 256)   # the head_dims every Triton kernel (write, decode, TurboQuant) is built for


def interpreter_forced() -> bool:
    """True when TRITON_INTERPRET=1 makes Triton kernels runnable on CPU tensors."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def use_triton(device: torch.device | str, mode: str = "auto") -> bool:
    """Whether to run the Triton kernels on `device` under `mode` ("auto", "triton" or "reference").

    auto: Triton on CUDA, the reference on CPU unless TRITON_INTERPRET=1 is set.
    """
    if mode not in MODES:
        raise ValueError(f"kernel mode must be one of {MODES}, got {mode!r}.")
    runnable = torch.device(device).type == "cuda" or interpreter_forced()
    if mode == "triton" and not runnable:
        raise ValueError(f"mode='triton' needs a CUDA device or TRITON_INTERPRET=1, got device {device}.")
    return mode != "reference" and runnable


def unsupported_head_dim(head_dim: int) -> str | None:
    """One sentence when the Triton kernels have no build for `head_dim`, else None."""
    if head_dim in HEAD_DIMS:
        return None
    return (f"the Triton kernels take head_dim {', '.join(map(str, HEAD_DIMS))}; this model's is {head_dim}")

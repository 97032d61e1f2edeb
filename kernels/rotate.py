"""A fixed rotation of head rows in fp32, one launch: (x.float() @ R - offset) cast back.

    rotate_rows(x, rotation, offset=None, out_dtype=None)

x [B, H, T, D] (any strides, any float dtype), rotation [D, D] fp32, offset [H, D] fp32 or None (subtracted per head
after the rotation: the centred keys of `harness.cache`). Returns a contiguous [B, H, T, D] tensor in out_dtype
(default x.dtype). What `rotate_rows_reference` computes with an upcast, a cuBLAS fp32 GEMM, a subtraction and a
cast, in one kernel. On an H200 cuBLAS ran one of a decode step's three fp32 rotations per layer (query, new key,
attention output) as an FFMA GEMM of ~52 us, and the rotations with their casts took OSCAR's batch-1 step at 100k to
7.3 ms against 4.6 ms with bf16 rotations; through this kernel 4.7 ms (results/bench/bench_throughput_rotate_rows.md).

The products accumulate in fp32 FMAs (`input_precision="ieee"`, no TF32), each output over the head_dim in the same
order whatever the number of rows or the tile, so a row's result does not depend on the rows launched with it (the
interpreter sums each row's products itself: numpy's matmul did not keep that on every CPU).
"""
from __future__ import annotations

from contextlib import nullcontext

import torch
import triton
import triton.language as tl

from kernels.dispatch import HEAD_DIMS, interpreter_forced
from kernels.step_rows import _cast


@triton.jit
def _rotate_rows_kernel(x_ptr, r_ptr, off_ptr, y_ptr, n_rows, heads, tokens, s_xb, s_xh, s_xt, s_xd,
                        D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        HAS_OFFSET: tl.constexpr, INTERPRET: tl.constexpr):
    """Program (row block, column block): BLOCK_M flat rows (b, h, t) x BLOCK_N output coordinates."""
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)      # [BLOCK_M]
    row_ok = rows < n_rows
    t, bh = rows % tokens, rows // tokens
    h, b = bh % heads, bh // heads
    x_rows = x_ptr + b * s_xb + h * s_xh + t * s_xt                               # [BLOCK_M] pointers
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)                    # [BLOCK_N]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in tl.static_range(0, D, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_rows[:, None] + ks[None, :] * s_xd, mask=row_ok[:, None], other=0.0).to(tl.float32)
        r = tl.load(r_ptr + ks[:, None] * D + cols[None, :])                     # [BLOCK_K, BLOCK_N] fp32
        if INTERPRET:   # numpy's matmul sums in an order that depends on the block's rows on some CPUs
            acc += tl.sum(x[:, :, None] * r[None, :, :], axis=1)
        else:
            acc = tl.dot(x, r, acc, input_precision="ieee")
    if HAS_OFFSET:
        acc -= tl.load(off_ptr + h[:, None] * D + cols[None, :])
    out = y_ptr + rows[:, None] * D + cols[None, :]
    tl.store(out, _cast(acc, y_ptr.dtype.element_ty, INTERPRET), mask=row_ok[:, None])


def rotate_rows_reference(x: torch.Tensor, rotation: torch.Tensor, offset: torch.Tensor | None = None,
                          out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The expression the kernel replaces: (x @ R - offset[h]) in the rotation's dtype (any: also the model's,
    `rotation_dtype=model`), then out_dtype (default x.dtype)."""
    y = x.to(rotation.dtype) @ rotation                                           # [B, H, T, D]
    if offset is not None:
        y = y - offset[None, :, None, :]
    return y.to(out_dtype or x.dtype)


def rotation_kernel_serves(x: torch.Tensor, rotation: torch.Tensor) -> bool:
    """Whether `rotate_rows` takes these operands: an fp32 rotation of a head_dim the kernels are built for, on a
    CUDA tensor (or any under TRITON_INTERPRET=1)."""
    return (rotation.dtype == torch.float32 and x.shape[-1] in HEAD_DIMS and x.dim() == 4
            and (x.is_cuda or interpreter_forced()))


def _check(x, rotation, offset) -> None:
    """A one-sentence ValueError for operands that do not fit together."""
    head_dim = x.shape[-1]
    if x.dim() != 4 or head_dim not in HEAD_DIMS:
        raise ValueError(f"rotate_rows takes [B, H, T, D] rows with D in {HEAD_DIMS}, got {list(x.shape)}.")
    if rotation.shape != (head_dim, head_dim) or rotation.dtype != torch.float32 or not rotation.is_contiguous():
        raise ValueError(f"rotate_rows needs a contiguous fp32 [{head_dim}, {head_dim}] rotation, got "
                         f"{rotation.dtype} {list(rotation.shape)}.")
    if offset is not None and (offset.shape != (x.shape[1], head_dim) or offset.dtype != torch.float32
                               or not offset.is_contiguous()):
        raise ValueError(f"rotate_rows needs a contiguous fp32 offset [{x.shape[1]}, {head_dim}], got "
                         f"{offset.dtype} {list(offset.shape)}.")


def rotate_rows(x: torch.Tensor, rotation: torch.Tensor, offset: torch.Tensor | None = None,
                out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """(x.float() @ rotation - offset[h]) in out_dtype, one launch; x [B, H, T, D] -> contiguous [B, H, T, D]."""
    _check(x, rotation, offset)
    batch, heads, tokens, head_dim = x.shape
    y = torch.empty(x.shape, dtype=out_dtype or x.dtype, device=x.device)
    n_rows = batch * heads * tokens
    if n_rows == 0:
        return y
    interpret = interpreter_forced()
    # the interpreter runs a program's tile as one numpy expression ([M, K, N] products summed over K): few, large
    # programs there, within Triton's largest tensor
    widest = max(16, tl.TRITON_MAX_TENSOR_NUMEL // head_dim ** 2)
    block_m = min(max(16, triton.next_power_of_2(n_rows)), widest) if interpret else (16 if n_rows <= 256 else 64)
    block_n = head_dim if interpret else min(64, head_dim)
    block_k = head_dim if interpret else 32
    with torch.cuda.device(x.device) if x.is_cuda else nullcontext():      # Triton launches on the current GPU
        _rotate_rows_kernel[(triton.cdiv(n_rows, block_m), head_dim // block_n)](
            x, rotation, rotation if offset is None else offset, y, n_rows, heads, tokens, *x.stride(),
            D=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, HAS_OFFSET=offset is not None,
            INTERPRET=interpret, num_warps=4)
    return y

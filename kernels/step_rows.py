"""One launch for a decode step's new K and V rows into a frozen cache's full-precision buffers.

    write_step_rows(key_buffer, value_buffer, keys, values, write_pos)

keys / values [B, H_kv, 1, D] are stored at row write_pos[0] (a device int64 [1], so a CUDA graph replays the
write at each step's row) of key_buffer / value_buffer [B, H_kv, capacity, D], cast to the buffers' dtype: what
`write_step_rows_reference` (two `index_copy_` calls, each after its own cast when the rows arrive in another
dtype) does, bit for bit, in one kernel instead of two to four (harness/static_cache.py, `StaticState.write`).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.dispatch import interpreter_forced
from kernels.quant import _round_bf16


@triton.jit
def _cast(x, dtype: tl.constexpr, INTERPRET: tl.constexpr):
    """x in the buffer's dtype. The interpreter's cast to bf16 truncates: there x is rounded to nearest even by bits
    first (NaN kept), so the cast is exact, as on the GPU."""
    if INTERPRET and dtype == tl.bfloat16:
        wide = x.to(tl.float32)
        x = tl.where(wide == wide, _round_bf16(wide), wide)
    return x.to(dtype)


@triton.jit
def _write_step_rows_kernel(k_buf, v_buf, k_src, v_src, pos_ptr, kv_heads,
                            s_kb_b, s_kb_h, s_kb_t, s_kb_d, s_vb_b, s_vb_h, s_vb_t, s_vb_d,
                            s_k_b, s_k_h, s_k_d, s_v_b, s_v_h, s_v_d,
                            D: tl.constexpr, BLOCK_D: tl.constexpr, INTERPRET: tl.constexpr):
    """Program (b * H_kv + h): the key and the value row of sequence b, KV head h."""
    unit = tl.program_id(0)
    b, h = (unit // kv_heads).to(tl.int64), (unit % kv_heads).to(tl.int64)
    pos = tl.load(pos_ptr)
    d = tl.arange(0, BLOCK_D)
    ok = d < D
    key = tl.load(k_src + b * s_k_b + h * s_k_h + d * s_k_d, mask=ok)                   # [BLOCK_D]
    value = tl.load(v_src + b * s_v_b + h * s_v_h + d * s_v_d, mask=ok)
    key_row = k_buf + b * s_kb_b + h * s_kb_h + pos * s_kb_t
    value_row = v_buf + b * s_vb_b + h * s_vb_h + pos * s_vb_t
    tl.store(key_row + d * s_kb_d, _cast(key, k_buf.dtype.element_ty, INTERPRET), mask=ok)
    tl.store(value_row + d * s_vb_d, _cast(value, v_buf.dtype.element_ty, INTERPRET), mask=ok)


def _check(key_buffer, value_buffer, keys, values, write_pos) -> None:
    """A one-sentence ValueError for rows, buffers or a position that do not fit together."""
    for name, rows, buffer in (("keys", keys, key_buffer), ("values", values, value_buffer)):
        if buffer.dim() != 4 or list(rows.shape) != [*buffer.shape[:2], 1, buffer.shape[-1]]:
            raise ValueError(f"{name} must be [B, H_kv, 1, D] rows of a [B, H_kv, capacity, D] buffer, got "
                             f"{list(rows.shape)} for {list(buffer.shape)}.")
    if keys.shape != values.shape:
        raise ValueError(f"keys and values must have the same shape, got {list(keys.shape)} and "
                         f"{list(values.shape)}.")
    if write_pos.dtype != torch.int64 or write_pos.numel() != 1:
        raise ValueError(f"write_pos must be one int64, got {write_pos.dtype} of {write_pos.numel()} elements.")


def write_step_rows_reference(key_buffer, value_buffer, keys, values, write_pos) -> None:
    """The two index copies the kernel replaces."""
    key_buffer.index_copy_(2, write_pos, keys.to(key_buffer.dtype))
    value_buffer.index_copy_(2, write_pos, values.to(value_buffer.dtype))


def write_step_rows(key_buffer, value_buffer, keys, values, write_pos) -> None:
    """Store one step's key and value rows [B, H_kv, 1, D] at row write_pos[0] of the buffers (one launch)."""
    _check(key_buffer, value_buffer, keys, values, write_pos)
    batch, kv_heads, _, head_dim = keys.shape
    if batch * kv_heads == 0:
        return
    _write_step_rows_kernel[(batch * kv_heads,)](
        key_buffer, value_buffer, keys, values, write_pos, kv_heads,
        *key_buffer.stride(), *value_buffer.stride(),
        keys.stride(0), keys.stride(1), keys.stride(3), values.stride(0), values.stride(1), values.stride(3),
        D=head_dim, BLOCK_D=triton.next_power_of_2(head_dim), num_warps=1,
        INTERPRET=interpreter_forced(),
    )

"""One launch for a decode step's new K and V rows into a frozen cache's full-precision buffers.

    write_step_rows(key_buffer, value_buffer, keys, values, write_pos)
    write_step_rows(key_buffer, value_buffer, keys, values, write_pos, key_rotation=R_K, key_offset=m)

keys / values [B, H_kv, 1, D] are stored at row write_pos[0] (a device int64 [1], so a CUDA graph replays the
write at each step's row) of key_buffer / value_buffer [B, H_kv, capacity, D], cast to the buffers' dtype: what
`write_step_rows_reference` (two `index_copy_` calls, each after its own cast when the rows arrive in another
dtype) does, bit for bit, in one kernel instead of two to four (harness/static_cache.py, `StaticState.write`).
With a key rotation R_K [D, D] and / or a key offset m [1, H_kv, 1, D] (one dtype, the cache's rotation dtype) the
keys are stored as `transform_keys_reference` makes them (k @ R_K - m, each rounding where it rounds), so the step
needs no GEMM of its own for its key; the products are summed in fp32 in another order than a GEMM's, so a stored
key may differ from the reference's by one rounding of the rotation dtype.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.decode.common import _row_times_columns
from kernels.dispatch import interpreter_forced
from kernels.quant import _round_bf16

ROTATION_TILE = 8192      # elements of R_K one program holds at once ([D, BLOCK_J]: 64 per thread in 4 warps)


@triton.jit
def _cast(x, dtype: tl.constexpr, INTERPRET: tl.constexpr):
    """x in the buffer's dtype. The interpreter's cast to bf16 truncates: there x is rounded to nearest even by bits
    first (NaN kept), so the cast is exact, as on the GPU."""
    if INTERPRET and dtype == tl.bfloat16:
        wide = x.to(tl.float32)
        x = tl.where(wide == wide, _round_bf16(wide), wide)
    return x.to(dtype)


@triton.jit
def _transformed_key(key_src, rot_ptr, off_ptr, d, ok, j, j_ok, D: tl.constexpr, ROTATE: tl.constexpr,
                     OFFSET: tl.constexpr, INTERPRET: tl.constexpr):
    """Columns j of (k @ R_K - m) for one key row, rounded where `transform_keys_reference` rounds, in the rows'
    dtype: key_src the row's first element, off_ptr the head's offsets [D] (R_K's dtype, or their own)."""
    t_ty: tl.constexpr = rot_ptr.dtype.element_ty if ROTATE else off_ptr.dtype.element_ty
    if ROTATE:
        x = _cast(tl.load(key_src + d, mask=ok, other=0.0), t_ty, INTERPRET).to(tl.float32)      # [BLOCK_D]
        y = _cast(_row_times_columns(x, rot_ptr, d, ok, j, j_ok, D), t_ty, INTERPRET)           # [BLOCK_J]
    else:
        y = _cast(tl.load(key_src + j, mask=j_ok, other=0.0), t_ty, INTERPRET)
    if OFFSET:
        m = tl.load(off_ptr + j, mask=j_ok, other=0.0)
        y = _cast(y.to(tl.float32) - m.to(tl.float32), t_ty, INTERPRET)
    return _cast(y, key_src.dtype.element_ty, INTERPRET)


@triton.jit
def _write_step_rows_kernel(k_buf, v_buf, k_src, v_src, pos_ptr, rot_ptr, off_ptr, kv_heads,
                            s_kb_b, s_kb_h, s_kb_t, s_kb_d, s_vb_b, s_vb_h, s_vb_t, s_vb_d,
                            s_k_b, s_k_h, s_v_b, s_v_h, s_v_d,
                            D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_J: tl.constexpr, ROTATE: tl.constexpr,
                            OFFSET: tl.constexpr, INTERPRET: tl.constexpr):
    """Program (b * H_kv + h): the key and the value row of sequence b, KV head h (the key through R_K and the
    offset when given, BLOCK_J columns at a time); the keys' last dim contiguous."""
    unit = tl.program_id(0)
    b, h = (unit // kv_heads).to(tl.int64), (unit % kv_heads).to(tl.int64)
    pos = tl.load(pos_ptr)
    d = tl.arange(0, BLOCK_D)
    ok = d < D
    value = tl.load(v_src + b * s_v_b + h * s_v_h + d * s_v_d, mask=ok)                  # [BLOCK_D]
    value_row = v_buf + b * s_vb_b + h * s_vb_h + pos * s_vb_t
    tl.store(value_row + d * s_vb_d, _cast(value, v_buf.dtype.element_ty, INTERPRET), mask=ok)
    key_src, key_row = k_src + b * s_k_b + h * s_k_h, k_buf + b * s_kb_b + h * s_kb_h + pos * s_kb_t
    for j0 in tl.static_range(0, BLOCK_D, BLOCK_J):
        j = j0 + tl.arange(0, BLOCK_J)
        j_ok = j < D
        if ROTATE or OFFSET:
            key = _transformed_key(key_src, rot_ptr, off_ptr + h * D, d, ok, j, j_ok, D, ROTATE, OFFSET, INTERPRET)
        else:
            key = tl.load(key_src + j, mask=j_ok)                                        # [BLOCK_J]
        tl.store(key_row + j * s_kb_d, _cast(key, k_buf.dtype.element_ty, INTERPRET), mask=j_ok)


def _check(key_buffer, value_buffer, keys, values, write_pos, key_rotation, key_offset) -> None:
    """A one-sentence ValueError for rows, buffers, a position or a key transform that do not fit together."""
    for name, rows, buffer in (("keys", keys, key_buffer), ("values", values, value_buffer)):
        if buffer.dim() != 4 or list(rows.shape) != [*buffer.shape[:2], 1, buffer.shape[-1]]:
            raise ValueError(f"{name} must be [B, H_kv, 1, D] rows of a [B, H_kv, capacity, D] buffer, got "
                             f"{list(rows.shape)} for {list(buffer.shape)}.")
    if keys.shape != values.shape:
        raise ValueError(f"keys and values must have the same shape, got {list(keys.shape)} and "
                         f"{list(values.shape)}.")
    if write_pos.dtype != torch.int64 or write_pos.numel() != 1:
        raise ValueError(f"write_pos must be one int64, got {write_pos.dtype} of {write_pos.numel()} elements.")
    kv_heads, head_dim = keys.shape[1], keys.shape[-1]
    for name, part, shape in (("key_rotation", key_rotation, (head_dim, head_dim)),
                              ("key_offset", key_offset, (1, kv_heads, 1, head_dim))):
        if part is not None and (tuple(part.shape) != shape or not part.is_floating_point()
                                 or part.device != keys.device):
            raise ValueError(f"{name} must be a floating {list(shape)} tensor on {keys.device}, got {part.dtype} "
                             f"{list(part.shape)} on {part.device}.")
    if key_rotation is not None and key_offset is not None and key_rotation.dtype != key_offset.dtype:
        raise ValueError(f"key_rotation and key_offset must share a dtype, got {key_rotation.dtype} and "
                         f"{key_offset.dtype}.")


def transform_keys_reference(keys: torch.Tensor, key_rotation: torch.Tensor | None = None,
                             key_offset: torch.Tensor | None = None) -> torch.Tensor:
    """k @ R_K - m (each part only if given) in their dtype, back in the keys' dtype; [B, H_kv, T, D] in and out."""
    if key_rotation is None and key_offset is None:
        return keys
    out = keys.to((key_rotation if key_rotation is not None else key_offset).dtype)
    if key_rotation is not None:
        out = out @ key_rotation
    if key_offset is not None:
        out = out - key_offset
    return out.to(keys.dtype)


def write_step_rows_reference(key_buffer, value_buffer, keys, values, write_pos, key_rotation=None,
                              key_offset=None) -> None:
    """The key transform (`transform_keys_reference`) and the two index copies the kernel replaces."""
    keys = transform_keys_reference(keys, key_rotation, key_offset)
    key_buffer.index_copy_(2, write_pos, keys.to(key_buffer.dtype))
    value_buffer.index_copy_(2, write_pos, values.to(value_buffer.dtype))


def write_step_rows(key_buffer, value_buffer, keys, values, write_pos, key_rotation=None, key_offset=None) -> None:
    """Store one step's key and value rows [B, H_kv, 1, D] at row write_pos[0] of the buffers (one launch), the keys
    as `transform_keys_reference(keys, key_rotation, key_offset)`."""
    _check(key_buffer, value_buffer, keys, values, write_pos, key_rotation, key_offset)
    batch, kv_heads, _, head_dim = keys.shape
    if batch * kv_heads == 0:
        return
    keys = keys if keys.stride(3) == 1 else keys.contiguous()
    rotation = None if key_rotation is None else key_rotation.contiguous()
    offset = None if key_offset is None else key_offset.reshape(kv_heads, head_dim).contiguous()   # [H_kv, D]
    block_d = triton.next_power_of_2(head_dim)
    _write_step_rows_kernel[(batch * kv_heads,)](
        key_buffer, value_buffer, keys, values, write_pos,
        keys if rotation is None else rotation, keys if offset is None else offset, kv_heads,
        *key_buffer.stride(), *value_buffer.stride(),
        keys.stride(0), keys.stride(1), values.stride(0), values.stride(1), values.stride(3),
        D=head_dim, BLOCK_D=block_d, BLOCK_J=min(block_d, ROTATION_TILE // block_d) if rotation is not None else
        block_d, ROTATE=rotation is not None, OFFSET=offset is not None, INTERPRET=interpreter_forced(),
        num_warps=1 if rotation is None else 4,
    )

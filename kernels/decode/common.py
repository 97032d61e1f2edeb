"""Shapes, layout codes and field-unpack constants of the decode kernels, and the online-softmax steps
shared by the packed-history and full-precision stage-1 loops."""
from __future__ import annotations

import triton
import triton.language as tl

HEAD_DIMS = (64, 128, 256)
MAX_ROWS = 128            # GROUP * T_q query rows per KV head
ROW_BLOCK = 16            # query rows per program (the MMA's M)
WARP_TILE_ROWS = 8        # query rows per program with DecodeConfig.warp_tiles (the MMA's N), up to GQA 8
TOKEN, TOKEN_GROUPED, CHANNEL = 0, 1, 2
LOG2E = 1.4426950408889634
FIELD_EXACT, FIELD_TINY = tl.constexpr(0), tl.constexpr(1)  # `_field` modes
TINY_SCALE = tl.constexpr(16777216.0)  # 2^24: FIELD_TINY values are 2^-24 * 2^(f*bits) * code


@triton.jit
def _softmax_step(qk, m_i, l_i):
    """One base-2 online-softmax step; rows with no valid key so far stay at m=-inf, l=0."""
    m_new = tl.maximum(m_i, tl.max(qk, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(qk - m_safe[:, None])                                              # [BLOCK_R, BLOCK_N]
    return p, alpha, m_new, l_i * alpha + tl.sum(p, axis=1)


@triton.jit
def _split_bounds(lo, hi, split, n_splits, BLOCK: tl.constexpr):
    """[start, end) of this split of [lo, hi), in whole tiles of BLOCK tokens."""
    per_split = tl.cdiv(tl.cdiv(tl.maximum(hi - lo, 0), n_splits), BLOCK) * BLOCK
    start = lo + split * per_split
    return start, tl.minimum(start + per_split, hi)


@triton.jit
def _store_lse(part_lse_ptr, slot, row_ok, m_i, l_i):
    """Store base-2 log-sum-exp (-inf for rows without keys); return the safe normalizer."""
    has_keys = l_i > 0
    l_safe = tl.where(has_keys, l_i, 1.0)
    tl.store(part_lse_ptr + slot, tl.where(has_keys, m_i + tl.log2(l_safe), float("-inf")), mask=row_ok)
    return l_safe

"""Shapes, layout codes and field-unpack constants of the decode kernels, and the online-softmax steps
shared by the packed-history and full-precision stage-1 loops."""
from __future__ import annotations

import triton
import triton.language as tl

MAX_ROWS = 128            # GROUP * T_q query rows per KV head
ROW_BLOCK = 16            # query rows per program (the MMA's M)
WARP_TILE_ROWS = 8        # query rows per program with DecodeConfig.warp_tiles (the MMA's N), up to GQA 8
PAIR_TILE_ROWS = 4        # the same over token pairs with up to 4 query rows (`four_row_pairs`)
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


@triton.jit
def _program_ids():
    """(split, b * H_kv + h, row block) of a stage-1 program. The grid is (row blocks, splits, B * H_kv): the row
    blocks of one split, which read the same history tiles, are neighbours in launch order, so all but the first
    find the tiles in L2 (`run_split_k`)."""
    return tl.program_id(1), tl.program_id(2), tl.program_id(0)


@triton.jit
def _program_rows(kv_heads, q_tokens, n_rows, n_splits, stride_qb, stride_qh, stride_qt,
                  GROUP: tl.constexpr, BLOCK_R: tl.constexpr):
    """Who a stage-1 program (`_program_ids`) is: its split, sequence b and KV head h (int64), its query rows
    (head-major: GROUP heads x T_q tokens) [BLOCK_R], their mask, q offsets and partial-output slots."""
    split, bh, row_block = _program_ids()
    b = (bh // kv_heads).to(tl.int64)
    h = (bh % kv_heads).to(tl.int64)
    rows = row_block * BLOCK_R + tl.arange(0, BLOCK_R)                             # [BLOCK_R] query rows
    row_ok = rows < n_rows
    q_rows = b * stride_qb + (h * GROUP + rows // q_tokens) * stride_qh + (rows % q_tokens) * stride_qt
    slot = (bh.to(tl.int64) * n_splits + split) * n_rows + rows                    # [BLOCK_R]
    return split, b, h, rows, row_ok, q_rows, slot


@triton.jit
def _load_query(q_ptr, q_rows, row_ok, qk_scale, D: tl.constexpr, FP16: tl.constexpr):
    """The program's query rows times qk_scale, [BLOCK_R, D] in the dot dtype (fp16 on the GPU, else fp32)."""
    d = tl.arange(0, D)
    q = tl.load(q_ptr + q_rows[:, None] + d[None, :], mask=row_ok[:, None], other=0.0)
    return (q.to(tl.float32) * qk_scale).to(tl.float16 if FP16 else tl.float32)

"""Stage 2: the log-sum-exp merge of every split's partial output into the attention output."""
from __future__ import annotations

import triton
import triton.language as tl

@triton.jit
def _decode_stage2_kernel(part_o_ptr, part_lse_ptr, out_ptr, n_splits, kv_heads, q_tokens, n_rows,
                          stride_ob, stride_oh, stride_ot,
                          GROUP: tl.constexpr, D: tl.constexpr, BLOCK_S: tl.constexpr):
    """Merge the splits of one query row: out = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M)."""
    bh = tl.program_id(0)
    row = tl.program_id(1)
    d = tl.arange(0, D)
    m = tl.full((), float("-inf"), tl.float32)
    den = tl.zeros((), tl.float32)
    acc = tl.zeros((D,), tl.float32)
    for s0 in range(0, n_splits, BLOCK_S):
        splits = s0 + tl.arange(0, BLOCK_S)
        ok = splits < n_splits
        slot = (bh.to(tl.int64) * n_splits + splits) * n_rows + row                # [BLOCK_S]
        lse = tl.load(part_lse_ptr + slot, mask=ok, other=float("-inf"))
        o = tl.load(part_o_ptr + slot[:, None] * D + d[None, :], mask=ok[:, None], other=0.0)  # [BLOCK_S, D]
        m_new = tl.maximum(m, tl.max(lse, axis=0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - m_safe)
        w = tl.exp2(lse - m_safe)
        den = den * alpha + tl.sum(w, axis=0)
        acc = acc * alpha + tl.sum(w[:, None] * o, axis=0)
        m = m_new
    out = acc / tl.where(den > 0, den, 1.0)
    b = (bh // kv_heads).to(tl.int64)
    head = (bh % kv_heads) * GROUP + row // q_tokens
    tl.store(out_ptr + b * stride_ob + head * stride_oh + (row % q_tokens) * stride_ot + d,
             out.to(out_ptr.dtype.element_ty))

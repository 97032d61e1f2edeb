"""Stage 2: the log-sum-exp merge of every split's partial output into the attention output; or, with
`DecodeConfig.single_launch`, the same merge done by the last stage-1 program of each row block (`_merge_if_last`)."""
from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from kernels.decode.common import _program_ids


@triton.jit
def _decode_stage2_kernel(part_o_ptr, part_lse_ptr, out_ptr, n_splits, kv_heads, q_tokens, n_rows,
                          stride_ob, stride_oh, stride_ot,
                          GROUP: tl.constexpr, D: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr):
    """Merge the splits of one query row: out = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M).

    PDL: launched as a programmatic dependent of stage 1 (`launch_pdl`), its programs start while stage 1's last
    programs run and wait for stage 1's results (griddepcontrol.wait) before the first load."""
    bh = tl.program_id(0)
    row = tl.program_id(1)
    d = tl.arange(0, D)
    if PDL:
        gdc_wait()
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


@triton.jit
def _merge_if_last(counter_ptr, part_o_ptr, part_lse_ptr, out_ptr, rows, row_ok, n_splits, n_rows, kv_heads,
                   q_tokens, stride_ob, stride_oh, stride_ot, GROUP: tl.constexpr, D: tl.constexpr):
    """Count this stage-1 program in as done; the last of its (sequence x KV head, row block) merges every split.

    The counter [B * H_kv, row blocks] (int32, zero between calls) is taken with acquire-release after a block
    barrier, so the other programs' partials are visible to the merging one; it reads them past L1 (.cg) and
    resets the counter for the next call (a CUDA graph replays with the same counters).
    """
    _, bh, row_block = _program_ids()
    counter = counter_ptr + bh * tl.num_programs(0) + row_block
    tl.debug_barrier()                                          # every thread's partial stores precede the count
    if tl.atomic_add(counter, 1, sem="acq_rel") == n_splits - 1:
        d = tl.arange(0, D)
        m = tl.full(rows.shape, float("-inf"), tl.float32)
        den = tl.zeros(rows.shape, tl.float32)
        acc = tl.zeros((rows.shape[0], D), tl.float32)
        for split in range(0, n_splits):
            slot = (bh.to(tl.int64) * n_splits + split) * n_rows + rows                   # [BLOCK_R]
            lse = tl.load(part_lse_ptr + slot, mask=row_ok, other=float("-inf"), cache_modifier=".cg")
            o = tl.load(part_o_ptr + slot[:, None] * D + d[None, :], mask=row_ok[:, None], other=0.0,
                        cache_modifier=".cg")                                               # [BLOCK_R, D]
            m_new = tl.maximum(m, lse)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha, w = tl.exp2(m - m_safe), tl.exp2(lse - m_safe)
            den = den * alpha + w
            acc = acc * alpha[:, None] + w[:, None] * o
            m = m_new
        out = acc / tl.where(den > 0, den, 1.0)[:, None]
        b = (bh // kv_heads).to(tl.int64)
        head = (bh % kv_heads) * GROUP + rows // q_tokens
        ptrs = out_ptr + b * stride_ob + head[:, None] * stride_oh + (rows % q_tokens)[:, None] * stride_ot + d[None, :]
        tl.store(ptrs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
        tl.atomic_xchg(counter, 0)

"""Stage 1 over the full-precision segment (BF16 sink + recent rows), causal for the new query tokens."""
from __future__ import annotations

import triton
import triton.language as tl

from kernels.decode.common import _load_query, _softmax_step, _split_bounds, _store_lse


@triton.jit
def _fp_split(q_ptr, q_rows, row_ok, qk_scale, fk_ptr, fv_ptr, start, end, limit, stride_fn,
              part_o_ptr, part_lse_ptr, slot, D: tl.constexpr, BLOCK_F: tl.constexpr, FP16: tl.constexpr):
    """Online softmax over fp-segment tokens [start, end); row r sees positions < limit[r]. The row loads take no
    mask (a token from `end` on reads row end - 1, always stored), and only tiles that reach `end` or a row's causal
    limit mask scores, in a branch the others skip (the BF16 kernel on an H200: 0.95-1.00x the time,
    results/bench/bench_formats_whole_tiles_h200.md)."""
    d = tl.arange(0, D)
    dtype: tl.constexpr = tl.float16 if FP16 else tl.float32
    q = _load_query(q_ptr, q_rows, row_ok, qk_scale, D, FP16)                      # [BLOCK_R, D]
    m_i = tl.full(row_ok.shape, float("-inf"), tl.float32)
    l_i = tl.zeros(row_ok.shape, tl.float32)
    acc = tl.zeros((row_ok.shape[0], D), tl.float32)
    seen_by_all = tl.minimum(end, tl.min(limit, axis=0))                           # tokens below: every row's
    for n0 in range(start, end, BLOCK_F):
        offs_n = n0 + tl.arange(0, BLOCK_F)
        ptrs = tl.minimum(offs_n, end - 1)[:, None] * stride_fn + d[None, :]      # [BLOCK_F, D] in bounds
        k = tl.load(fk_ptr + ptrs).to(tl.float32).to(dtype)
        qk = tl.dot(q, tl.trans(k))                                                 # [BLOCK_R, BLOCK_F]
        if n0 + BLOCK_F > seen_by_all:
            qk = tl.where((offs_n[None, :] < end) & (offs_n[None, :] < limit[:, None]), qk, float("-inf"))
        p, alpha, m_i, l_i = _softmax_step(qk, m_i, l_i)
        v = tl.load(fv_ptr + ptrs).to(tl.float32).to(dtype)
        acc = tl.dot(p.to(dtype), v, acc * alpha[:, None])
    l_safe = _store_lse(part_lse_ptr, slot, row_ok, m_i, l_i)
    tl.store(part_o_ptr + slot[:, None] * D + d[None, :], acc / l_safe[:, None], mask=row_ok[:, None])


@triton.jit
def _fp_program(q_ptr, q_rows, row_ok, rows, qk_scale, fk_ptr, fv_ptr, fp_len_ptr, fp_start_ptr, b, h, split,
                n_fp_splits, q_tokens, stride_fb, stride_fh, stride_fn, part_o_ptr, part_lse_ptr, slot,
                D: tl.constexpr, BLOCK_F: tl.constexpr, FP16: tl.constexpr):
    """Fp-segment split `split` of sequence b for KV head h: its token range, and each query row's causal limit."""
    fp_len = tl.load(fp_len_ptr + b)
    start, end = _split_bounds(tl.load(fp_start_ptr + b), fp_len, split, n_fp_splits, BLOCK_F)
    limit = fp_len - q_tokens + 1 + rows % q_tokens                                # [BLOCK_R] causal
    base = b * stride_fb + h * stride_fh
    _fp_split(q_ptr, q_rows, row_ok, qk_scale, fk_ptr + base, fv_ptr + base, start, end, limit, stride_fn,
              part_o_ptr, part_lse_ptr, slot, D, BLOCK_F, FP16)

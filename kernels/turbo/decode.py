"""Triton decode attention over [fp sink | TurboQuant history | fp recent], split-K like kernels/decode.

`decode_attention_turbo` takes `kernels.decode.decode_attention`'s arguments (the history parts as
kernels/turbo/layout.py stores them: k_scale is the key norm, k_zero is empty) plus the key codebook, and
returns what `attention_reference` gives over baselines/turboquant_format.py's dequantized history.
Stage 1 (this module's kernel) runs kernels/decode's program layout: history splits here, fp-segment splits
through kernels/decode's `_fp_program`; stage 2 is kernels/decode's log-sum-exp merge (`run_split_k`).

Per BLOCK_N-token history tile, each coordinate's code is cut from its token row's bytes with shifts (coordinate d
sits at bits 3d .. 3d+2 of the row: the byte holding bit 3d, and the next one where the code crosses it; 2- and
4-bit codes never do). Keys never materialise: the tile holds their centroids (a select over the 2^b-entry table,
loaded once per program), and the per-token factor norm / |centroids| (norm correction) is folded around the dot,
    q.k_n = (norm_n / |c_n|) * (q . c_n).
Values keep their codes and fold scale and zero as the INT2 kernel does:
    sum_n p_n v_n = sum_n (p_n s_n) c_n - sum_n p_n s_n z_n.
On the GPU the dot operands are fp16 (fp32 accumulation); under TRITON_INTERPRET everything is fp32.
"""
from __future__ import annotations

from dataclasses import replace

import torch
import triton
import triton.language as tl

from kernels.decode.common import (LOG2E, ROW_BLOCK, _load_query, _program_rows, _softmax_step, _split_bounds,
                                   _store_lse)
from kernels.decode.fp_segment import _fp_program
from kernels.decode.launch import DecodeConfig, check_launch, default_config, run_split_k
from kernels.decode.packed import _load_token_meta, _split_meta
from kernels.decode.reference import check_segments
from kernels.dispatch import interpreter_forced
from kernels.turbo.layout import TIGHT_BITS, part_shapes

GPU_CONFIG = DecodeConfig(block_n=64, block_f=32, num_warps=4, num_stages=2, merge_block=64)
WIDE_TILE_MAX_D = 128   # head_dims that take 128-token tiles


def gpu_config(head_dim: int) -> DecodeConfig:
    """The GPU launch: 128-token tiles up to head_dim 128, 64 above. H100, K3V3, group 4, batch 1 and 8 at 32k
    (`bench_formats.py --launch`, results/bench/bench_formats.md): 128 tokens took 0.157 -> 0.132 and 1.208 -> 1.028 ms
    at head_dim 128, 0.073 -> 0.068 and 0.509 -> 0.450 ms at 64, and spilled at 256 (0.396 -> 6.494 ms); 8 warps,
    32-token tiles and 1 or 3 stages were slower or within 3 %."""
    return replace(GPU_CONFIG, block_n=128) if head_dim <= WIDE_TILE_MAX_D else GPU_CONFIG


@triton.jit
def _unpack_tight(c_ptr, offs_n, mask_n, stride_cn, D: tl.constexpr, BITS: tl.constexpr):
    """Codes [BLOCK_N, D] int32 of the packed rows offs_n [BLOCK_N]: coordinate d at bits d*BITS of its row."""
    NB: tl.constexpr = D * BITS // 8
    bit = tl.arange(0, D) * BITS
    byte = bit >> 3                                                                 # [D]
    rows = c_ptr + offs_n[:, None] * stride_cn                                      # [BLOCK_N, 1]
    word = tl.load(rows + byte[None, :], mask=mask_n[:, None], other=0).to(tl.int32)
    if 8 % BITS != 0:                                                               # codes that cross a byte
        spill = mask_n[:, None] & (byte + 1 < NB)[None, :]
        word |= tl.load(rows + byte[None, :] + 1, mask=spill, other=0).to(tl.int32) << 8
    return (word >> (bit & 7)[None, :]) & ((1 << BITS) - 1)                          # [BLOCK_N, D]


@triton.jit
def _centroid_table(cent_ptr, LEVELS: tl.constexpr):
    """The codebook's LEVELS centroids as a tuple of fp32 scalars."""
    table = ()
    for i in tl.static_range(LEVELS):
        table = table + (tl.load(cent_ptr + i).to(tl.float32),)
    return table


@triton.jit
def _lookup(codes, table, LEVELS: tl.constexpr):
    """codes [..] int32 -> table[codes] fp32."""
    vals = tl.zeros(codes.shape, tl.float32) + table[0]
    for i in tl.static_range(1, LEVELS):
        vals = tl.where(codes == i, table[i], vals)
    return vals


@triton.jit
def _key_scores(q, table, kc_ptr, kn_ptr, offs_n, mask_n, stride_kcn, stride_knn, D: tl.constexpr,
                BITS: tl.constexpr, NORM_CORRECTION: tl.constexpr):
    """Logits [BLOCK_R, BLOCK_N] of q [BLOCK_R, D] against one tile of codebook keys: (q . c_n) * norm_n / |c_n|."""
    unit = _lookup(_unpack_tight(kc_ptr, offs_n, mask_n, stride_kcn, D, BITS), table, 1 << BITS)  # [BLOCK_N, D]
    factor = tl.load(kn_ptr + offs_n * stride_knn, mask=mask_n, other=0.0).to(tl.float32)         # [BLOCK_N] norms
    if NORM_CORRECTION:
        factor = factor / tl.sqrt(tl.sum(unit * unit, axis=1))
    return tl.dot(q, tl.trans(unit.to(q.dtype))) * factor[None, :]


@triton.jit
def _accumulate_values(acc, pz_sum, p, alpha, vc_ptr, vs_ptr, vz_ptr, offs_n, mask_n, stride_vcn, stride_vsn,
                       D: tl.constexpr, BITS: tl.constexpr, dtype: tl.constexpr):
    """acc = alpha * acc + (p * scale) @ codes and pz_sum = alpha * pz_sum + sum p * scale * zero, one V tile."""
    s, z = _split_meta(_load_token_meta(vs_ptr, vz_ptr, offs_n, mask_n, stride_vsn))   # [BLOCK_N] each
    pv = (p * s[None, :]).to(dtype)                                                    # [BLOCK_R, BLOCK_N]
    pz_sum = pz_sum * alpha + tl.sum(pv.to(tl.float32) * z[None, :], axis=1)
    codes = _unpack_tight(vc_ptr, offs_n, mask_n, stride_vcn, D, BITS).to(dtype)     # [BLOCK_N, D] exact
    return tl.dot(pv, codes, acc * alpha[:, None]), pz_sum


@triton.jit
def _turbo_history_split(q_ptr, q_rows, row_ok, qk_scale, kc_ptr, kn_ptr, vc_ptr, vs_ptr, vz_ptr, cent_ptr,
                         start, end, stride_kcn, stride_knn, stride_vcn, stride_vsn, part_o_ptr, part_lse_ptr, slot,
                         D: tl.constexpr, K_BITS: tl.constexpr, V_BITS: tl.constexpr,
                         NORM_CORRECTION: tl.constexpr, BLOCK_N: tl.constexpr, FP16: tl.constexpr):
    """Online softmax over TurboQuant history tokens [start, end) of one KV head; stores o and lse."""
    dtype: tl.constexpr = tl.float16 if FP16 else tl.float32
    q = _load_query(q_ptr, q_rows, row_ok, qk_scale, D, FP16)                       # [BLOCK_R, D]
    table = _centroid_table(cent_ptr, 1 << K_BITS)
    m_i = tl.full(row_ok.shape, float("-inf"), tl.float32)                          # [BLOCK_R]
    l_i = tl.zeros(row_ok.shape, tl.float32)
    pz_sum = tl.zeros(row_ok.shape, tl.float32)
    acc = tl.zeros((row_ok.shape[0], D), tl.float32)                                # [BLOCK_R, D]
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        qk = _key_scores(q, table, kc_ptr, kn_ptr, offs_n, mask_n, stride_kcn, stride_knn, D, K_BITS,
                         NORM_CORRECTION)                                           # [BLOCK_R, BLOCK_N]
        p, alpha, m_i, l_i = _softmax_step(tl.where(mask_n[None, :], qk, float("-inf")), m_i, l_i)
        acc, pz_sum = _accumulate_values(acc, pz_sum, p, alpha, vc_ptr, vs_ptr, vz_ptr, offs_n, mask_n,
                                         stride_vcn, stride_vsn, D, V_BITS, dtype)
    l_safe = _store_lse(part_lse_ptr, slot, row_ok, m_i, l_i)
    d = tl.arange(0, D)
    tl.store(part_o_ptr + slot[:, None] * D + d[None, :], (acc - pz_sum[:, None]) / l_safe[:, None],
             mask=row_ok[:, None])


@triton.jit
def _decode_stage1_turbo_kernel(
    q_ptr, kc_ptr, kn_ptr, vc_ptr, vs_ptr, vz_ptr, fk_ptr, fv_ptr, cent_ptr,
    hist_len_ptr, fp_len_ptr, hist_start_ptr, fp_start_ptr, part_o_ptr, part_lse_ptr,
    qk_scale, kv_heads, q_tokens, n_rows, n_hist_splits, n_fp_splits,
    stride_qb, stride_qh, stride_qt,
    stride_kcb, stride_kch, stride_kcn, stride_knb, stride_knh, stride_knn,
    stride_vcb, stride_vch, stride_vcn, stride_vsb, stride_vsh, stride_vsn,
    stride_fb, stride_fh, stride_fn,
    GROUP: tl.constexpr, D: tl.constexpr, K_BITS: tl.constexpr, V_BITS: tl.constexpr,
    NORM_CORRECTION: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_F: tl.constexpr,
    FP16: tl.constexpr,
):
    split, b, h, rows, row_ok, q_rows, slot = _program_rows(kv_heads, q_tokens, n_rows, n_hist_splits + n_fp_splits,
                                                           stride_qb, stride_qh, stride_qt, GROUP, BLOCK_R)
    if split < n_hist_splits:
        start, end = _split_bounds(tl.load(hist_start_ptr + b), tl.load(hist_len_ptr + b), split,
                                   n_hist_splits, BLOCK_N)
        kc, vc = kc_ptr + b * stride_kcb + h * stride_kch, vc_ptr + b * stride_vcb + h * stride_vch
        kn, v_meta = kn_ptr + b * stride_knb + h * stride_knh, b * stride_vsb + h * stride_vsh
        _turbo_history_split(q_ptr, q_rows, row_ok, qk_scale, kc, kn, vc, vs_ptr + v_meta, vz_ptr + v_meta,
                             cent_ptr, start, end, stride_kcn, stride_knn, stride_vcn, stride_vsn,
                             part_o_ptr, part_lse_ptr, slot, D, K_BITS, V_BITS, NORM_CORRECTION, BLOCK_N, FP16)
    else:
        _fp_program(q_ptr, q_rows, row_ok, rows, qk_scale, fk_ptr, fv_ptr, fp_len_ptr, fp_start_ptr, b, h,
                    split - n_hist_splits, n_fp_splits, q_tokens, stride_fb, stride_fh, stride_fn,
                    part_o_ptr, part_lse_ptr, slot, D, BLOCK_F, FP16)


def check_turbo_inputs(q, k_codes, k_norm, k_zero, v_codes, v_scale, v_zero, fp_k, fp_v,
                       hist_len, fp_len, hist_start, fp_start, k_spec, v_spec, centroids) -> None:
    """A one-sentence ValueError for any inconsistency of a `decode_attention_turbo` call."""
    check_segments(q, fp_k, fp_v, k_codes, v_codes, hist_len, fp_len, hist_start, fp_start)
    for name, kind, spec, parts in (("k", "key", k_spec, (k_codes, k_norm, k_zero)),
                                    ("v", "value", v_spec, (v_codes, v_scale, v_zero))):
        if spec.kind != kind or spec.bits not in TIGHT_BITS:
            raise ValueError(f"{name}_spec must be a TurboQuant {kind} spec of {TIGHT_BITS} bits, got "
                             f"{spec.kind} {spec.bits}-bit.")
        expected = part_shapes((*k_codes.shape[:3], q.shape[-1]), spec)
        for part, tensor, (shape, dtype) in zip(("codes", "scale", "zero"), parts, expected.values()):
            if list(tensor.shape) != shape or tensor.dtype != dtype:
                raise ValueError(f"{name} {part} must be {dtype} {shape}, got {tensor.dtype} {list(tensor.shape)}.")
    levels = 2 ** k_spec.bits
    if tuple(centroids.shape) != (levels,) or centroids.dtype != torch.float32:
        raise ValueError(f"centroids must be fp32 [{levels}], got {centroids.dtype} {tuple(centroids.shape)}.")
    if v_scale.stride() != v_zero.stride():
        raise ValueError("v_scale and v_zero must share strides.")


def decode_attention_turbo(q, k_codes, k_norm, k_zero, v_codes, v_scale, v_zero, fp_k, fp_v,
                           hist_len, fp_len, hist_start, fp_start, *, sm_scale: float, k_spec, v_spec,
                           centroids: torch.Tensor, num_splits: int | None = None,
                           config: DecodeConfig | None = None) -> torch.Tensor:
    """Attention of q [B, H_q, T_q, D] over [TurboQuant history | fp segment] -> [B, H_q, T_q, D].

    History parts as kernels/turbo/layout.py stores them ([B, H_kv, N, *]); centroids fp32 [2^k_bits] on q's
    device. Lengths, the causal rule, num_splits and config as in `kernels.decode.decode_attention`.
    """
    tensors = (q, k_codes, k_norm, k_zero, v_codes, v_scale, v_zero, fp_k, fp_v,
               hist_len, fp_len, hist_start, fp_start, centroids)
    check_turbo_inputs(*tensors[:-1], k_spec, v_spec, centroids)
    check_launch(q, tensors, fp_k, fp_v)
    q_heads, q_tokens, head_dim = q.shape[1:]
    kv_heads = fp_k.shape[1]
    group, on_gpu = q_heads // kv_heads, q.is_cuda and not interpreter_forced()
    cfg = config or (gpu_config(head_dim) if on_gpu else default_config(head_dim, on_gpu=False))

    def stage1(grid, part_o, part_lse, hist_splits, fp_splits, out, counters):      # two launches: counters None
        _decode_stage1_turbo_kernel[grid](
            q, k_codes, k_norm, v_codes, v_scale, v_zero, fp_k, fp_v, centroids,
            hist_len, fp_len, hist_start, fp_start, part_o, part_lse,
            sm_scale * LOG2E, kv_heads, q_tokens, group * q_tokens, hist_splits, fp_splits,
            *q.stride()[:3], *k_codes.stride()[:3], *k_norm.stride()[:3],
            *v_codes.stride()[:3], *v_scale.stride()[:3], *fp_k.stride()[:3],
            GROUP=group, D=head_dim, K_BITS=k_spec.bits, V_BITS=v_spec.bits,
            NORM_CORRECTION=k_spec.norm_correction, BLOCK_R=ROW_BLOCK, BLOCK_N=cfg.block_n, BLOCK_F=cfg.block_f,
            FP16=on_gpu, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
    return run_split_k(q, kv_heads, k_codes.shape[2], fp_k.shape[2], cfg, on_gpu, num_splits, ROW_BLOCK, stage1)

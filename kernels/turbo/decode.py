"""Triton decode attention over [fp sink | TurboQuant history | fp recent], split-K like kernels/decode.

`decode_attention_turbo` takes `kernels.decode.decode_attention`'s arguments (the history parts as
kernels/turbo/layout.py stores them: k_scale is the key norm, k_zero is empty) plus the key codebook, and
returns what `attention_reference` gives over baselines/turboquant_format.py's dequantized history.
Stage 1 (this module's kernel) runs kernels/decode's program layout: history splits on warp tiles
(kernels/turbo/history.py: 8-code words, codebook keys with the norm correction folded around the dots, values'
scale and zero folded as for INT2), fp-segment splits through kernels/decode's `_fp_program`; stage 2 is
kernels/decode's log-sum-exp merge (`run_split_k`). On the GPU the dot operands are fp16 (fp32 accumulation); under
TRITON_INTERPRET everything is fp32.
"""
from __future__ import annotations

from dataclasses import replace

import torch
import triton
import triton.language as tl

from kernels.decode.common import LOG2E, _program_rows, _split_bounds
from kernels.decode.fp_segment import _fp_program
from kernels.decode.launch import (SHORT_HISTORY_TOKENS, DecodeConfig, _sm_count, _warp_rows, check_launch,
                                   default_config, grid_size, rows_aligned, run_split_k)
from kernels.decode.reference import check_segments
from kernels.dispatch import interpreter_forced
from kernels.turbo.history import _turbo_warp_tiles
from kernels.turbo.layout import TIGHT_BITS, part_shapes

GPU_CONFIG = DecodeConfig(block_n=128, block_f=32, num_warps=4, num_stages=2, merge_block=64)
TINY_FOUR_WARP_TOKENS = 4 * SHORT_HISTORY_TOKENS   # batch-1 histories up to which `gpu_config` keeps four warps


def gpu_config(head_dim: int, grid: str, history_tokens: int | None = None) -> DecodeConfig:
    """The GPU launch on `kernels.decode.grid_size`'s grid over `history_tokens` packed tokens per (sequence, KV head)
    (None: a long history), with `short_history_split_tiles`: 128-token tiles in four warps (32 tokens per warp); two
    warps on the tiny and small grids (batch 1-2) up to head_dim 128; a 168-register cap on the medium and large
    grids. H100, K3V3, group 4, 32k and 100k (`bench_formats.py --launch`, results/bench/bench_formats_turbo.md): two
    warps took batch 1 from 0.094 to 0.083 ms at head_dim 128 and from 0.075 to 0.054 ms at 64 (measured before the
    byte-table lookup) and were slower at batch 8 and 32 and at head_dim 256; the cap took batch 8 / 32k from 0.431 to
    0.393 ms and 32 / 100k from 4.51 to 4.26 ms at head_dim 128 (slower then at 64 and 256 and at batch 1); 256-token
    tiles and eight warps were slower or mixed. Since the keys' aligned word loads (H200, the same points,
    results/bench/bench_formats_turbo_keywords_h200.md) the cap also took head_dim 64 to 0.86-0.87x the time (batch 32
    / 100k 3.530 -> 3.079 ms) and 256 to 0.97-0.98x; eight warps were 1.17-2.02x slower, no cap 1.13-1.14x at 128.
    On the tiny grid (batch 1) a history of more than SHORT_HISTORY_TOKENS and at most TINY_FOUR_WARP_TOKENS keeps
    four warps (H200, group 4, `tiny_history_four_warps`)."""
    small = grid in ("tiny", "small")
    cfg = GPU_CONFIG
    if small and head_dim <= 128 and not tiny_history_four_warps(grid, history_tokens):
        cfg = replace(cfg, num_warps=2)
    elif not small:
        cfg = replace(cfg, maxnreg=168)
    tiles = short_history_split_tiles(grid, head_dim, history_tokens)
    return replace(cfg, min_split_tiles=tiles) if tiles else cfg


def tiny_history_four_warps(grid: str, history_tokens: int | None) -> bool:
    """Four warps instead of two on the tiny grid over more than SHORT_HISTORY_TOKENS and at most
    TINY_FOUR_WARP_TOKENS history tokens. H200, group 4, batch 1, head_dim 64 and 128
    (results/bench/bench_formats_turbo_keywords_h200.md, last three sections): 8k 0.85-0.92x the time in three calls,
    16k 0.79-0.85x in two (head_dim 64: 0.038 -> 0.030 ms, 128: 0.040 -> 0.034); at 2k-4k 1.02-1.09x and at 32k
    1.12-1.20x the time, where two warps stay."""
    tokens = history_tokens or 0
    return grid == "tiny" and SHORT_HISTORY_TOKENS < tokens <= TINY_FOUR_WARP_TOKENS


def short_history_split_tiles(grid: str, head_dim: int, history_tokens: int | None) -> int | None:
    """Fewest tiles per history split on the tiny and small grids (batch 1-2 at 8 KV heads) over a short history:
    1 up to SHORT_HISTORY_TOKENS, 2 up to twice that (at head_dim 256 on the tiny grid only); None (the launch's
    4) otherwise. With 4 a 1k history took two splits of three tiles, each a long chain of dependent unpacks. H200,
    group 4 (results/bench/bench_formats_turbo_short_h200.md): batch 1 / 1k 0.027 -> 0.014 ms at head_dim 128,
    0.026 -> 0.013 at 64, 0.040 -> 0.020 at 256; batch 1 / 4k 0.035 / 0.034 / 0.050 -> 0.017 / 0.015 / 0.031; batch
    2 / 1k 0.027 / 0.026 / 0.040 -> 0.015 / 0.013 / 0.028. At 8k two tiles: batch 1 0.037 / 0.033 / 0.070 -> 0.026 /
    0.023 / 0.045, batch 2 0.045 / 0.040 -> 0.033 / 0.028 (head_dim 256 there 0.079 -> 0.083: kept at 4); at 32k
    both were slower (head_dim 128 batch 1 0.054 -> 0.057-0.060), at 100k equal."""
    if grid not in ("tiny", "small") or history_tokens is None or history_tokens <= 0:
        return None
    if history_tokens <= SHORT_HISTORY_TOKENS:
        return 1
    if history_tokens <= 2 * SHORT_HISTORY_TOKENS and (head_dim <= 128 or grid == "tiny"):
        return 2
    return None


def centroid_byte_table(centroids: torch.Tensor) -> tuple[int, int, int, int]:
    """The fp16 bits of up to 8 centroids as the four byte tables of kernels/turbo/history.py's `_centroid_ptx`:
    (low bytes of centroids 0-3, of 4-7, high bytes of 0-3, of 4-7), little-endian, missing centroids 0. Read on the
    host: from a GPU tensor that is a device-to-host copy, which a CUDA graph capture refuses, so `TurboKernels`
    computes it once from its host copy of the codebook."""
    bits = centroids.detach().cpu().to(torch.float16).view(torch.int16).int().tolist()[:8]
    bits += [0] * (8 - len(bits))
    low, high = [b & 0xFF for b in bits], [(b >> 8) & 0xFF for b in bits]
    return _little_endian(low[:4]), _little_endian(low[4:]), _little_endian(high[:4]), _little_endian(high[4:])


def _little_endian(byte_values: list[int]) -> int:
    return sum(v << (8 * i) for i, v in enumerate(byte_values))


def chunk_rows(head_dim: int) -> int:
    """Rows of one dot chunk (kernels/turbo/history.py): the D / 8 words of a row, at least the MMA's 16."""
    return max(head_dim // 8, 16)


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
    NORM_CORRECTION: tl.constexpr, KC: tl.constexpr, BYTE_TABLE: tl.constexpr, WARPS: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_F: tl.constexpr, FP16: tl.constexpr,
):
    split, b, h, rows, row_ok, q_rows, slot = _program_rows(kv_heads, q_tokens, n_rows, n_hist_splits + n_fp_splits,
                                                           stride_qb, stride_qh, stride_qt, GROUP, BLOCK_R)
    if split < n_hist_splits:
        start, end = _split_bounds(tl.load(hist_start_ptr + b), tl.load(hist_len_ptr + b), split,
                                   n_hist_splits, BLOCK_N)
        kc, vc = kc_ptr + b * stride_kcb + h * stride_kch, vc_ptr + b * stride_vcb + h * stride_vch
        kn, v_meta = kn_ptr + b * stride_knb + h * stride_knh, b * stride_vsb + h * stride_vsh
        _turbo_warp_tiles(q_ptr, q_rows, row_ok, qk_scale, kc, kn, vc, vs_ptr + v_meta, vz_ptr + v_meta, cent_ptr,
                          start, end, stride_kcn, stride_knn, stride_vcn, stride_vsn, part_o_ptr, part_lse_ptr, slot,
                          D, K_BITS, V_BITS, KC, BYTE_TABLE, NORM_CORRECTION, BLOCK_N, WARPS, FP16)
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
    if not rows_aligned(k_codes, 4):                      # `_aligned_words` loads a key row as 16- / 32-bit words
        raise ValueError(f"k codes must start every row 4-byte aligned (the kernel loads 16- / 32-bit words), got "
                         f"data_ptr % 4 = {k_codes.data_ptr() % 4} and strides {k_codes.stride()}.")


def decode_attention_turbo(q, k_codes, k_norm, k_zero, v_codes, v_scale, v_zero, fp_k, fp_v,
                           hist_len, fp_len, hist_start, fp_start, *, sm_scale: float, k_spec, v_spec,
                           centroids: torch.Tensor, byte_table: tuple[int, int, int, int] | None = None,
                           num_splits: int | None = None, config: DecodeConfig | None = None) -> torch.Tensor:
    """Attention of q [B, H_q, T_q, D] over [TurboQuant history | fp segment] -> [B, H_q, T_q, D].

    History parts as kernels/turbo/layout.py stores them ([B, H_kv, N, *]); centroids fp32 [2^k_bits] on q's
    device, byte_table their `centroid_byte_table` (None: computed here, a device-to-host copy). Lengths, the
    causal rule, num_splits and config as in `kernels.decode.decode_attention`.
    """
    tensors = (q, k_codes, k_norm, k_zero, v_codes, v_scale, v_zero, fp_k, fp_v,
               hist_len, fp_len, hist_start, fp_start, centroids)
    check_turbo_inputs(*tensors[:-1], k_spec, v_spec, centroids)
    check_launch(q, tensors, fp_k, fp_v)
    q_heads, q_tokens, head_dim = q.shape[1:]
    kv_heads = fp_k.shape[1]
    group, on_gpu = q_heads // kv_heads, q.is_cuda and not interpreter_forced()
    if config is None and on_gpu:
        sms = _sm_count(q.device.index or 0)
        history = k_codes.shape[2]
        config = gpu_config(head_dim, grid_size(q.shape[0] * kv_heads, sms, history, group * q_tokens), history)
    cfg = config or default_config(head_dim, on_gpu=False)
    if cfg.block_n // cfg.num_warps < 16:
        raise ValueError(f"TurboQuant's warp tiles need at least 16 tokens per warp (the MMA's M), got block_n "
                         f"{cfg.block_n} over {cfg.num_warps} warps.")
    row_block = _warp_rows(cfg, group * q_tokens)
    byte_table = byte_table or centroid_byte_table(centroids)

    def stage1(grid, part_o, part_lse, hist_splits, fp_splits, out, counters):      # two launches: counters None
        _decode_stage1_turbo_kernel[grid](
            q, k_codes, k_norm, v_codes, v_scale, v_zero, fp_k, fp_v, centroids,
            hist_len, fp_len, hist_start, fp_start, part_o, part_lse,
            sm_scale * LOG2E, kv_heads, q_tokens, group * q_tokens, hist_splits, fp_splits,
            *q.stride()[:3], *k_codes.stride()[:3], *k_norm.stride()[:3],
            *v_codes.stride()[:3], *v_scale.stride()[:3], *fp_k.stride()[:3],
            GROUP=group, D=head_dim, K_BITS=k_spec.bits, V_BITS=v_spec.bits,
            NORM_CORRECTION=k_spec.norm_correction, KC=chunk_rows(head_dim), BYTE_TABLE=byte_table,
            WARPS=cfg.num_warps, BLOCK_R=row_block,
            BLOCK_N=cfg.block_n, BLOCK_F=cfg.block_f, FP16=on_gpu, num_warps=cfg.num_warps,
            num_stages=cfg.num_stages, **({"maxnreg": cfg.maxnreg} if on_gpu and cfg.maxnreg else {}),
        )
    return run_split_k(q, kv_heads, k_codes.shape[2], fp_k.shape[2], cfg, on_gpu, num_splits, row_block, stage1)

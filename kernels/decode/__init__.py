"""Triton decode attention over a packed low-bit history plus a full-precision segment (package: common, packed,
warp_tiles, pairs, fp_segment, stage1, merge, launch, reference).

Two launches (flash-decoding):
* stage 1, grid `(S_hist + S_fp, B * H_kv, row blocks)`: program (s, b*H_kv + h, r) owns query rows
  16r..16r+15 of KV head h (its GROUP query heads x T_q tokens, head-major; one block for a decode step
  up to GQA 16; a chunk of T_q tokens takes more; 16-row blocks are the only row tile verified on
  the GPU: 64-row tiles gave wrong or NaN results there on a 200-token history, while the interpreter
  was right). Splits s < S_hist walk 1/S_hist
  of the sequence's packed history in BLOCK_N-token tiles. Each tile's bytes are loaded once
  ([BLOCK_N, D*bits/8], coalesced, software-pipelined) and never reshaped: with p codes per byte,
  "field" f of every byte (bits f*b..f*b+b-1, coordinates f*D/p + j) is masked in place, no shifts or
  int->float conversions: for the single-group token layout the masked bits read as fp16 are the exact
  subnormal 2^-24 * 2^(f*b) * code (FIELD_TINY, one AND per fp16 pair), otherwise they are OR-ed into
  the mantissa of 1024.0 and the 1024 subtracted (FIELD_EXACT; `DecodeConfig.asm_unpack` does either in
  inline PTX, one instruction per pair and field where ptxas emits two). Scores are sum_f q_f @ field_f^T
  (q_f = q's f-th column block times 2^(-f*b)), chained in one fp32 accumulator; values keep one
  accumulator per field. For the single-group token layout the per-token (scale, zero) are folded around
  the dots instead of dequantizing elements (and 2^24 into the scales):
      q.k_n = s_n * (q.c_n - z_n * sum(q)),    sum_n p_n v_n = sum_n (p_n s_n) c_n - sum_n p_n s_n z_n.
  With `DecodeConfig.warp_tiles` (the GPU default at every grid size) that layout runs `_history_warp_tiles`:
  each warp owns a token sub-tile, the tokens are the score MMA's M (no padded query rows), and nothing
  crosses warps inside the loop. There a token's codes load as 16-bit words (fields of >= 32 bytes, or pair
  rows at head_dim 64) and each field splits into its even and odd bytes, so that the codes reach the MMAs
  through 16-bit matrix loads (warp_tiles.py, `_half_field`).
  Grouped token layouts and the KIVI channel layout dequantize each field instead.
  Splits s >= S_hist attend to the fp segment (BF16 sink + recent) with the causal rule for the
  T_q new tokens. Each split stores its normalized partial output and base-2 log-sum-exp.
* stage 2, grid `(B * H_kv, GROUP * T_q)`: log-sum-exp merge of all splits into `out`. With
  `DecodeConfig.single_launch` there is no stage 2: each stage-1 program counts itself in on an atomic counter of
  its (sequence x KV head, row block) and the last one merges (`merge._merge_if_last`); built for short histories
  and correct on the H100, but no faster there (results/bench/sweep_decode_short.md), so off by default.

The number of history splits fills the GPU (`DecodeConfig.programs_per_sm` programs per SM), with at
least `min_split_tiles` tiles per split. On the GPU the dot operands are fp16 (fp32 accumulation);
under TRITON_INTERPRET everything is fp32 and matches `decode_attention_reference` to ~1e-6.
"""
from kernels.decode.common import (CHANNEL, FIELD_EXACT, FIELD_TINY, LOG2E, MAX_ROWS, ROW_BLOCK, TOKEN,
                                   TOKEN_GROUPED, WARP_TILE_ROWS)
from kernels.decode.launch import (GRIDS, DecodeConfig, decode_attention, default_config, default_launch,
                                   grid_size, launch_config, launch_grid, per_token_layouts, single_group_layouts,
                                   uses_pdl, uses_token_pairs, uses_warp_tiles)
from kernels.decode.packed import _field_ptx
from kernels.decode.reference import check_decode_inputs, decode_attention_reference
from kernels.decode.stage1 import _decode_stage1_kernel
from kernels.dispatch import HEAD_DIMS

__all__ = ["CHANNEL", "FIELD_EXACT", "FIELD_TINY", "HEAD_DIMS", "LOG2E", "MAX_ROWS", "ROW_BLOCK", "TOKEN",
           "TOKEN_GROUPED", "WARP_TILE_ROWS", "GRIDS", "DecodeConfig", "decode_attention", "default_config",
           "default_launch", "grid_size", "launch_config", "launch_grid", "per_token_layouts", "single_group_layouts",
           "uses_pdl", "uses_token_pairs", "uses_warp_tiles", "_field_ptx",
           "check_decode_inputs", "decode_attention_reference", "_decode_stage1_kernel"]

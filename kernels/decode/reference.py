"""PyTorch reference of decode attention over [packed history | full-precision segment], and the input
checks shared with the Triton kernel (kernels/decode/launch.py)."""
from __future__ import annotations

import torch

from kernels.format import QuantizedTensor, QuantSpec, dequantize

def _check_history(name, codes, scale, zero, spec, batch, kv_heads, head_dim):
    """Shape/dtype checks for one packed history tensor (uint8 [B, H_kv, N, *]: `check_segments`) and its metadata."""
    n_bytes = head_dim * spec.container_bits // 8
    if codes.shape[3] != n_bytes:
        raise ValueError(f"{name}_codes must be [{batch}, {kv_heads}, N, {n_bytes}], got {tuple(codes.shape)}.")
    tokens = codes.shape[2]
    if spec.axis == "token":
        if head_dim % spec.group != 0:
            raise ValueError(f"{name}_spec.group {spec.group} does not divide head_dim {head_dim}.")
        meta = (batch, kv_heads, tokens, head_dim // spec.group)
    else:
        if tokens % spec.group != 0:
            raise ValueError(f"{name} history length {tokens} is not a multiple of the channel group {spec.group}.")
        meta = (batch, kv_heads, tokens // spec.group, head_dim)
    for label, tensor in (("scale", scale), ("zero", zero)):
        if tuple(tensor.shape) != meta:
            raise ValueError(f"{name}_{label} must have shape {meta}, got {tuple(tensor.shape)}.")
    if scale.dtype != zero.dtype or not scale.is_floating_point():
        raise ValueError(f"{name}_scale/{name}_zero must share one floating dtype, got {scale.dtype}/{zero.dtype}.")


def check_decode_inputs(q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, fp_k, fp_v,
                        hist_len, fp_len, hist_start, fp_start, k_spec, v_spec) -> None:
    """Raise a one-sentence ValueError for any shape or dtype inconsistency of a decode call."""
    check_segments(q, fp_k, fp_v, k_codes, v_codes, hist_len, fp_len, hist_start, fp_start)
    batch, kv_heads, head_dim = q.shape[0], fp_k.shape[1], q.shape[-1]
    _check_history("k", k_codes, k_scale, k_zero, k_spec, batch, kv_heads, head_dim)
    _check_history("v", v_codes, v_scale, v_zero, v_spec, batch, kv_heads, head_dim)


def check_segments(q, fp_k, fp_v, k_codes, v_codes, hist_len, fp_len, hist_start, fp_start) -> None:
    """The checks every history format shares: q [B, H_q, T_q, D], fp_k / fp_v [B, H_kv, M, D] (H_kv divides
    H_q), k / v codes [B, H_kv, N, *] of one length N, int32 [B] lengths; a one-sentence ValueError otherwise."""
    if q.dim() != 4:
        raise ValueError(f"q must be [B, H_q, T_q, D], got shape {tuple(q.shape)}.")
    batch, q_heads, _, head_dim = q.shape
    if fp_k.dim() != 4 or fp_k.shape != fp_v.shape or fp_k.dtype != fp_v.dtype:
        raise ValueError(f"fp_k and fp_v must both be [B, H_kv, M, D] of one dtype, got "
                         f"{tuple(fp_k.shape)} {fp_k.dtype} and {tuple(fp_v.shape)} {fp_v.dtype}.")
    kv_heads = fp_k.shape[1]
    if fp_k.shape[0] != batch or fp_k.shape[3] != head_dim:
        raise ValueError(f"fp_k must be [{batch}, H_kv, M, {head_dim}], got {tuple(fp_k.shape)}.")
    if q_heads % kv_heads != 0:
        raise ValueError(f"H_q={q_heads} is not a multiple of H_kv={kv_heads}.")
    for name, codes in (("k_codes", k_codes), ("v_codes", v_codes)):
        if codes.dtype != torch.uint8 or codes.dim() != 4 or tuple(codes.shape[:2]) != (batch, kv_heads):
            raise ValueError(f"{name} must be uint8 [{batch}, {kv_heads}, N, *], got {codes.dtype} "
                             f"{tuple(codes.shape)}.")
    if k_codes.shape[2] != v_codes.shape[2]:
        raise ValueError(f"k and v histories differ in length: {k_codes.shape[2]} vs {v_codes.shape[2]}.")
    for name, lengths in (("hist_len", hist_len), ("fp_len", fp_len), ("hist_start", hist_start),
                          ("fp_start", fp_start)):
        if lengths.dtype != torch.int32 or tuple(lengths.shape) != (batch,):
            raise ValueError(f"{name} must be int32 [{batch}], got {lengths.dtype} {tuple(lengths.shape)}.")


def _dequantize_history(codes, scale, zero, spec, head_dim) -> torch.Tensor:
    """fp32 [B, H_kv, N, D] history (an empty history gives an empty tensor)."""
    if codes.shape[2] == 0:
        return codes.new_zeros(*codes.shape[:3], head_dim, dtype=torch.float32)
    return dequantize(QuantizedTensor(codes, scale, zero, spec, head_dim))


def _valid_mask(q_tokens, n_hist, n_fp, hist_len, fp_len, hist_start, fp_start) -> torch.Tensor:
    """Boolean [B, 1, T_q, N + M]: which keys each query token may attend to."""
    hist_pos = torch.arange(n_hist, device=hist_len.device)                      # [N]
    fp_pos = torch.arange(n_fp, device=fp_len.device)                            # [M]
    hist_ok = (hist_pos >= hist_start[:, None]) & (hist_pos < hist_len[:, None])  # [B, N]
    shift = torch.arange(q_tokens - 1, -1, -1, device=fp_len.device)             # [T_q]: T_q-1-t
    fp_end = fp_len[:, None] - shift[None, :]                                    # [B, T_q]
    fp_ok = (fp_pos >= fp_start[:, None, None]) & (fp_pos < fp_end[:, :, None])  # [B, T_q, M]
    hist_ok = hist_ok[:, None, :].expand(-1, q_tokens, -1)                       # [B, T_q, N]
    return torch.cat([hist_ok, fp_ok], dim=-1)[:, None]                          # [B, 1, T_q, N+M]


def decode_attention_reference(q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, fp_k, fp_v,
                               hist_len, fp_len, hist_start, fp_start, *, sm_scale: float,
                               k_spec: QuantSpec, v_spec: QuantSpec) -> torch.Tensor:
    """Attention of q [B, H_q, T_q, D] over [dequantized history | fp segment] -> [B, H_q, T_q, D].

    Valid keys of sequence b: history positions [hist_start, hist_len) and fp positions
    [fp_start, fp_len); the T_q queries are the last T_q valid fp entries, so query t sees fp
    positions < fp_len - (T_q - 1 - t). Softmax in fp32; a query with no valid key returns zeros.
    """
    check_decode_inputs(q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, fp_k, fp_v,
                        hist_len, fp_len, hist_start, fp_start, k_spec, v_spec)
    head_dim = q.shape[-1]
    k_hist = _dequantize_history(k_codes, k_scale, k_zero, k_spec, head_dim)          # [B, H_kv, N, D]
    v_hist = _dequantize_history(v_codes, v_scale, v_zero, v_spec, head_dim)
    return attention_reference(q, k_hist, v_hist, fp_k, fp_v, hist_len, fp_len, hist_start, fp_start,
                               sm_scale=sm_scale)


def attention_reference(q, k_hist, v_hist, fp_k, fp_v, hist_len, fp_len, hist_start, fp_start, *,
                        sm_scale: float) -> torch.Tensor:
    """`decode_attention_reference` over an already dequantized history k_hist / v_hist [B, H_kv, N, D] (any
    stored format's reconstruction, fp32) -> [B, H_q, T_q, D] in q's dtype."""
    group = q.shape[1] // fp_k.shape[1]
    keys = torch.cat([k_hist, fp_k.float()], dim=2).repeat_interleave(group, dim=1)   # [B, H_q, N+M, D]
    values = torch.cat([v_hist, fp_v.float()], dim=2).repeat_interleave(group, dim=1)
    scores = (q.float() @ keys.transpose(-1, -2)) * sm_scale                         # [B, H_q, T_q, N+M]
    mask = _valid_mask(q.shape[2], k_hist.shape[2], fp_k.shape[2], hist_len.long(), fp_len.long(),
                       hist_start.long(), fp_start.long())
    probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1).nan_to_num(0.0)
    return (probs @ values).to(q.dtype)                                               # [B, H_q, T_q, D]

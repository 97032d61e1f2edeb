"""Attention-aware covariance targets for OSCAR rotations (METHOD_OSCAR §3), float64 on CPU.

Inputs are one layer's calibration dump with the N tokens of all sequences concatenated:
post-RoPE queries q [N, H_q, D] and keys k [N, H_kv, D], raw values v [N, H_kv, D]. Query head j
belongs to KV head j // g with g = H_q / H_kv (the HF `repeat_kv` order). Every target is one
symmetric [D, D] matrix per layer, shared by all heads:

    from oscar.covariance import query_second_moment, value_target_surrogate
    C_Q = query_second_moment(q)              # key target ("qqt")
    C_S = value_target_surrogate(q, k, v)     # value target as released ("sst")

`value_target_softmax` is the paper's form C_S = (1/N) V^T S^T S V with the causal softmax S;
`ktk_target` and `vtv_target` are the raw-reconstruction ablations of §3.3.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

WEIGHT_SUM_FLOOR = 1e-12


def _symmetrised(C: torch.Tensor) -> torch.Tensor:
    return (C + C.T) / 2


def _second_moment(x: torch.Tensor) -> torch.Tensor:
    """Mean of x_r^T x_r over all rows r of x [..., D] -> [D, D] float64, symmetrised."""
    if x.dim() < 2:
        raise ValueError(f"expected a [N, H, D] tensor, got shape {tuple(x.shape)}.")
    rows = x.to(torch.float64).reshape(-1, x.shape[-1])  # [R, D]
    return _symmetrised(rows.T @ rows / rows.shape[0])


def _grouped_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """Check shapes; return float64 q [N, H_kv, g, D], k [N, H_kv, D], v [N, H_kv, D]."""
    if q.dim() != 3 or k.dim() != 3 or k.shape != v.shape:
        raise ValueError(f"expected q [N, H_q, D] and k, v [N, H_kv, D], "
                         f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}.")
    n_tokens, n_q_heads, head_dim = q.shape
    n_kv_heads = k.shape[1]
    if k.shape[0] != n_tokens or k.shape[2] != head_dim or n_q_heads % n_kv_heads != 0:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} disagree on N or D, or H_kv does not divide H_q.")
    grouped_q = q.to(torch.float64).reshape(n_tokens, n_kv_heads, n_q_heads // n_kv_heads, head_dim)
    return grouped_q, k.to(torch.float64), v.to(torch.float64)


def query_second_moment(q: torch.Tensor) -> torch.Tensor:
    """C_Q [D, D]: mean of q^T q over all query heads and tokens of q [N, H_q, D] (§3.1)."""
    return _second_moment(q)


def ktk_target(k: torch.Tensor) -> torch.Tensor:
    """K^T K / N [D, D] averaged over KV heads, k [N, H_kv, D] (ablation)."""
    return _second_moment(k)


def vtv_target(v: torch.Tensor) -> torch.Tensor:
    """V^T V / N [D, D] averaged over KV heads, v [N, H_kv, D] (ablation)."""
    return _second_moment(v)


def value_target_surrogate(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Released diagonal logit-energy surrogate of C_S (§3.2).

    Per KV head h: A_h = group query second moment, w_t = k_t A_h k_t^T normalised to mean 1,
    M_h = (1/N) sum_t w_t v_t^T v_t; C_S = mean over heads of M_h, symmetrised.
    """
    q, k, v = _grouped_heads(q, k, v)
    n_tokens, _, group_size, _ = q.shape
    query_moment = torch.einsum("nhgd,nhge->hde", q, q) / (n_tokens * group_size)  # [H_kv, D, D]
    weights = torch.einsum("nhd,hde,nhe->nh", k, query_moment, k)                  # [N, H_kv]
    weights = n_tokens * weights / weights.sum(dim=0).clamp_min(WEIGHT_SUM_FLOOR)
    per_head = torch.einsum("nh,nhd,nhe->hde", weights, v, v) / n_tokens          # [H_kv, D, D]
    return _symmetrised(per_head.mean(dim=0))


def _causal_softmax(logits: torch.Tensor) -> torch.Tensor:
    """Row softmax of logits [..., T, T] with future positions masked out."""
    T = logits.shape[-1]
    future = torch.ones(T, T, dtype=torch.bool, device=logits.device).triu(diagonal=1)
    return torch.softmax(logits.masked_fill(future, float("-inf")), dim=-1)


def _sequence_output_moment(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float) -> torch.Tensor:
    """Sum over KV heads of the group-mean (S V)^T (S V) for one sequence; q [T, H_kv, g, D]."""
    moment = q.new_zeros(q.shape[-1], q.shape[-1])
    for head in range(k.shape[1]):
        logits = torch.einsum("tgd,sd->gts", q[:, head], k[:, head]) * scaling  # [g, T, T]
        outputs = _causal_softmax(logits) @ v[:, head]                             # [g, T, D]
        moment += torch.einsum("gtd,gte->de", outputs, outputs) / q.shape[2]
    return moment


def value_target_softmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float,
                         seq_lens: Sequence[int] | None = None) -> torch.Tensor:
    """Paper form C_S = (1/N) V^T S^T S V with S = causal softmax(q k^T * scaling) (§3.2).

    S is computed per sequence (seq_lens: lengths of the concatenated sequences; None = one
    sequence) and per KV head, so memory is O(g * T^2); contributions are averaged over the g query
    heads of each group and over KV heads, then symmetrised.
    """
    q, k, v = _grouped_heads(q, k, v)
    n_tokens = q.shape[0]
    seq_lens = [n_tokens] if seq_lens is None else [int(length) for length in seq_lens]
    if any(length < 1 for length in seq_lens) or sum(seq_lens) != n_tokens:
        raise ValueError(f"seq_lens must be positive and sum to N={n_tokens}, got {seq_lens}.")
    total = q.new_zeros(q.shape[-1], q.shape[-1])
    start = 0
    for length in seq_lens:
        span = slice(start, start + length)
        total += _sequence_output_moment(q[span], k[span], v[span], scaling)
        start += length
    return _symmetrised(total / (n_tokens * k.shape[1]))

"""Skinny GEMM for decode steps: y = x @ W^T for a few rows of x (M <= MAX_ROWS) against a large weight W [N, K].

    y = gemv(x, weight, bias)      # x [M, K], weight [N, K], bias [N] or None (an nn.Linear's) -> y [M, N]
    y = gemv(x, weight, bias, residual)   # + residual [M, N], added in fp32 before the one rounding
    y = gemv(x, weight, norm=(g, eps))    # rms_norm(x, g, eps) @ W^T: the RMSNorm before the projection folded in
    y = gemv(x, gate_up, gated=True)      # silu(x @ gate^T) * (x @ up^T), gate_up = [gate; up]: a gated MLP's product

A decode step's weight GEMMs are bound by reading W once. Each program owns BLOCK_N output features and streams their
rows of W over the whole K in BLOCK_K-wide slices (fp32 products and sums, one rounding at the store), so there is no
split-K reduction and no second launch; small BLOCK_N gives enough programs to keep every SM reading. A residual
(the decoder layer's stream that an output or down projection is added to) is added in the same epilogue, so the add
costs no launch of its own. An RMSNorm in front of the projection (`norm`: its weight g [K] and eps) is folded in the
same way: each program sums x's squares over K (a single row in one slice up to K = 4096) before its loop and
normalizes each slice as it loads it, rounding the normalized row to x's dtype as `rms_norm` (the compiled stock
norm) does, so the norm costs no launch either. The reference is `gemv_reference` (fp32 x @ W^T + bias + residual,
rounded once): the kernel sums in another order, so it matches within fp32 rounding, not bit for bit.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import NamedTuple

import torch
import triton
import triton.language as tl

MAX_ROWS = 8


class GemvConfig(NamedTuple):
    """The launch: BLOCK_N output features per program, BLOCK_K-wide slices of K, warps, pipeline stages. Default:
    one warp streaming 2 rows in 1024-wide slices, the end-to-end runs' launch: on the H100 at Qwen3-4B's decode
    shapes and one row, within 1-4 % of each shape's fastest launch swept, 87.8 us per layer over the four
    projections (one row per program: 86.6 us; scripts/dev/bench_gemv.py, results/bench/bench_gemv.md). On an H200
    a launch per weight shape gained nothing end to end; a folded RMSNorm summing its squares in one slice of up to
    4096 (norm_block) instead of the product's 1024-wide slices took q/k/v and gate/up 0.8-1.7 us each and the batch-1
    step 0.07-0.17 ms (results/bench/bench_gemv_h200.md)."""
    block_n: int = 2
    block_k: int = 1024
    num_warps: int = 1
    num_stages: int = 3
    norm_block: int = 4096   # a folded RMSNorm's K-slice for its sum of squares at one row (0, or more rows: block_k)


@triton.jit
def _inverse_rms(x_ptr, rm, m_ok, K, eps, stride_xm, BLOCK_K: tl.constexpr):
    """1 / sqrt(mean(x^2) + eps) of each row rm of x [M, K], in fp32: [BM]."""
    squares = tl.zeros((rm.shape[0],), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=m_ok[:, None] & (rk < K)[None, :],
                    other=0.0).to(tl.float32)                                                       # [BM, BK]
        squares += tl.sum(x * x, axis=1)
    return tl.math.rsqrt(squares / K + eps)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, r_ptr, g_ptr, y_ptr, M, N, K, eps, stride_xm, stride_wn, stride_rm, stride_ym,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NORM_BLOCK: tl.constexpr,
                 HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_NORM: tl.constexpr, GATED: tl.constexpr):
    """Program p: y[:, p*BLOCK_N : (p+1)*BLOCK_N] over the whole K (plus the bias and the residual, in fp32, before
    the rounding); with HAS_NORM, of x's rows RMS-normed and scaled by g, rounded to x's dtype, as `rms_norm`; GATED:
    W is [gate; up] (2N rows), the program streams gate rows n and up rows N + n and stores silu(gate) * up."""
    ROWS: tl.constexpr = 2 * BLOCK_N if GATED else BLOCK_N
    j = tl.arange(0, ROWS)
    rn = tl.program_id(0) * BLOCK_N + j % BLOCK_N                               # [ROWS] output features
    rm = tl.arange(0, BLOCK_M)                                                  # [BM]
    n_ok, m_ok = rn < N, rm < M
    w_row = rn + (j // BLOCK_N) * N                                             # [ROWS] gate rows, then up rows
    if HAS_NORM:
        inv_rms = _inverse_rms(x_ptr, rm, m_ok, K, eps, stride_xm, NORM_BLOCK)    # [BM]
    acc = tl.zeros((BLOCK_M, ROWS), tl.float32)
    if HAS_BIAS:                                  # bias and residual first: their latency hides behind the K loop
        acc += tl.load(b_ptr + w_row, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if HAS_RESIDUAL:
        acc += tl.load(r_ptr + rm[:, None] * stride_rm + rn[None, :], mask=m_ok[:, None] & n_ok[None, :],
                       other=0.0).to(tl.float32)                                                    # [BM, ROWS]
    w_rows = w_ptr + w_row[:, None].to(tl.int64) * stride_wn                    # [ROWS, 1]
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_ok = rk < K
        w = tl.load(w_rows + rk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)           # [ROWS, BK]
        x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=m_ok[:, None] & k_ok[None, :],
                    other=0.0).to(tl.float32)                                                       # [BM, BK]
        if HAS_NORM:
            g = tl.load(g_ptr + rk, mask=k_ok, other=0.0).to(tl.float32)                           # [BK]
            x = (g[None, :] * (x * inv_rms[:, None])).to(y_ptr.dtype.element_ty).to(tl.float32)
        acc += tl.sum(x[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)                        # [BM, ROWS]
    if GATED:                                     # as the compiled MLP: both rounded, silu(gate) * up rounded once
        halves = tl.permute(tl.reshape(acc.to(y_ptr.dtype.element_ty).to(tl.float32), (BLOCK_M, 2, BLOCK_N)), (0, 2, 1))
        gate, up = tl.split(halves)                                                                 # [BM, BN] each
        acc = gate * tl.sigmoid(gate) * up
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = rn < N
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The stock RMSNorm (Llama, Qwen, Mistral) as torch.compile computes it: weight * (x * rsqrt(mean(x^2) + eps))
    in fp32, rounded once to x's dtype (the eager class rounds x * rsqrt(...) to x's dtype before the product)."""
    xf = x.float()
    return (weight.float() * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))).to(x.dtype)


def gemv_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                   residual: torch.Tensor | None = None, norm: tuple | None = None, gated: bool = False
                   ) -> torch.Tensor:
    """fp32 x @ W^T (+ bias) (+ residual), rounded once to x's dtype; x first `rms_norm`ed with norm = (g, eps);
    gated: W = [gate; up], the result silu(gate) * up in fp32 of the rounded halves, rounded once."""
    x = x if norm is None else rms_norm(x, *norm)
    y = x.float() @ weight.float().T
    for term in (bias, residual):
        y = y if term is None else y + term.float()
    if gated:
        gate, up = y.to(x.dtype).float().chunk(2, dim=-1)
        y = torch.nn.functional.silu(gate) * up
    return y.to(x.dtype)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
         residual: torch.Tensor | None = None, config: GemvConfig | None = None,
         norm: tuple | None = None, gated: bool = False) -> torch.Tensor:
    """x [M, K] @ weight[N, K]^T (+ bias [N]) (+ residual [M, N]) -> [M, N] in x's dtype, for M <= MAX_ROWS rows;
    norm = (g [K], eps): `rms_norm(x, g, eps)` in place of x; gated: weight is [gate; up] and the result
    silu(gate) * up [M, N / 2] (a gated MLP's activation, as `gemv_reference`), each program on half its rows."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"gemv needs x [M, K] and weight [N, K], got {list(x.shape)} and {list(weight.shape)}.")
    if not 0 < x.shape[0] <= MAX_ROWS:
        raise ValueError(f"gemv takes 1 to {MAX_ROWS} rows, got {x.shape[0]}.")
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError("gemv needs x and weight contiguous along K.")
    if x.dtype != weight.dtype:
        raise ValueError(f"gemv needs x and weight of one dtype, got {x.dtype} and {weight.dtype}.")
    if bias is not None and (bias.shape != (weight.shape[0],) or bias.stride(0) != 1):
        raise ValueError(f"gemv needs a contiguous bias [{weight.shape[0]}], got {list(bias.shape)}.")
    if residual is not None and (residual.shape != (x.shape[0], weight.shape[0]) or residual.stride(1) != 1
                                 or residual.dtype != x.dtype):
        raise ValueError(f"gemv needs a residual [{x.shape[0]}, {weight.shape[0]}] of x's dtype, contiguous along N, "
                         f"got {residual.dtype} {list(residual.shape)}.")
    if norm is not None and (norm[0].shape != (x.shape[1],) or norm[0].stride(0) != 1):
        raise ValueError(f"gemv needs a contiguous norm weight [{x.shape[1]}], got {list(norm[0].shape)}.")
    if gated and (weight.shape[0] % 2 or residual is not None):
        raise ValueError(f"gemv gated needs [gate; up] weights of an even row count and no residual, got "
                         f"{weight.shape[0]} rows{' and a residual' if residual is not None else ''}.")
    (m, k), n = x.shape, weight.shape[0] // (2 if gated else 1)
    cfg = config or GemvConfig()
    block_n = max(1, cfg.block_n // 2) if gated else cfg.block_n
    y = x.new_empty(m, n)
    with torch.cuda.device(x.device) if x.is_cuda else nullcontext():       # Triton launches on the current GPU
        _gemv_kernel[(triton.cdiv(n, block_n),)](
            x, weight, weight if bias is None else bias, y if residual is None else residual,
            x if norm is None else norm[0], y, m, n, k, 0.0 if norm is None else float(norm[1]),
            x.stride(0), weight.stride(0), y.stride(0) if residual is None else residual.stride(0), y.stride(0),
            BLOCK_M=triton.next_power_of_2(m), BLOCK_N=block_n, BLOCK_K=cfg.block_k,
            NORM_BLOCK=min((cfg.norm_block if m == 1 else 0) or cfg.block_k, triton.next_power_of_2(k)),
            HAS_BIAS=bias is not None, HAS_RESIDUAL=residual is not None, HAS_NORM=norm is not None, GATED=gated,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return y


@torch.library.custom_op("kvq::gemv", mutates_args=())
def gemv_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
            residual: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None,
            eps: float = 0.0, gated: bool = False) -> torch.Tensor:
    """`gemv` with the default launch as a torch operator (norm_weight, eps: its `norm`; gated as there):
    torch.compile keeps it as one opaque call."""
    return gemv(x, weight, bias, residual, norm=None if norm_weight is None else (norm_weight, eps), gated=gated)


@gemv_op.register_fake
def _gemv_shape(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                residual: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None,
                eps: float = 0.0, gated: bool = False) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[0] // (2 if gated else 1))

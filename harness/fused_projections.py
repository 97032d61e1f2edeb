"""One GEMM for each attention's q, k and v projections in a compiled decode step (the same for every method).

    with fused_projections(model):      # harness.compiled_step.compiled_parts does this around each compiled step
        logits = model(input_ids=..., past_key_values=cache, ...).logits

A batch-1 decode step's weight GEMMs are bound by reading the weights, and cuBLAS read the three small q, k and v
matrices (Qwen3-4B: 4096, 1024 and 1024 rows of 2560, 31.5 MB) as three 7.3 us kernels per layer (1.44 TB/s;
results/bench/step_kernels.md); as one GEMM they take 13.8 us (results/bench/bench_throughput_fused_qkv.md). On its
first entry each attention's q, k and v weights (and biases) are concatenated once into one [N_q + N_k + N_v,
hidden] tensor, and the three Linear modules' parameters become views of its row blocks: in-place updates (the seam
folding R_V into v_proj, and restoring it) reach the fused tensor, and a CUDA graph captured over it keeps reading
live memory, so the views stay after the block (a model saved later holds shared storage). Inside the block q_proj
runs the fused GEMM and hands k_proj and v_proj their slices of its output for that same input; a call with any
other input computes its own projection.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F

PROJECTIONS = ("q_proj", "k_proj", "v_proj")
FUSED = "_kvq_fused_qkv"       # attribute of an attention module: its (fused weight, fused bias or None)


def fusable(module: torch.nn.Module) -> bool:
    """Plain Linear q, k and v projections (no forward of their own instance, e.g. an offloading hook) on one
    device, in one dtype, over one input width, all with or all without a bias."""
    projections = [getattr(module, name, None) for name in PROJECTIONS]
    if not all(type(p) is torch.nn.Linear and "forward" not in vars(p) for p in projections):
        return False
    kinds = {(p.weight.device, p.weight.dtype, p.in_features, p.bias is None) for p in projections}
    return len(kinds) == 1 and not projections[0].weight.is_meta


def fused_parameters(module: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The fused weight [N_q + N_k + N_v, hidden] (and bias [N]) whose row blocks the projections' parameters are
    views of: built on first use, and again if a parameter was since replaced rather than updated in place."""
    projections = [getattr(module, name) for name in PROJECTIONS]
    held = getattr(module, FUSED, None)
    if held is None or not _still_views(held, projections):
        held = _fuse(projections)
        setattr(module, FUSED, held)
    return held


def _fuse(projections) -> tuple[torch.Tensor, torch.Tensor | None]:
    weight = torch.cat([p.weight.data for p in projections])                   # [N_q + N_k + N_v, hidden]
    bias = None if projections[0].bias is None else torch.cat([p.bias.data for p in projections])   # [N]
    row = 0
    for p in projections:
        p.weight.data = weight[row:row + p.out_features]
        if bias is not None:
            p.bias.data = bias[row:row + p.out_features]
        row += p.out_features
    return weight, bias


def _still_views(held, projections) -> bool:
    weight, bias = held
    row = 0
    for p in projections:
        block = weight[row:row + p.out_features]
        if p.weight.data_ptr() != block.data_ptr() or p.weight.shape != block.shape:
            return False
        if bias is not None and p.bias.data_ptr() != bias[row:row + p.out_features].data_ptr():
            return False
        row += p.out_features
    return row == weight.shape[0]


def _route(module: torch.nn.Module) -> None:
    """q_proj computes all three projections; k_proj and v_proj take their slices for the same input."""
    weight, bias = fused_parameters(module)
    q_proj, k_proj, v_proj = (getattr(module, name) for name in PROJECTIONS)
    widths = [q_proj.out_features, k_proj.out_features, v_proj.out_features]
    handed: dict = {}

    def fused(x):
        q, k, v = F.linear(x, weight, bias).split(widths, dim=-1)             # [..., N_q], [..., N_k], [..., N_v]
        handed.clear()
        handed.update(input=x, k_proj=k, v_proj=v)
        return q

    def taker(name, projection):
        def forward(x):
            if handed.get("input") is x and name in handed:
                out = handed.pop(name)
                if len(handed) == 1:
                    handed.clear()                                          # both taken: drop the input
                return out
            return F.linear(x, projection.weight, projection.bias)
        return forward

    q_proj.forward = fused
    k_proj.forward, v_proj.forward = taker("k_proj", k_proj), taker("v_proj", v_proj)


@contextmanager
def fused_projections(model: torch.nn.Module):
    """Inside: every fusable attention's q, k and v projections run as one GEMM (module docstring); the stock
    forwards again after (the parameters stay views of the fused tensors)."""
    modules = [m for m in model.modules() if fusable(m)]
    for module in modules:
        _route(module)
    try:
        yield modules
    finally:
        for module in modules:
            for name in PROJECTIONS:
                del getattr(module, name).forward

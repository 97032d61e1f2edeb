"""One GEMM for each attention's q, k and v projections, and one for each gated MLP's gate and up projections, in a
compiled decode step (the same for every method).

    with fused_projections(model):      # harness.compiled_step.compiled_parts does this around each compiled step
        logits = model(input_ids=..., past_key_values=cache, ...).logits
    forward = compiled_forward(mlp)     # what compiled_parts compiles for an MLP (or RMSNorm) module

A batch-1 decode step's weight GEMMs are bound by reading the weights, and cuBLAS read the three small q, k and v
matrices (Qwen3-4B: 4096, 1024 and 1024 rows of 2560, 31.5 MB) as three 7.3 us kernels per layer (1.44 TB/s;
results/bench/step_kernels.md); as one GEMM they take 13.8 us (results/bench/bench_throughput_fused_qkv.md). On its
first entry each attention's q, k and v weights (and biases) are concatenated once into one [N_q + N_k + N_v,
hidden] tensor, and the three Linear modules' parameters become views of its row blocks: in-place updates (the seam
folding R_V into v_proj, and restoring it) reach the fused tensor, and a CUDA graph captured over it keeps reading
live memory, so the views stay after the block (a model saved later holds shared storage). Inside the block q_proj
runs the fused GEMM and hands k_proj and v_proj their slices of its output for that same input; a call with any
other input computes its own projection. A gated MLP (transformers' `down(act(gate(x)) * up(x))`, the class forward
of Llama, Qwen, Mistral and Gemma MLPs, checked by its source) is compiled with `fused_gated_mlp_forward` instead,
which computes gate and up as one GEMM over their fused weight, built and kept the same way.

With a single row (batch-1 decode on CUDA) these GEMMs, the MLP's down projection, each attention's output
projection and the LM head run on kernels/gemv.py instead of cuBLAS (`single_row_linear`): on the H100 at Qwen3-4B's
shapes the GEMV kernel took 4-18 % less time than cuBLAS (results/bench/bench_gemv.md). It sums in another order than
cuBLAS, so a compiled step's logits move within fp32 rounding of the products' sums.
"""
from __future__ import annotations

import functools
import inspect
import re
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from kernels.gemv import gemv_op, rms_norm

PROJECTIONS = ("q_proj", "k_proj", "v_proj")
GATE_UP = ("gate_proj", "up_proj")
FUSED = {PROJECTIONS: "_kvq_fused_qkv", GATE_UP: "_kvq_fused_gate_up"}  # module attribute: (weight, bias or None)
GEMV_DTYPES = (torch.bfloat16, torch.float16)                             # inputs `single_row_linear` hands the GEMV
PENDING_RESIDUAL = "_kvq_pending_residual"  # an output projection's instance attribute: add this to its next output
PENDING_NORM = "_kvq_pending_norm"          # a fused q_proj's instance attribute: (g, eps), RMS-norm its next input
_GATED = "self.down_proj(self.act_fn(self.gate_proj(x))*self.up_proj(x))"
SILU_FORWARD = "defforward(self,input:Tensor)->Tensor:returnnn.functional.silu(input)"   # transformers' SiLUActivation
SILU_GATE = "_kvq_silu_gate"   # a gated MLP's instance attribute (`compiled_forward`): its gate/up GEMV applies SiLU
STOCK_GATED_MLPS = (f"defforward(self,x):down_proj={_GATED}returndown_proj",     # transformers' gated MLP forwards,
                    f"defforward(self,x):return{_GATED}")                       # whitespace removed


def fusable(module: torch.nn.Module, names: tuple[str, ...] = PROJECTIONS) -> bool:
    """Plain Linear projections `names` (no forward of their own instance, e.g. an offloading hook) on one
    device, in one dtype, over one input width, all with or all without a bias."""
    projections = [getattr(module, name, None) for name in names]
    if not all(type(p) is torch.nn.Linear and "forward" not in vars(p) for p in projections):
        return False
    kinds = {(p.weight.device, p.weight.dtype, p.in_features, p.bias is None) for p in projections}
    return len(kinds) == 1 and not projections[0].weight.is_meta


def fused_parameters(module: torch.nn.Module, names: tuple[str, ...] = PROJECTIONS
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The fused weight [N_q + N_k + N_v, hidden] (or [N_gate + N_up, hidden]; and bias [N]) whose row blocks the
    projections' parameters are views of: built on first use, and again if a parameter was since replaced rather
    than updated in place."""
    projections = [getattr(module, name) for name in names]
    held = getattr(module, FUSED[names], None)
    if held is None or not _still_views(held, projections):
        held = _fuse(projections)
        setattr(module, FUSED[names], held)
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


@functools.cache
def bare_source(fn) -> str:
    """fn's source with comments and whitespace removed ('' where it has none): what the fused forwards check a
    class forward against."""
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        return ""
    return "".join(re.sub(r"#[^\n]*", "", source).split())


def gated_mlp(module: torch.nn.Module) -> bool:
    """A module whose class forward is transformers' gated MLP, down(act(gate(x)) * up(x)), over fusable gate and
    up projections (and no forward of its own instance)."""
    return ("forward" not in vars(module) and fusable(module, GATE_UP)
            and bare_source(type(module).forward) in STOCK_GATED_MLPS)


def single_gemv_row(x: torch.Tensor) -> bool:
    """x is one row of a 16-bit CUDA tensor: what `single_row_linear` hands the GEMV kernel (with a weight of its
    dtype)."""
    return x.is_cuda and x.numel() == x.shape[-1] and x.dtype in GEMV_DTYPES


def gemv_takes(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               residual: torch.Tensor | None = None, norm: tuple | None = None) -> bool:
    """`single_row_linear` runs these operands on the GEMV kernel: a `single_gemv_row` x, contiguous weight, bias
    and norm weight of its dtype, a residual of one row."""
    n = weight.shape[0]
    return (single_gemv_row(x) and x.dtype == weight.dtype and weight.is_contiguous()
            and (bias is None or bias.is_contiguous())
            and (residual is None or (residual.dtype == x.dtype and residual.numel() == n))
            and (norm is None or (norm[0].dtype == x.dtype and norm[0].is_contiguous())))


def single_row_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                      residual: torch.Tensor | None = None, norm: tuple | None = None,
                      gated: bool = False) -> torch.Tensor:
    """F.linear (plus `residual`, the decoder layer's stream, when given), run by kernels/gemv.py for a single row
    of a 16-bit CUDA input (a batch-1 decode step's projections, where cuBLAS read the weights at 53-91 % of the copy
    bandwidth and the GEMV kernel at 65-98 %: results/bench/bench_gemv.md); the GEMV adds the residual in its
    epilogue, before its one rounding (the stock layer rounds the projection, then the sum). norm = (g, eps): x is
    first RMS-normed (`kernels.gemv.rms_norm`, inside the GEMV on its path). gated=True: weight is [gate; up]
    (2n rows) and the result silu(gate) * up [..., n] (in the GEMV's epilogue, rounded once, on its path)."""
    n = weight.shape[0]
    if gemv_takes(x, weight, bias, residual, norm):
        rows = None if residual is None else residual.reshape(1, n)
        g, eps = norm if norm is not None else (None, 0.0)
        return gemv_op(x.reshape(1, -1), weight, bias, rows, g, eps, gated).view(*x.shape[:-1], -1)
    out = F.linear(x if norm is None else rms_norm(x, *norm), weight, bias)
    if gated:
        gate, up = out.chunk(2, dim=-1)
        out = F.silu(gate) * up
    return out if residual is None else residual + out


def plain_linear(module) -> bool:
    """An nn.Linear with no forward of its own instance (an offloading hook's wrapper is left alone)."""
    return type(module) is torch.nn.Linear and "forward" not in vars(module)


def silu(act: torch.nn.Module) -> bool:
    """act is torch's SiLU or transformers' SiLU activation (its stock forward, none of its instance)."""
    return "forward" not in vars(act) and (type(act) is torch.nn.SiLU or bare_source(type(act).forward) == SILU_FORWARD)


def fused_gated_mlp_forward(self, x, residual=None, norm_weight=None, eps=0.0):
    """The gated MLP with gate and up as one GEMM over their fused weight (`fused_parameters(self, GATE_UP)` must
    have run), single rows on the GEMV kernel (`single_row_linear`): x [..., hidden] -> [..., hidden], plus
    `residual` [..., hidden] when given (harness.fused_residuals: in the down projection's epilogue); with
    norm_weight, x is the un-normed stream and the RMSNorm before the MLP runs in the gate/up GEMM. With a SiLU
    activation (SILU_GATE, set by `compiled_forward`) the gate/up GEMV also applies it (`gemv(..., gated=True)`:
    silu(gate) * up rounded once, as the compiled MLP does), so the product costs no launch of its own."""
    weight, bias = getattr(self, FUSED[GATE_UP])
    norm = None if norm_weight is None else (norm_weight, eps)
    if getattr(self, SILU_GATE, False):
        hidden = single_row_linear(x, weight, bias, norm=norm, gated=True)
    else:
        gate, up = single_row_linear(x, weight, bias, norm=norm).split([self.gate_proj.out_features,
                                                                        self.up_proj.out_features], dim=-1)
        hidden = self.act_fn(gate) * up
    if plain_linear(self.down_proj):
        return single_row_linear(hidden, self.down_proj.weight, self.down_proj.bias, residual)
    out = self.down_proj(hidden)
    return out if residual is None else residual + out


def compiled_forward(module: torch.nn.Module):
    """The function harness.compiled_step compiles for an RMSNorm or MLP module: `fused_gated_mlp_forward` for a
    gated MLP (its fused weight made ready here, outside the compiled code), else the class's forward."""
    if gated_mlp(module):
        fused_parameters(module, GATE_UP)
        vars(module)[SILU_GATE] = silu(module.act_fn) and module.gate_proj.out_features == module.up_proj.out_features
        return fused_gated_mlp_forward
    return type(module).forward


def _route(module: torch.nn.Module) -> None:
    """q_proj computes all three projections; k_proj and v_proj take their slices for the same input."""
    weight, bias = fused_parameters(module, PROJECTIONS)
    q_proj, k_proj, v_proj = (getattr(module, name) for name in PROJECTIONS)
    widths = [q_proj.out_features, k_proj.out_features, v_proj.out_features]
    handed: dict = {}

    def fused(x):
        norm = vars(q_proj).pop(PENDING_NORM, None)                            # x un-normed (fused_residuals)
        q, k, v = single_row_linear(x, weight, bias, norm=norm).split(widths, dim=-1)   # [..., N_q / N_k / N_v]
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


def output_projections(model: torch.nn.Module, attentions: list) -> list[torch.nn.Linear]:
    """The plain-Linear output projections of those attentions and the LM head, which `fused_projections` runs
    through `single_row_linear`."""
    found = [m.o_proj for m in attentions if plain_linear(getattr(m, "o_proj", None))]
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return found + ([head] if plain_linear(head) else [])


@contextmanager
def fused_projections(model: torch.nn.Module):
    """Inside: every fusable attention's q, k and v projections run as one GEMM (module docstring), and those
    and the output projections and LM head take single rows on the GEMV kernel (`single_row_linear`); the stock
    forwards again after (the parameters stay views of the fused tensors)."""
    modules = [m for m in model.modules() if fusable(m, PROJECTIONS)]
    outputs = output_projections(model, modules)
    for module in modules:
        _route(module)
    for linear in outputs:
        linear.forward = functools.partial(_linear_forward, linear)
    try:
        yield modules
    finally:
        for module in modules:
            for name in PROJECTIONS:
                del getattr(module, name).forward
        for linear in outputs:
            del linear.forward


def _linear_forward(linear: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """The block's forward of an output projection or LM head: `single_row_linear`, adding the residual a fused
    decoder layer left for this call (harness.fused_residuals), if any."""
    return single_row_linear(x, linear.weight, linear.bias, vars(linear).pop(PENDING_RESIDUAL, None))

"""The model's own small operations of a decode step as fused inductor kernels: RMSNorms, MLPs, RoPE.

    refusal = compile_step_refusal(model)          # one sentence, or None
    with compiled_parts(model):                     # DecodeStep does this around each step when compile_step=True
        logits = model(input_ids=..., past_key_values=cache, ...).logits

Besides its GEMMs and attention, one decode step of a stock transformers decoder launches some forty tiny
element-wise kernels per layer (results/bench/bench_throughput_profile.md): each RMSNorm is a cast, a square, a
mean, an rsqrt and two products; RoPE rotates half of q and of k with a slice, a negation, a concatenation and
three products; the MLP multiplies SiLU(gate) by up. Inside the block, the forward of every RMSNorm and MLP module
and the modeling module's `apply_rotary_pos_emb` are swapped for torch.compile'd ones (inductor, mode "default":
it adds no CUDA graph of its own, since DecodeStep captures the whole step), so each of them is one fused kernel
(the MLP: its GEMMs plus one), the same for BF16 and every quantizer; each attention's q, k and v projections,
and each gated MLP's gate and up projections, run as one GEMM over their concatenated weights
(harness.fused_projections), and each stock pre-norm decoder layer's two residual adds run in the epilogues of the
output and down projections (harness.fused_residuals), and on a single row its two RMSNorms inside the q/k/v and
gate/up GEMVs after them (the same module); a Qwen3-style attention's q and k norms run inside its compiled
RoPE call (harness.deferred_norms). The attention path (the
cache's write, the quantizer's rotations, the Triton decode kernels) is never traced: it runs between the compiled
pieces as it does without them. Leaving the block restores the stock forwards, so a prefill never runs compiled code.

Each piece is compiled once per class (torch.compile caches by code object, and the compiled callables are kept
here), on the first step that runs it: DecodeStep's eager warm-up, before its CUDA graph is captured.
"""
from __future__ import annotations

import functools
import shutil
import sys
import types
from contextlib import contextmanager

import torch

from harness.deferred_norms import deferred_norms, normed_rope_for, qk_norm_attentions, rope_taking_norms
from harness.fused_projections import compiled_forward, fused_projections, gated_mlp
from harness.fused_residuals import fused_residuals, norm_folding_layer, residual_layers

COMPILE_OPTIONS = {"combo_kernels": True}     # inductor's default mode (not reduce-overhead: the captured step is
                                              # already one CUDA graph), independent kernels of a call in one launch
COMPILED_CLASS_SUFFIXES = ("RMSNorm", "MLP")  # Qwen3RMSNorm, LlamaMLP, Gemma3RMSNorm, ...: pure tensor functions
ROPE_FUNCTION = "apply_rotary_pos_emb"        # a global of each modeling module, looked up at every call
CPP_COMPILERS = ("g++", "c++", "clang++")     # inductor's CPU backend builds C++ kernels


@functools.cache
def _compiled(fn):
    """fn compiled once (one graph, no graph break allowed): the same callable for every module of its class."""
    return torch.compile(fn, options=COMPILE_OPTIONS, fullgraph=True)


def compilable_modules(model) -> list[torch.nn.Module]:
    """The model's RMSNorm and MLP modules (every decoder layer's, q/k norms where the model has them, the final
    norm) that have no forward of their own instance (a hook library's wrapper stays as it is)."""
    return [m for m in model.modules()
            if type(m).__name__.endswith(COMPILED_CLASS_SUFFIXES) and "forward" not in vars(m)]


def rope_namespaces(model) -> list[types.ModuleType]:
    """The Python modules (modeling_qwen3, ...) whose attention classes call a global `apply_rotary_pos_emb`."""
    names = {type(m).__module__ for m in model.modules() if type(m).__name__.endswith("Attention")}
    return [sys.modules[name] for name in sorted(names) if hasattr(sys.modules.get(name), ROPE_FUNCTION)]


def cpu_compiler_refusal() -> str | None:
    """Why a step on the CPU cannot be compiled here (no C++ compiler on PATH: one sentence), or None."""
    if any(shutil.which(cxx) for cxx in CPP_COMPILERS):
        return None
    return (f"compile_step on the CPU needs a C++ compiler (inductor builds C++ kernels); none of "
            f"{', '.join(CPP_COMPILERS)} is on PATH.")


def compile_step_refusal(model) -> str | None:
    """Why the decode step of `model` cannot be compiled here (one sentence), or None when it can."""
    if not compilable_modules(model):
        return (f"compile_step found no module whose class name ends with {' or '.join(COMPILED_CLASS_SUFFIXES)} "
                f"in this model; run it with compile_step=off.")
    return cpu_compiler_refusal() if next(model.parameters()).device.type == "cpu" else None


@contextmanager
def compiled_parts(model):
    """Inside: the model's RMSNorms, MLPs (gate and up as one GEMM) and RoPE run compiled (a Qwen3-style attention's
    q and k norms inside its RoPE call: harness.deferred_norms), each attention's q, k and v projections as one GEMM
    (harness.fused_projections) and each stock decoder layer's residual adds in its projections
    (harness.fused_residuals; see the module docstring); restored after."""
    qk_normed, pending = qk_norm_attentions(model), {}
    deferred = {id(a.q_norm) for a in qk_normed} | {id(a.k_norm) for a in qk_normed}   # applied by the RoPE call
    modules = [m for m in compilable_modules(model) if id(m) not in deferred]
    residual_mlps = {id(m) for m in modules if gated_mlp(m)}              # compiled as fused_gated_mlp_forward
    layers = residual_layers(model)
    folding = {id(layer) for layer in layers if norm_folding_layer(layer)}  # checked before any forward is swapped
    stock_rope = {space: getattr(space, ROPE_FUNCTION) for space in rope_namespaces(model)}
    for module in modules:
        module.forward = types.MethodType(_compiled(compiled_forward(module)), module)
    for space, rope in stock_rope.items():
        setattr(space, ROPE_FUNCTION, functools.partial(rope_taking_norms, pending=pending, rope=_compiled(rope),
                                                        normed=_compiled(normed_rope_for(rope))))
    try:
        with fused_projections(model) as attentions, deferred_norms(qk_normed, pending):
            fused = [layer for layer in layers if layer.self_attn in attentions]   # o_proj takes the residual
            with fused_residuals(fused, residual_mlps, folding):
                yield
    finally:
        for module in modules:
            del module.forward                                  # the class's stock forward again
        for space, rope in stock_rope.items():
            setattr(space, ROPE_FUNCTION, rope)

"""A compiled decode step's residual adds in the epilogues of the projections before them (the same for every method).

    layers = residual_layers(model)         # stock pre-norm decoder layers (Llama, Qwen2/3, Mistral), taken first:
    with fused_projections(model):          # inside it o_proj has a forward of its instance
        with fused_residuals(layers, residual_mlps):   # harness.compiled_step.compiled_parts does this
            logits = model(input_ids=..., past_key_values=cache, ...).logits

A stock pre-norm decoder layer adds its input to the attention's output and that sum to the MLP's output: two
element-wise kernels per layer (1.6 us each at Qwen3-4B's batch-1 decode step on the H100,
results/bench/step_kernels.md). Inside the block such a layer runs `residual_layer_forward` instead: it leaves the
layer's input for the attention's output projection (harness.fused_projections' `_linear_forward` adds it), and
hands the attention's sum to the gated MLP's compiled forward (`fused_gated_mlp_forward`), which adds it in the
down projection. On a single row both adds land in the GEMV kernel's epilogue (kernels/gemv.py), in fp32 before the
one rounding, where the stock layer rounds the projection and then the sum; more rows add after the GEMM as before.

A layer is taken only where its class forward is the stock one (checked by its source, comments and whitespace
removed), its attention's forward ends by returning the output projection's result, and that projection is a plain
Linear (which harness.fused_projections runs); others keep their forward.
"""
from __future__ import annotations

import functools
from contextlib import contextmanager

import torch

from harness.fused_projections import PENDING_RESIDUAL, bare_source, plain_linear

STOCK_LAYER_BODY = (  # transformers' pre-norm decoder layer forward (Llama, Qwen2, Qwen3, Mistral), whitespace removed
    "residual=hidden_stateshidden_states=self.input_layernorm(hidden_states)hidden_states,_=self.self_attn("
    "hidden_states=hidden_states,attention_mask=attention_mask,position_ids=position_ids,past_key_values="
    "past_key_values,use_cache=use_cache,position_embeddings=position_embeddings,**kwargs,)hidden_states=residual+"
    "hidden_statesresidual=hidden_stateshidden_states=self.post_attention_layernorm(hidden_states)hidden_states="
    "self.mlp(hidden_states)hidden_states=residual+hidden_statesreturnhidden_states")
STOCK_ATTENTION_END = "attn_output=self.o_proj(attn_output)returnattn_output,attn_weights"


def residual_layer(module: torch.nn.Module) -> bool:
    """A stock pre-norm decoder layer (no forward of its own instance) whose attention returns its plain-Linear
    output projection's result."""
    attention = getattr(module, "self_attn", None)
    return ("forward" not in vars(module) and bare_source(type(module).forward).endswith(STOCK_LAYER_BODY)
            and attention is not None and bare_source(type(attention).forward).endswith(STOCK_ATTENTION_END)
            and plain_linear(getattr(attention, "o_proj", None)))


def residual_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's `residual_layer`s (taken outside fused_projections, whose o_proj forwards they would not pass)."""
    return [m for m in model.modules() if residual_layer(m)]


def residual_layer_forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None,
                           use_cache=False, position_embeddings=None, mlp_takes_residual=False, **kwargs):
    """The stock layer with the input added by the attention's output projection and the attention's sum by the
    MLP (`mlp_takes_residual`: its forward is the compiled `fused_gated_mlp_forward`; else added after it):
    hidden_states [B, T, hidden] -> [B, T, hidden]."""
    normed = self.input_layernorm(hidden_states)
    o_proj = self.self_attn.o_proj
    vars(o_proj)[PENDING_RESIDUAL] = hidden_states
    try:
        hidden_states, _ = self.self_attn(hidden_states=normed, attention_mask=attention_mask,
                                          position_ids=position_ids, past_key_values=past_key_values,
                                          use_cache=use_cache, position_embeddings=position_embeddings, **kwargs)
    finally:
        untaken = vars(o_proj).pop(PENDING_RESIDUAL, None)               # never left behind for another call
    if untaken is not None:
        raise RuntimeError("a fused decoder layer's output projection did not add its residual; run the layer "
                           "inside harness.fused_projections.fused_projections.")
    normed = self.post_attention_layernorm(hidden_states)
    if mlp_takes_residual:
        return self.mlp(normed, hidden_states)
    return hidden_states + self.mlp(normed)


@contextmanager
def fused_residuals(layers: list[torch.nn.Module], residual_mlps: set[int]):
    """Inside: each of `layers` runs `residual_layer_forward` (the MLPs whose id is in residual_mlps take the residual
    in their forward); the stock forwards again after. The output projections must run harness.fused_projections'
    forward inside (it takes the residual)."""
    for layer in layers:
        layer.forward = functools.partial(residual_layer_forward, layer,
                                          mlp_takes_residual=id(layer.mlp) in residual_mlps)
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward

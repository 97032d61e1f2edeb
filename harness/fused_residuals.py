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
Linear (which harness.fused_projections runs); others keep their forward. A layer of a model split over GPUs keeps
accelerate's hook (harness.placement), which moves its inputs to its GPU and then calls the forward it wrapped: that
wrapped forward is the one swapped (`forward_slot`).

Its two RMSNorms fold into the GEMMs after them where `norm_folding_layer` holds (stock RMSNorm forwards, an
attention that uses its input only in the q, k and v projections, those fused into one GEMM, and a fused gated MLP):
on a single row (`single_gemv_row`) the layer hands the attention and the MLP the un-normed stream and each norm's
(weight, eps), and the q/k/v and gate/up GEMVs norm their input as they load it (kernels/gemv.py): two launches fewer
per layer, the same rounding as the compiled norm's (`kernels.gemv.rms_norm`) up to its sum of squares' order.
"""
from __future__ import annotations

import functools
from contextlib import contextmanager

import torch

from harness.fused_projections import (PENDING_NORM, PENDING_RESIDUAL, PROJECTIONS, bare_source, fusable, gated_mlp,
                                       plain_linear, single_gemv_row)

STOCK_LAYER_BODY = (  # transformers' pre-norm decoder layer forward (Llama, Qwen2, Qwen3, Mistral), whitespace removed
    "residual=hidden_stateshidden_states=self.input_layernorm(hidden_states)hidden_states,_=self.self_attn("
    "hidden_states=hidden_states,attention_mask=attention_mask,position_ids=position_ids,past_key_values="
    "past_key_values,use_cache=use_cache,position_embeddings=position_embeddings,**kwargs,)hidden_states=residual+"
    "hidden_statesresidual=hidden_stateshidden_states=self.post_attention_layernorm(hidden_states)hidden_states="
    "self.mlp(hidden_states)hidden_states=residual+hidden_statesreturnhidden_states")
STOCK_ATTENTION_END = "attn_output=self.o_proj(attn_output)returnattn_output,attn_weights"
STOCK_RMS_NORM = (  # transformers' RMSNorm forward (Llama, Qwen2, Qwen3, Mistral), whitespace removed
    "defforward(self,hidden_states:torch.Tensor)->torch.Tensor:input_dtype=hidden_states.dtypehidden_states="
    "hidden_states.to(torch.float32)variance=hidden_states.pow(2).mean(-1,keepdim=True)hidden_states=hidden_states*"
    "torch.rsqrt(variance+self.variance_epsilon)returnself.weight*hidden_states.to(input_dtype)")
ATTENTION_INPUT_USES = ("defforward(self,hidden_states:", "hidden_states.shape[:-1]", "self.q_proj(hidden_states)",
                        "self.k_proj(hidden_states)", "self.v_proj(hidden_states)")


def forward_slot(module: torch.nn.Module) -> str | None:
    """The attribute whose forward a step may swap: "forward" (the instance has none of its own), "_old_forward"
    (an accelerate hook's wrapper, which calls that attribute after moving the inputs, around the class's
    forward), or None (another wrapper: left alone)."""
    if "forward" not in vars(module):
        return "forward"
    wrapped = vars(module).get("_old_forward")
    if hasattr(module, "_hf_hook") and getattr(wrapped, "__func__", None) is type(module).forward:
        return "_old_forward"
    return None


def residual_layer(module: torch.nn.Module) -> bool:
    """A stock pre-norm decoder layer (no forward of its own instance but an accelerate hook's, `forward_slot`) whose
    attention returns its plain-Linear output projection's result."""
    attention = getattr(module, "self_attn", None)
    return (forward_slot(module) is not None and bare_source(type(module).forward).endswith(STOCK_LAYER_BODY)
            and attention is not None and bare_source(type(attention).forward).endswith(STOCK_ATTENTION_END)
            and plain_linear(getattr(attention, "o_proj", None)))


def _stock_rms_norm(module) -> bool:
    return "forward" not in vars(module) and bare_source(type(module).forward) == STOCK_RMS_NORM


def _projects_input_only(attention) -> bool:
    """The attention's forward uses its input only for its shape and the q, k and v projections."""
    source = bare_source(type(attention).forward)
    for use in ATTENTION_INPUT_USES:
        source = source.replace(use, "", 1)
    return "hidden_states" not in source


def norm_folding_layer(layer: torch.nn.Module) -> bool:
    """A `residual_layer` whose norms can fold into the GEMMs after them (module docstring); checked, like
    `residual_layer`, before the compiled step swaps any forward."""
    attention = layer.self_attn
    return (residual_layer(layer) and _stock_rms_norm(layer.input_layernorm)
            and _stock_rms_norm(layer.post_attention_layernorm) and _projects_input_only(attention)
            and fusable(attention, PROJECTIONS) and gated_mlp(layer.mlp))


def _norm(module) -> tuple[torch.Tensor, float]:
    return module.weight, module.variance_epsilon


def residual_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's `residual_layer`s (taken outside fused_projections, whose o_proj forwards they would not pass)."""
    return [m for m in model.modules() if residual_layer(m)]


def residual_layer_forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None,
                           use_cache=False, position_embeddings=None, mlp_takes_residual=False, fold_norms=False,
                           **kwargs):
    """The stock layer with the input added by the attention's output projection and the attention's sum by the
    MLP (`mlp_takes_residual`: its forward is the compiled `fused_gated_mlp_forward`; else added after it), and with
    `fold_norms` (a `norm_folding_layer`) on a single row both norms in the GEMMs after them: hidden_states
    [B, T, hidden] -> [B, T, hidden]."""
    fold = fold_norms and single_gemv_row(hidden_states)
    q_proj, o_proj = self.self_attn.q_proj, self.self_attn.o_proj
    vars(o_proj)[PENDING_RESIDUAL] = hidden_states
    if fold:
        vars(q_proj)[PENDING_NORM] = _norm(self.input_layernorm)
    try:
        hidden_states, _ = self.self_attn(hidden_states=hidden_states if fold else self.input_layernorm(hidden_states),
                                          attention_mask=attention_mask, position_ids=position_ids,
                                          past_key_values=past_key_values, use_cache=use_cache,
                                          position_embeddings=position_embeddings, **kwargs)
    finally:                                                             # never left behind for another call
        untaken = [vars(m).pop(name, None) for m, name in ((o_proj, PENDING_RESIDUAL), (q_proj, PENDING_NORM))]
    if any(t is not None for t in untaken):
        raise RuntimeError("a fused decoder layer's output projection did not add its residual (or q_proj did not "
                           "take its norm); run the layer inside harness.fused_projections.fused_projections.")
    if fold:
        return self.mlp(hidden_states, hidden_states, *_norm(self.post_attention_layernorm))
    normed = self.post_attention_layernorm(hidden_states)
    if mlp_takes_residual:
        return self.mlp(normed, hidden_states)
    return hidden_states + self.mlp(normed)


@contextmanager
def fused_residuals(layers: list[torch.nn.Module], residual_mlps: set[int], norm_folding: set[int] = frozenset()):
    """Inside: each of `layers` runs `residual_layer_forward` (the MLPs whose id is in residual_mlps take the residual
    in their forward; the layers whose id is in norm_folding, `norm_folding_layer`s found before any forward was
    swapped, with such an MLP fold their norms); the stock forwards again after. The projections must run
    harness.fused_projections' forwards inside (they take the residual and the norm)."""
    slots = [(layer, forward_slot(layer), vars(layer).get("_old_forward")) for layer in layers]
    for layer, slot, _ in slots:
        takes = id(layer.mlp) in residual_mlps
        setattr(layer, slot, functools.partial(residual_layer_forward, layer, mlp_takes_residual=takes,
                                               fold_norms=takes and id(layer) in norm_folding))
    try:
        yield
    finally:
        for layer, slot, wrapped in slots:
            if slot == "forward":
                del layer.forward
            else:
                layer._old_forward = wrapped        # the hook's wrapper calls the class's forward again

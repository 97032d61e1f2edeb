"""Simulated quantization: a forward pass whose attention reads every token's K/V quantize-dequantized.

The three-region cache keeps the sink and recent windows, and a prefill chunk's own rows, in full precision,
so a prefill through it quantizes nothing that chunk attends to. Inside `simulated_quantization(model, layers)`
the model (with the seam installed: R_V folded into v_proj) runs the `kvq_simulated` attention instead: in each
layer of `layers` (layer id -> its quantizer), q and k are rotated by R_K, the keys are quantized around the key
offset and the values (already in the R_V basis) as they are, every token (the history regime: no
full-precision windows), and attention runs on what the quantizer reads back; every other layer, and the
output's way back through R_V^T, is the seam's own `kvq_attention`. Run the model without a cache:

    with install(model, quantizer) as seam, simulated_quantization(model, {1: quantizer, 3: quantizer}):
        out = model(ids, use_cache=False)        # layers 1 and 3 attend over dequantized K/V
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from harness.seam import kvq_attention

SIMULATED_ATTN = "kvq_simulated"


def quantize_dequantize(quantizer, x: torch.Tensor, spec) -> torch.Tensor:
    """x [..., T, D] as `quantizer` stores and reads it back with `spec` (fp32 math, x's dtype out; None: x).

    Channel-axis groups run along tokens: the last T % group tokens, which fill no group, stay as they are."""
    if spec is None:
        return x
    rows = x.float()
    tokens = rows.shape[-2]
    usable = tokens - tokens % spec.group if spec.axis == "channel" else tokens
    out = rows.clone()
    if usable:
        out[..., :usable, :] = quantizer.dequantize(quantizer.quantize(rows[..., :usable, :], spec))
    return out.to(x.dtype)


def quantized_keys(quantizer, layer_idx: int, query: torch.Tensor, key: torch.Tensor):
    """(query, key) rotated by R_K (fp32 GEMMs), the keys quantize-dequantized around the key offset.

    query [B, H_q, T, D], key [B, H_kv, T, D] post-RoPE; both returned in their own dtype."""
    r_k = quantizer.key_rotation(layer_idx)                                   # [D, D] or None
    rotated = key.float()
    if r_k is not None:
        r_k = r_k.to(key.device, torch.float32)
        query, rotated = (query.float() @ r_k).to(query.dtype), rotated @ r_k
    offset = quantizer.key_offset(layer_idx)                                  # [H_kv, D] or None
    shift = 0.0 if offset is None else offset.to(key.device, torch.float32)[None, :, None, :]   # [1, H_kv, 1, D]
    restored = quantize_dequantize(quantizer, rotated - shift, quantizer.key_spec) + shift
    return query, restored.to(key.dtype)


class Simulation:
    """The layers the active simulation quantizes: layer id -> the quantizer that stores it (codes only)."""

    active: dict | None = None


def simulated_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The seam's attention, over quantize-dequantized K/V in the layers of the active simulation (plain tensors:
    query [B, H_q, T, D], key/value [B, H_kv, T, D]); returns ([B, T, H_q, D], None)."""
    quantizer = (Simulation.active or {}).get(module.layer_idx)
    if quantizer is not None:
        query, key = quantized_keys(quantizer, module.layer_idx, query, key)
        value = quantize_dequantize(quantizer, value, quantizer.value_spec)   # already in the R_V basis
    return kvq_attention(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)


AttentionInterface.register(SIMULATED_ATTN, simulated_attention)
AttentionMaskInterface.register(SIMULATED_ATTN, sdpa_mask)


@contextmanager
def simulated_quantization(model, layers: dict):
    """Inside the block, the layers of `layers` (layer id -> quantizer) attend over quantize-dequantized K/V of
    every token (run the model with use_cache=False); a quantizer that stores no codes leaves its layer exact."""
    previous = model.config._attn_implementation
    Simulation.active = {idx: quantizer for idx, quantizer in layers.items() if quantizer.stores_codes}
    model.set_attn_implementation(SIMULATED_ATTN)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)
        Simulation.active = None

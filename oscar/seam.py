"""The one place that touches transformers: attention function, mask function, cache, weight folding.

    with install(model, quantizer) as seam:
        out = model.generate(ids, attention_mask=mask, past_key_values=seam.new_cache(), ...)

`install` registers the `kvq` attention implementation (AttentionInterface) together with a mask
function (AttentionMaskInterface; without it transformers passes attention_mask=None and silently
drops sliding-window and padding masks), folds R_V into v_proj, and switches the model to `kvq`.
Leaving the context restores the weights and the previous attention implementation.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache, DynamicSlidingWindowLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from oscar.cache import KVView, ThreeRegionLayer

ATTN_NAME = "kvq"
SUPPORTED_MODEL_TYPES = ("qwen3", "qwen2", "llama", "mistral", "gemma3_text", "gemma3")


def check_architecture(config) -> None:
    """Refuse architectures the seam has not been verified on, by name, before any weights load."""
    model_type = getattr(config, "model_type", "?")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"Architecture '{model_type}' is not supported by the KV seam; "
                         f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}.")


def kvq_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention over a `KVView` (quantized-cache layers) or plain tensors (sliding layers, no cache).

    query: [B, H_q, T_q, D] post-RoPE. Returns ([B, T_q, H_q, D], None) like transformers' sdpa.
    """
    if isinstance(key, KVView):
        if key.layer.key_rotation is not None:
            query = (query.float() @ key.layer.key_rotation.to(query.device)).to(query.dtype)
        key, value = key.keys, key.values
    out, _ = sdpa_attention_forward(module, query, key, value, attention_mask,
                                    scaling=scaling, dropout=dropout, **kwargs)   # [B, T_q, H_q, D]
    r_v = getattr(module, "_kvq_value_rotation", None)   # v_proj folded: map the output back
    if r_v is not None:
        out = (out.float() @ r_v.T.to(out.device)).to(out.dtype)
    return out, None


AttentionInterface.register(ATTN_NAME, kvq_attention)
AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)


def attention_modules(model) -> list[torch.nn.Module]:
    """The self-attention modules of a decoder, in layer order (those with layer_idx and v_proj)."""
    found = [m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "v_proj") and hasattr(m, "o_proj")]
    return sorted(found, key=lambda m: m.layer_idx)


def fold_value_rotation(module, rotation: torch.Tensor) -> torch.Tensor:
    """v_proj <- per KV head R^T W_h (and b_h R) in fp32, so v' = v @ R; returns the original weight."""
    proj, d = module.v_proj, rotation.shape[0]
    original = proj.weight.data.clone()
    rot = rotation.to(torch.float32).to(proj.weight.device)
    w = proj.weight.data.float().view(-1, d, proj.weight.shape[-1])           # [H_kv, D, hidden]
    proj.weight.data.copy_(torch.einsum("ed,hei->hdi", rot, w).reshape_as(proj.weight))
    if proj.bias is not None:
        module._kvq_bias_backup = proj.bias.data.clone()
        proj.bias.data.copy_((proj.bias.data.float().view(-1, d) @ rot).reshape_as(proj.bias))
    module._kvq_value_rotation = rot
    return original


class Seam:
    """Installed state: which layers are patched and how to build a cache for them."""

    def __init__(self, model, quantizer, kernels: str = "auto"):
        self.model, self.quantizer, self.kernels = model, quantizer, kernels
        self.modules = attention_modules(model)
        self.previous_impl = model.config._attn_implementation
        self._weights: dict[int, torch.Tensor] = {}

    @property
    def patched_layers(self) -> int:
        return len(self.modules)

    def layer_types(self) -> list[str]:
        types = getattr(self.model.config, "layer_types", None)
        return list(types) if types else ["full_attention"] * self.model.config.num_hidden_layers

    def new_cache(self) -> Cache:
        """A fresh cache: three-region layers for full attention, stock sliding layers otherwise."""
        layers = []
        for idx, kind in enumerate(self.layer_types()):
            if kind == "sliding_attention":
                layers.append(DynamicSlidingWindowLayer(sliding_window=self.model.config.sliding_window))
            else:
                layers.append(ThreeRegionLayer(self.quantizer, idx))
        return Cache(layers=layers)

    def apply(self) -> "Seam":
        check_architecture(self.model.config)
        if not self.modules:
            raise ValueError("No attention modules with v_proj/o_proj found; the KV seam cannot patch this model.")
        kinds = self.layer_types()
        for module in self.modules:
            if kinds[module.layer_idx] == "sliding_attention":
                continue                      # sliding layers stay full precision and unrotated
            rotation = self.quantizer.value_rotation(module.layer_idx)
            if rotation is not None:
                self._weights[module.layer_idx] = fold_value_rotation(module, rotation)
        self.model.set_attn_implementation(ATTN_NAME)
        return self

    def remove(self) -> None:
        for module in self.modules:
            if module.layer_idx in self._weights:
                module.v_proj.weight.data.copy_(self._weights[module.layer_idx])
                if hasattr(module, "_kvq_bias_backup"):
                    module.v_proj.bias.data.copy_(module._kvq_bias_backup)
                    del module._kvq_bias_backup
            if hasattr(module, "_kvq_value_rotation"):
                del module._kvq_value_rotation
        self._weights.clear()
        self.model.set_attn_implementation(self.previous_impl)


@contextmanager
def install(model, quantizer, kernels: str = "auto"):
    """Patch `model` for `quantizer` inside the block; always restore it afterwards."""
    seam = Seam(model, quantizer, kernels).apply()
    try:
        yield seam
    finally:
        seam.remove()

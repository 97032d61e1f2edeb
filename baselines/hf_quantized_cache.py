"""`hf_quantized_cache`: transformers' own `QuantizedCache` (quanto/hqq backend), the "what users already have" row.

It keeps a full-precision residual and dequantizes the whole cache at every step (simulated
quantization: no memory or speed win on the attention path), and transformers refuses models with
sliding-window layers (Gemma 3). Its cache replaces the harness's three-region cache; the attention
function then sees plain dequantized tensors.
"""
from __future__ import annotations

import importlib.util

from harness.quantizer import KVQuantizer

BACKEND_PACKAGES = {"quanto": "optimum.quanto", "hqq": "hqq"}
BACKEND_NBITS = {"quanto": (2, 4), "hqq": (1, 2, 3, 4, 8)}          # what transformers' QuantizedCache layers accept
BACKEND_AXES = {"quanto": (0, -1), "hqq": (0, 1)}


class HFQuantizedCache(KVQuantizer):
    name = "hf_quantized_cache"

    def __init__(self, backend: str = "quanto", nbits: int = 2, q_group_size: int = 64, residual_length: int = 128,
                 axis_key: int = 0, axis_value: int = 0, metadata_bits: int = 16, **options):
        super().__init__(backend=backend, nbits=nbits, q_group_size=q_group_size, residual_length=residual_length,
                         axis_key=axis_key, axis_value=axis_value, **options)
        if backend not in BACKEND_PACKAGES:
            raise ValueError(f"hf_quantized_cache backend must be one of {sorted(BACKEND_PACKAGES)}, got '{backend}'.")
        if nbits not in BACKEND_NBITS[backend]:
            raise ValueError(f"hf_quantized_cache nbits with the {backend} backend must be one of "
                             f"{BACKEND_NBITS[backend]}, got {nbits}.")
        if axis_key not in BACKEND_AXES[backend] or axis_value not in BACKEND_AXES[backend]:
            raise ValueError(f"hf_quantized_cache axis_key and axis_value with the {backend} backend must be one of "
                             f"{BACKEND_AXES[backend]}, got {axis_key} and {axis_value}.")
        self.backend, self.nbits, self.group = backend, int(nbits), int(q_group_size)
        self.residual, self.axis_key, self.axis_value = int(residual_length), int(axis_key), int(axis_value)
        self.metadata_bits = int(metadata_bits)
        self.recent_tokens = self.residual

    def check(self, model_config) -> None:
        if importlib.util.find_spec(BACKEND_PACKAGES[self.backend].split(".")[0]) is None:
            raise ValueError(f"hf_quantized_cache needs the '{self.backend}' backend package, which is not installed.")
        kinds = set(getattr(model_config, "layer_types", None) or ["full_attention"])
        if kinds != {"full_attention"}:
            raise ValueError("transformers' QuantizedCache refuses models with sliding-window layers "
                             f"(this one has {sorted(kinds)}).")

    def build_cache(self, model):
        from transformers.cache_utils import QuantizedCache
        return QuantizedCache(self.backend, model.config, nbits=self.nbits, axis_key=self.axis_key,
                              axis_value=self.axis_value, q_group_size=self.group, residual_length=self.residual)

    def bits_per_element(self, ctx: int) -> float:
        """nbits + scale and zero per group; the full-precision residual (< residual_length tokens) counted as 16 bits."""
        full = min(ctx, self.residual)
        quantized = self.nbits + 2 * self.metadata_bits / self.group
        return ((ctx - full) * quantized + full * 16.0) / ctx

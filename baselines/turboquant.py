"""`turboquant_k3v3`: TurboQuant as vLLM's `turboquant_3bit_nc` runs it, the paper's (OSCAR's) "TurboQuant K3V3" row.

    quantizer = build_quantizer("turboquant_k3v3")            # configs/quantizer/turboquant_k3v3.yaml

What is stored (BASELINES_AND_TASKS.md §2.6; vLLM config.py / centroids.py / turboquant_attn.py):
* Keys, post-RoPE, rotated by the head_dim Sylvester Hadamard (queries too, so q.k is unchanged; vLLM uses
  the same unsigned Hadamard in every layer): per token and head, the L2 norm in fp16 and 3-bit indices
  into the Lloyd-Max codebook of N(0, 1/D) for the unit vector (baselines/lloyd_max.py); dequantized
  with norm correction (the centroid vector re-normalised to unit length, then scaled by the norm).
* Values, unrotated (vLLM quantizes the raw values): uniform asymmetric 3-bit over the whole head_dim,
  fp16 scale and zero.
* No full-precision windows: every token is quantized as it is written; a prefill attends to its own
  keys and values in full precision, as vLLM's does. (One difference from vLLM: a decode step's own token
  attends to itself unquantized here, as in every quantizer of this cache; vLLM stores it first.)
* All layers quantized, as OSCAR ran it; `skip_boundary_layers=n` leaves the first n and last n layers in
  full precision (vLLM's default n=2, at most half the layers).
The hooks (quantize / dequantize) implement this format on the PyTorch reference path (kernels=reference, and
kernels=auto on CPU); `kernel_ops` names its Triton kernels (kernels/turbo: the write kernel stores the same bytes,
the decode kernel reads them), which run it like every other quantizer on CUDA and under kernels=triton, static
decode (frozen cache + CUDA graph) included.
"""
from __future__ import annotations

import torch

from baselines.lloyd_max import gaussian_codebook
from baselines.turboquant_format import (TurboSpec, dequantize_keys, dequantize_values, quantize_keys,
                                         quantize_values)
from harness.hadamard import hadamard
from harness.quantizer import KVQuantizer

PAPER_HEAD_DIM = 128      # BPE before a model is known is reported for the paper's head_dim


class TurboQuant(KVQuantizer):
    name = "turboquant_k3v3"

    def __init__(self, key_bits: int = 3, value_bits: int = 3, norm_correction: bool = True,
                 skip_boundary_layers: int = 0, sink: int = 0, recent: int = 0, page: int = 1, **options):
        super().__init__(key_bits=key_bits, value_bits=value_bits, norm_correction=norm_correction,
                         skip_boundary_layers=skip_boundary_layers, sink=sink, recent=recent, page=page, **options)
        if skip_boundary_layers < 0:
            raise ValueError(f"skip_boundary_layers must be >= 0, got {skip_boundary_layers}.")
        self.key_bits, self.value_bits, self.norm_correction = int(key_bits), int(value_bits), bool(norm_correction)
        self.skip_boundary_layers = int(skip_boundary_layers)
        self.sink_tokens, self.recent_tokens, self.page_tokens = int(sink), int(recent), int(page)
        self.layer_kinds: list[str] | None = None       # the model's layer types, once `check` saw its config
        self._resolve(PAPER_HEAD_DIM)

    def _resolve(self, head_dim: int) -> None:
        """Specs, codebook and rotation for a head_dim (ValueError in one sentence when impossible)."""
        if head_dim & (head_dim - 1):
            raise ValueError(f"{self.name}: the Hadamard rotation needs a power-of-two head_dim, got {head_dim}.")
        self.head_dim = head_dim
        self.key_spec = TurboSpec("key", self.key_bits, head_dim, self.norm_correction)
        self.value_spec = TurboSpec("value", self.value_bits, head_dim)
        centroids, boundaries = gaussian_codebook(2 ** self.key_bits, variance=1.0 / head_dim)
        self.centroids, self.boundaries = centroids.float(), boundaries.float()      # [2^b], [2^b - 1]
        self._rotation = hadamard(head_dim).float()                                 # [D, D]
        self._kernels = None                                                        # built for this codebook

    # ---------------------------------------------------------------- lifecycle
    def check(self, model_config) -> None:
        head_dim = (getattr(model_config, "head_dim", None)
                    or model_config.hidden_size // model_config.num_attention_heads)
        self._resolve(int(head_dim))
        kinds = getattr(model_config, "layer_types", None)
        self.layer_kinds = list(kinds) if kinds else ["full_attention"] * model_config.num_hidden_layers

    def skipped_layers(self, num_layers: int) -> set[int]:
        """The first n and last n layer indices (n = skip_boundary_layers, at most half the layers), as vLLM."""
        n = min(self.skip_boundary_layers, num_layers // 2)
        return set(range(n)) | set(range(num_layers - n, num_layers))

    def for_layer(self, layer_idx: int, num_layers: int) -> KVQuantizer:
        if layer_idx in self.skipped_layers(num_layers):
            return KVQuantizer(name=f"{self.name}_skipped")         # the identity: full precision, no rotation
        return self

    # ---------------------------------------------------------------- rotations
    def key_rotation(self, layer_idx: int) -> torch.Tensor:
        return self._rotation

    # ---------------------------------------------------------------- storage hooks
    def quantize(self, x: torch.Tensor, spec):
        """x [B, H_kv, T, D] float32 -> QuantizedTensor in TurboQuant's format (keys arrive rotated by R_K)."""
        if spec.kind == "key":
            return quantize_keys(x, spec, self.boundaries)
        return quantize_values(x, spec)

    def dequantize(self, qt) -> torch.Tensor:
        if qt.spec.kind == "key":
            return dequantize_keys(qt, self.centroids)
        return dequantize_values(qt)

    def kernel_ops(self):
        """kernels/turbo's write and decode kernels with this head_dim's codebook (built once per `_resolve`)."""
        if self._kernels is None:
            from kernels.turbo.ops import TurboKernels
            self._kernels = TurboKernels(self.centroids, self.boundaries)
        return self._kernels

    # ---------------------------------------------------------------- accounting
    def quantized_bits(self) -> float:
        """Mean stored bits per element of a quantized layer: (K bits + 16/D + V bits + 32/D) / 2."""
        return 0.5 * (self.key_spec.bits_per_element() + self.value_spec.bits_per_element())

    def bits_per_element(self, ctx: int) -> float:
        """vLLM's packed layout: 3.1875 at D=128 (K 3.125, V 3.25); the paper (OSCAR) reports 3.25.

        Full-precision windows (none by default) count 16 bits; with skip_boundary_layers, the skipped
        full-attention layers count 16 bits once `check` has seen the model's layers.
        """
        full = min(ctx, self.sink_tokens + self.recent_tokens)
        per_layer = ((ctx - full) * self.quantized_bits() + full * 16.0) / ctx
        if not self.layer_kinds:
            return per_layer
        attention = [i for i, kind in enumerate(self.layer_kinds) if kind != "sliding_attention"]
        skipped = self.skipped_layers(len(self.layer_kinds)) & set(attention)
        return (len(skipped) * 16.0 + (len(attention) - len(skipped)) * per_layer) / len(attention)

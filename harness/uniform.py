"""`UniformKVQuantizer`: the configurable quantizer every INT-n row is built from.

Options (from configs/quantizer/<name>.yaml):
    key / value: QuantSpec fields (bits, group, axis, symmetric, scale_dtype, clip_ratio, lloyd_max)
    sink, recent, page: full-precision window sizes and the decode demotion page (METHOD_OSCAR §7)
    rotation: none | hadamard | block_hadamard  (block size `rotation_block`), applied to K (and q)
              after RoPE; `rotate_values` folds the same rotation into v_proj.
Groups larger than head_dim are capped at head_dim (one group per row, e.g. SmolLM2's D=64).
"""
from __future__ import annotations

import torch

from kernels.format import QuantSpec, bits_per_element as spec_bits
from harness.quantizer import KVQuantizer
from harness.hadamard import block_hadamard, hadamard

ROTATIONS = ("none", "hadamard", "block_hadamard")
ROTATION_DTYPES = ("float32", "model")   # fp32 GEMMs (exact), or bf16 ones as released (METHOD_OSCAR §8)
PAPER_HEAD_DIM = 128      # BPE before a model is known is reported for the paper's head_dim


class UniformKVQuantizer(KVQuantizer):
    name = "uniform"

    def __init__(self, key: dict, value: dict, sink: int = 0, recent: int = 0, page: int = 8,
                 rotation: str = "none", rotation_block: int = 16, rotate_values: bool = True,
                 rotation_dtype: str = "float32", **options):
        super().__init__(key=key, value=value, sink=sink, recent=recent, page=page, rotation=rotation, **options)
        if rotation not in ROTATIONS:
            raise ValueError(f"rotation must be one of {ROTATIONS}, got '{rotation}'.")
        if rotation_dtype not in ROTATION_DTYPES:
            raise ValueError(f"rotation_dtype must be one of {ROTATION_DTYPES}, got '{rotation_dtype}'.")
        self.rotation_dtype = rotation_dtype
        self.key_options, self.value_options = dict(key), dict(value)
        self.sink_tokens, self.recent_tokens, self.page_tokens = int(sink), int(recent), int(page)
        self.rotation_kind, self.rotation_block, self.rotate_values = rotation, int(rotation_block), rotate_values
        self._resolve(PAPER_HEAD_DIM)
        self._rotation: torch.Tensor | None = None

    def _resolve(self, head_dim: int) -> None:
        """Build the QuantSpecs for a head_dim (groups capped at head_dim); raises ValueError when impossible."""
        self.head_dim = head_dim
        self.key_spec = self._spec(self.key_options, head_dim)
        self.value_spec = self._spec(self.value_options, head_dim)
        if self.key_spec.axis == "channel" and self.page_tokens % self.key_spec.group:
            raise ValueError(f"{self.name}: page ({self.page_tokens}) must be a multiple of the channel-axis "
                             f"key group ({self.key_spec.group}).")

    @staticmethod
    def _spec(options: dict, head_dim: int) -> QuantSpec:
        opts = dict(options)
        if opts.get("axis", "token") == "token":
            opts["group"] = min(int(opts.get("group", 128)), head_dim)
        spec = QuantSpec(**opts)
        if spec.axis == "token" and head_dim % spec.group:
            raise ValueError(f"Quantization group {spec.group} does not divide head_dim {head_dim}.")
        return spec

    # ---------------------------------------------------------------- lifecycle
    def check(self, model_config) -> None:
        head_dim = getattr(model_config, "head_dim", None) or model_config.hidden_size // model_config.num_attention_heads
        self._resolve(int(head_dim))
        if self.rotation_kind == "hadamard" and head_dim & (head_dim - 1):
            raise ValueError(f"{self.name}: a Hadamard rotation needs a power-of-two head_dim, got {head_dim}.")
        if self.rotation_kind == "block_hadamard" and head_dim % self.rotation_block:
            raise ValueError(f"{self.name}: block size {self.rotation_block} does not divide head_dim {head_dim}.")
        self._rotation = self._data_free_rotation(int(head_dim))

    def _data_free_rotation(self, head_dim: int) -> torch.Tensor | None:
        if self.rotation_kind == "hadamard":
            return hadamard(head_dim).float()
        if self.rotation_kind == "block_hadamard":
            return block_hadamard(head_dim, self.rotation_block).float()
        return None

    def key_rotation(self, layer_idx: int):
        return self._rotation

    def value_rotation(self, layer_idx: int):
        return self._rotation if self.rotate_values else None

    # ---------------------------------------------------------------- accounting
    def quantized_bits(self) -> float:
        """Mean stored bits per element of the quantized history over K and V."""
        return 0.5 * (spec_bits(self.key_spec, self.head_dim) + spec_bits(self.value_spec, self.head_dim))

    def bits_per_element(self, ctx: int) -> float:
        """[(ctx - S0 - W) * b_q + (S0 + W) * 16] / ctx (METHOD_OSCAR §6.5); the <page recent slack is not counted."""
        full = min(ctx, self.sink_tokens + self.recent_tokens)
        return ((ctx - full) * self.quantized_bits() + full * 16.0) / ctx

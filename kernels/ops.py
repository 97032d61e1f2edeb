"""The Triton kernels of a stored format, as the cache calls them (harness/packed_history.py, harness/seam.py).

A quantizer names its format's kernels with `KVQuantizer.kernel_ops()`; every format provides
    quantize_pack(rows, spec)       rows [B, H_kv, T, D] -> (codes, scale, zero), the parts the cache stores
    part_shapes(shape, spec)        {"codes" | "scale" | "zero": (shape, dtype)} of rows of `shape` [.., T, D]
    decode_attention(q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, fp_k, fp_v, hist_len, fp_len,
                     hist_start, fp_start, *, sm_scale, k_spec, v_spec) -> [B, H_q, T_q, D]
`AFFINE` runs the affine (scale / zero) format of kernels/format.py; kernels/turbo/ops.py runs TurboQuant's.
"""
from __future__ import annotations

import torch

import kernels.decode
import kernels.quant


class AffineKernels:
    """kernels/quant.py's write path and kernels/decode's attention (looked up at call time, so that a
    benchmark can wrap them: scripts/dev/count_step_ops.py)."""

    writes_into = True        # quantize_pack takes `out`: the parts stored straight into caller-owned views
    writes_at_offsets = True  # ... and `row_offsets`: each sequence's rows at an offset read on the device

    def quantize_pack(self, rows: torch.Tensor, spec, out=None, row_offsets=None):
        return kernels.quant.quantize_pack(rows, spec, out=out, row_offsets=row_offsets)

    def part_shapes(self, shape, spec) -> dict[str, tuple[list[int], torch.dtype]]:
        codes, meta = kernels.quant.packed_shapes(shape, spec)
        return {"codes": (codes, torch.uint8), "scale": (meta, spec.torch_scale_dtype),
                "zero": (meta, spec.torch_scale_dtype)}

    def decode_attention(self, *args, **kwargs) -> torch.Tensor:
        return kernels.decode.decode_attention(*args, **kwargs)


AFFINE = AffineKernels()

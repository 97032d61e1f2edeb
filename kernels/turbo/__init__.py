"""TurboQuant's kernels (vLLM `turboquant_*`: codebook keys with a norm, uniform values, tight 3-bit codes).

layout (the stored parts and constants, no Triton), write (`quantize_pack_turbo`), decode
(`decode_attention_turbo`: stage 1 over [fp sink | TurboQuant history | fp recent], kernels/decode's merge), ops
(`TurboKernels`: both with the codebook bound, as the cache calls a format's kernels). The reference is
baselines/turboquant_format.py; this package imports nothing of it (the codebook arrives as tensors).
"""

"""`quarot_int2` / `quarot_int4`: a data-free Hadamard on q/k after RoPE (folded into v_proj for V),
asymmetric per-token quantization, no windows (BASELINES §2.2)."""
from baselines.uniform import UniformKVQuantizer


class QuaRot(UniformKVQuantizer):
    name = "quarot"

"""`int4`: the KV4 reference (per-token group asymmetric INT4, no rotation) and `saw_int4`, its
block-Hadamard (order 16) on K variant (BASELINES §2.9, §2.12)."""
from baselines.uniform import UniformKVQuantizer


class Int4(UniformKVQuantizer):
    name = "int4"

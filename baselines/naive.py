"""`naive_int2`: per-token symmetric INT2, no rotation, no windows (OSCAR's "Naive INT2" row, BASELINES §2.1)."""
from baselines.uniform import UniformKVQuantizer


class NaiveInt2(UniformKVQuantizer):
    name = "naive_int2"

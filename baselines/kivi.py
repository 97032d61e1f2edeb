"""`kivi2` / `kivi4`: per-channel keys (groups of G tokens), per-token values, full-precision residual
(BASELINES §2.3). The residual is modelled as the shared recent window (R..R+G-1 tokens for K and V),
demoted in whole key groups; the original keeps 0..R-1 keys and exactly R values."""
from baselines.uniform import UniformKVQuantizer


class KIVI(UniformKVQuantizer):
    name = "kivi"

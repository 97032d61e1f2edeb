"""The decode step's weight GEMMs: cuBLAS (F.linear) against kernels/gemv.py's launches, each beside the copy bandwidth.

    python scripts/dev/bench_gemv.py                                  # Qwen3-4B shapes, M = 1, the config sweep
    python scripts/dev/bench_gemv.py --rows 1,4 --configs 2x1024x2x3,4x512x4x3   # block_n x block_k x warps x stages
    python scripts/dev/bench_gemv.py --model qwen3_8b --step-ops        # each shape as the decode step calls it

Shapes (N x K, with the compiled step's fused projections, `step_shapes` of bench_throughput's model configs):
Qwen3-4B q/k/v 6144 x 2560, o 2560 x 4096, gate/up 19456 x 2560, down 2560 x 9728, LM head 151936 x 2560; Qwen3-8B
6144 x 4096, 4096 x 4096, 24576 x 4096, 4096 x 12288, 151936 x 4096. `--step-ops` calls each as the step does (q/k/v and gate/up with the RMSNorm folded in,
gate/up gated, o and down with the residual). Each call is timed as CUDA-graph replays over enough weight copies to
exceed L2 (scripts/bench_kernels.py's `graph_ms`), every launch checked against `gemv_reference` first.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_kernels import copy_bandwidth, graph_ms  # noqa: E402
from bench_throughput import MODELS, model_config  # noqa: E402
from kernels.gemv import GemvConfig, gemv, gemv_reference  # noqa: E402

STEP_OPS = {"qkv": {"norm"}, "o": {"residual"}, "gate_up": {"norm", "gated"}, "down": {"residual"}, "lm_head": set()}
CONFIGS = "2x1024x2x3,2x1024x2x1,2x1024x1x3,1x1024x1x3,1x2048x1x3,2x2048x2x3,2x512x1x3,4x1024x2x3,4x2048x4x3,2x1024x2x4"


def step_shapes(config) -> dict[str, tuple[int, int]]:
    """{projection: (N, K)} of a decode step's weights for a transformers config, q/k/v and gate/up fused."""
    hidden, heads, kv_heads = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    return {"qkv": ((heads + 2 * kv_heads) * head_dim, hidden), "o": (hidden, heads * head_dim),
            "gate_up": (2 * config.intermediate_size, hidden), "down": (hidden, config.intermediate_size),
            "lm_head": (config.vocab_size, hidden)}


def _config(text: str) -> GemvConfig:
    return GemvConfig(*(int(v) for v in text.split("x")))


def _operands(n: int, k: int, rows: int, ops: set, seed: int) -> tuple:
    """x [rows, K], W [N, K] and the gemv keyword operands (norm, residual, gated) of one timed call."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02
    kwargs = {"gated": "gated" in ops}
    if "norm" in ops:
        kwargs["norm"] = (1 + 0.1 * torch.randn(k, device="cuda", dtype=torch.bfloat16, generator=gen), 1e-6)
    if "residual" in ops:
        kwargs["residual"] = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16, generator=gen)
    return x, w, kwargs


def _launches(configs: list[GemvConfig]) -> list:
    """(label, fn(x, w, kwargs)) of cuBLAS and each swept config."""
    launches = [("cuBLAS (F.linear, the projection alone)", lambda x, w, kw: F.linear(x, w))]
    return launches + [(f"gemv {'x'.join(map(str, c))}", lambda x, w, kw, c=c: gemv(x, w, config=c, **kw))
                       for c in configs]


def _time_shape(name: str, n: int, k: int, rows: int, ops: set, configs: list, copy_tbs: float) -> None:
    x, w, kwargs = _operands(n, k, rows, ops, 0)
    ref = gemv_reference(x, w, **kwargs).float()
    nbytes = n * k * 2
    for label, fn in _launches(configs):
        if not label.startswith("cuBLAS"):
            err = ((fn(x, w, kwargs).float() - ref).norm() / ref.norm()).item()
            if not err < 1e-2:
                raise SystemExit(f"{label} {name}: rel err {err:.2e}")

        def build(i, fn=fn):
            xi, wi, kw = _operands(n, k, rows, ops, i)
            return lambda: fn(xi, wi, kw)
        ms = graph_ms(build, nbytes)
        print(f"| {name} | {n} x {k} | {rows} | {label} | {ms * 1e3:.1f} | {nbytes / ms / 1e9:.2f} | "
              f"{nbytes / ms / 1e9 / copy_tbs:.0%} |", flush=True)
    torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1")
    parser.add_argument("--configs", default=CONFIGS)
    parser.add_argument("--model", choices=MODELS, default="qwen3_4b")
    parser.add_argument("--step-ops", action="store_true", help="call each shape as the decode step does")
    args = parser.parse_args()
    configs = [_config(c) for c in args.configs.split(",")]
    copy_tbs = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}; copy bandwidth {copy_tbs:.2f} TB/s; {args.model} shapes"
          f"{', as the step calls them' if args.step_ops else ''}\n")
    print("| shape | N x K | M | launch | us | read TB/s | of copy |\n|---|---|---|---|---|---|---|")
    for rows in (int(r) for r in args.rows.split(",")):
        for name, (n, k) in step_shapes(model_config(args.model)).items():
            _time_shape(name, n, k, rows, STEP_OPS[name] if args.step_ops else set(), configs, copy_tbs)


if __name__ == "__main__":
    main()

"""The decode step's weight GEMMs: cuBLAS (F.linear) against kernels/gemv.py's launches, each beside the copy bandwidth.

    python scripts/dev/bench_gemv.py                                  # Qwen3-4B shapes, M = 1, the config sweep
    python scripts/dev/bench_gemv.py --rows 1,4 --configs 2x1024x2x3,4x512x4x3   # block_n x block_k x warps x stages

Shapes (N x K, Qwen3-4B with the compiled step's fused projections): q/k/v 6144 x 2560, o 2560 x 4096, gate/up
19456 x 2560, down 2560 x 9728, LM head 151936 x 2560. Each call is timed as CUDA-graph replays over enough weight
copies to exceed L2 (scripts/bench_kernels.py's `graph_ms`), every config checked against `gemv_reference` first.
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
from kernels.gemv import GemvConfig, gemv, gemv_reference  # noqa: E402

SHAPES = {"qkv": (6144, 2560), "o": (2560, 4096), "gate_up": (19456, 2560), "down": (2560, 9728),
          "lm_head": (151936, 2560)}
CONFIGS = "2x1024x2x3,2x1024x2x1,2x1024x1x3,1x1024x1x3,1x2048x1x3,2x2048x2x3,2x512x1x3,4x1024x2x3,4x2048x4x3,2x1024x2x4"


def _config(text: str) -> GemvConfig:
    return GemvConfig(*(int(v) for v in text.split("x")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1")
    parser.add_argument("--configs", default=CONFIGS)
    args = parser.parse_args()
    configs = [_config(c) for c in args.configs.split(",")]
    copy_tbs = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}; copy bandwidth {copy_tbs:.2f} TB/s\n")
    print("| shape | N x K | M | launch | us | read TB/s | of copy |\n|---|---|---|---|---|---|---|")
    for rows in (int(r) for r in args.rows.split(",")):
        for name, (n, k) in SHAPES.items():
            nbytes = n * k * 2

            def make(fn):
                def build(i):
                    gen = torch.Generator(device="cuda").manual_seed(i)
                    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02
                    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16, generator=gen)
                    return lambda: fn(x, w)
                return build
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
            ref = gemv_reference(x, w).float()
            launches = [("cuBLAS (F.linear)", lambda a, b: F.linear(a, b))]
            launches += [(f"gemv {'x'.join(map(str, c))}", lambda a, b, c=c: gemv(a, b, config=c))
                         for c in configs]
            for label, fn in launches:
                err = ((fn(x, w).float() - ref).norm() / ref.norm()).item()
                if not err < 1e-2:
                    raise SystemExit(f"{label} {name}: rel err {err:.2e}")
                ms = graph_ms(make(fn), nbytes)
                print(f"| {name} | {n} x {k} | {rows} | {label} | {ms * 1e3:.1f} | {nbytes / ms / 1e9:.2f} | "
                      f"{nbytes / ms / 1e9 / copy_tbs:.0%} |", flush=True)
            del x, w, ref
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

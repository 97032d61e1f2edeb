"""fp32 runtime rotations: kernels/rotate.py's one launch against the torch expression it replaces (upcast, cuBLAS
fp32 GEMM, cast), each beside the copy-bandwidth time of its bytes (bf16 rows read and written, R read).

    python scripts/dev/bench_rotate.py                                   # decode steps and prefills, Qwen3-4B heads
    python scripts/dev/bench_rotate.py --rows 32,256,3276800 --head-dim 128

Rows are [1, 1, rows, head_dim] views of [rows / heads, heads] token-major bf16 data (the query layout the seam gets;
32 = one decode step's query heads at batch 1, 3,276,800 = 32 heads x 100k tokens of a prefill). Timed as CUDA-graph
replays over enough input copies to exceed L2 (scripts/bench_kernels.py's `graph_ms`), each checked first against
float64 (fp32 output, relative 1e-5 of the row's |x| |R| sums).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_kernels import copy_bandwidth, graph_ms  # noqa: E402
from harness.cli_args import positive_int, positive_ints  # noqa: E402
from kernels.rotate import rotate_rows, rotate_rows_reference  # noqa: E402

HEADS = 32


def rows_of(n_rows: int, head_dim: int, seed: int) -> torch.Tensor:
    """[1, HEADS, n_rows / HEADS, head_dim] bf16, held token-major as the seam's queries are."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(1, n_rows // HEADS, HEADS, head_dim, generator=gen, device="cuda")
    return x.to(torch.bfloat16).transpose(1, 2)


def check(n_rows: int, rotation: torch.Tensor) -> None:
    """The kernel's fp32 output against float64 on these rows (an AssertionError names the point)."""
    x = rows_of(min(n_rows, 1 << 16), rotation.shape[0], seed=0)
    exact = x.double() @ rotation.double()
    bound = 1e-5 * (x.double().abs() @ rotation.double().abs())
    assert ((rotate_rows(x, rotation, out_dtype=torch.float32).double() - exact).abs() <= bound + 1e-6).all(), n_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=positive_ints, default=[32, 256, 2048, 32768, 3276800])
    parser.add_argument("--head-dim", type=positive_int, default=128)
    args = parser.parse_args()
    if any(n % HEADS for n in args.rows):
        parser.error(f"--rows must be multiples of {HEADS} (the heads of a row block).")
    d = args.head_dim
    rotation = torch.linalg.qr(torch.randn(d, d, dtype=torch.float64))[0].float().contiguous().cuda()   # [D, D]
    bandwidth = copy_bandwidth()
    print(f"{torch.cuda.get_device_name(0)}; copy {bandwidth:.2f} TB/s (read + written); head_dim {d}\n")
    print("| rows | cuBLAS fp32 (upcast, GEMM, cast) ms | kernels/rotate.py ms | copy floor ms | kernel of copy |")
    print("|---|---|---|---|---|")
    for n_rows in args.rows:
        check(n_rows, rotation)
        n_bytes = 2 * n_rows * d * 2 + d * d * 4
        inputs = lambda i, n=n_rows: rows_of(n, d, seed=i + 1)                    # noqa: E731
        torch_ms = graph_ms(lambda i: (lambda x=inputs(i): rotate_rows_reference(x, rotation)), n_bytes)
        kernel_ms = graph_ms(lambda i: (lambda x=inputs(i): rotate_rows(x, rotation)), n_bytes)
        floor_ms = n_bytes / bandwidth / 1e9
        print(f"| {n_rows:,} | {torch_ms:.4f} | {kernel_ms:.4f} | {floor_ms:.4f} | {floor_ms / kernel_ms:.0%} |",
              flush=True)


if __name__ == "__main__":
    main()

"""Time INT2 decode attention over a grid of tile / occupancy configs at the bench's large shapes.

Run on the GPU box from the repo root. The grid varies pipelining depth and the per-thread register
cap (the two limits Nsight Compute reports for the default tiles: 156 registers and 72 KB of shared
memory per block allow 3 blocks = 12 warps per SM) and switches on the inline-PTX field unpack
(`DecodeConfig.asm_unpack`; a wrong unpack shows as a large rel err):

    python scripts/sweep_decode_tiles.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_kernels import HEAD_DIM, _decode_bytes, copy_bandwidth, decode_call, decode_inputs, graph_ms  # noqa: E402
from kernels.decode import DecodeConfig, decode_attention, default_config  # noqa: E402
from kernels.reference import decode_attention_reference  # noqa: E402

SHAPES = [(8, 32768), (32, 102400), (1, 131072)]
GRID = [(128, 4, 3, None, False), (128, 4, 3, 128, False), (128, 4, 2, None, False), (128, 4, 2, 128, False),
        (128, 4, 2, 96, False), (64, 4, 2, 128, False), (64, 4, 2, 96, False), (64, 4, 3, 128, False),
        (128, 8, 2, 128, False), (128, 4, 3, None, True), (128, 4, 3, 128, True)]


def check(cfg: DecodeConfig) -> float:
    """Relative error against the reference at a small shape (a register cap must not change results)."""
    args, spec, _ = decode_inputs(2, 4096, 2)
    out = decode_attention(*args, sm_scale=HEAD_DIM ** -0.5, k_spec=spec, v_spec=spec, config=cfg).float()
    ref = decode_attention_reference(*args, sm_scale=HEAD_DIM ** -0.5, k_spec=spec, v_spec=spec).float()
    return ((out - ref).norm() / ref.norm()).item()


def main() -> None:
    copy_tbs = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}; copy {copy_tbs:.2f} TB/s; default {default_config(HEAD_DIM, True)}")
    print("| batch | ctx | block_n | warps | stages | maxnreg | asm | ms | TB/s | of copy | rel err |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for batch, ctx in SHAPES:
        nbytes = _decode_bytes(batch, ctx, 2)
        for block_n, warps, stages, maxnreg, asm in GRID:
            cfg = DecodeConfig(block_n=block_n, num_warps=warps, num_stages=stages, maxnreg=maxnreg, asm_unpack=asm)

            ms = graph_ms(lambda _, cfg=cfg: decode_call(batch, ctx, 2, cfg), nbytes)
            tbs = nbytes / ms / 1e9
            print(f"| {batch} | {ctx} | {block_n} | {warps} | {stages} | {maxnreg} | {asm} | {ms:.3f} | {tbs:.2f} | "
                  f"{tbs / copy_tbs:.0%} | {check(cfg):.1e} |", flush=True)


if __name__ == "__main__":
    main()

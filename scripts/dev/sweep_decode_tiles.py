"""Time INT2 decode attention at the bench's large shapes for DecodeConfig variants of the GPU default.

Run on the GPU box from the repo root. Each row changes a few fields of `default_config` (shown in the
first column): the history loop (row-major or warp tiles) and its tile, pipelining depth, the split
density (programs_per_sm) and the inline-PTX field unpack. The rel err column checks each variant against the
reference (a wrong unpack shows as a large error).

    python scripts/dev/sweep_decode_tiles.py
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_kernels import HEAD_DIM, KV_HEADS, _decode_bytes, copy_bandwidth, decode_call, decode_inputs, graph_ms  # noqa: E402
from kernels.decode import DecodeConfig, decode_attention, default_config, is_small_grid  # noqa: E402
from kernels.decode.reference import decode_attention_reference  # noqa: E402

SHAPES = [(8, 32768), (32, 102400), (1, 131072)]
GRID = [{}, {"warp_tiles": False, "block_n": 128}, {"warp_tiles": False, "block_n": 128, "maxnreg": None},
        {"maxnreg": None}, {"block_n": 128}, {"num_stages": 2}, {"num_stages": 4}, {"programs_per_sm": 4},
        {"block_f": 64}, {"asm_unpack": True}]


def check(cfg: DecodeConfig) -> float:
    """Relative error against the reference at a small shape (a register cap must not change results)."""
    args, spec, _ = decode_inputs(2, 4096, 2)
    out = decode_attention(*args, sm_scale=HEAD_DIM ** -0.5, k_spec=spec, v_spec=spec, config=cfg).float()
    ref = decode_attention_reference(*args, sm_scale=HEAD_DIM ** -0.5, k_spec=spec, v_spec=spec).float()
    return ((out - ref).norm() / ref.norm()).item()


def main() -> None:
    copy_tbs = copy_bandwidth()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name()}; copy {copy_tbs:.2f} TB/s; default {default_config(HEAD_DIM, True)}, "
          f"small grid {default_config(HEAD_DIM, True, small_grid=True)}")
    print("| batch | ctx | change from default | ms | TB/s | of copy | rel err |")
    print("|---|---|---|---|---|---|---|")
    for batch, ctx in SHAPES:
        nbytes = _decode_bytes(batch, ctx, 2)
        for change in GRID:
            default = default_config(HEAD_DIM, True, small_grid=is_small_grid(batch * KV_HEADS, sms))
            cfg = replace(default, **change)
            ms = graph_ms(lambda _, cfg=cfg: decode_call(batch, ctx, 2, cfg), nbytes)
            tbs = nbytes / ms / 1e9
            label = ", ".join(f"{k}={v}" for k, v in change.items()) or "(default)"
            print(f"| {batch} | {ctx} | {label} | {ms:.3f} | {tbs:.2f} | {tbs / copy_tbs:.0%} | {check(cfg):.1e} |",
                  flush=True)


if __name__ == "__main__":
    main()

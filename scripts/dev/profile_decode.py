"""One decode-attention shape, launched a few times, for Nsight Compute (the bench's inputs, no timing).

Run on the GPU box from the repo root, e.g. INT2 at batch 8 / 32k:

    ncu --kernel-name regex:_decode_stage1 --launch-skip 2 --launch-count 1 --set full \
        python scripts/dev/profile_decode.py --batch 8 --ctx 32768 --bits 2
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_kernels import HEAD_DIM, decode_inputs  # noqa: E402
from kernels.decode import decode_attention  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--ctx", type=int, default=32768)
    parser.add_argument("--bits", type=int, choices=(2, 4), default=2)
    parser.add_argument("--launches", type=int, default=4)
    args = parser.parse_args()
    call_args, spec, nbytes = decode_inputs(args.batch, args.ctx, args.bits)
    for _ in range(args.launches):
        decode_attention(*call_args, sm_scale=HEAD_DIM ** -0.5, k_spec=spec, v_spec=spec)
    torch.cuda.synchronize()
    print(f"batch {args.batch} ctx {args.ctx} INT{args.bits}: {nbytes / 1e6:.1f} MB must be read per call")


if __name__ == "__main__":
    main()

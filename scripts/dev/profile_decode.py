"""One decode-attention shape, launched a few times, for Nsight Compute (the bench's inputs, no timing).

Run on the GPU box from the repo root, e.g. INT2 at batch 8 / 32k:

    ncu --kernel-name regex:_decode_stage1 --launch-skip 2 --launch-count 1 --set full \
        python scripts/dev/profile_decode.py --batch 8 --ctx 32768 --bits 2

or where a short call's time goes, each kernel's duration (stage 1, the merge, and BF16 SDPA on the same shape):

    ncu --metrics gpu__time_duration.sum python scripts/dev/profile_decode.py --batch 1 --ctx 1024 --sdpa

--format F launches one of bench_formats.py's formats instead of --bits (its default launch, fresh random stored
parts), e.g. TurboQuant K3V3's stage 1 at batch 32 / 100k:

    ncu --kernel-name regex:_decode_stage1_turbo --launch-skip 2 --launch-count 1 --set full \
        python scripts/dev/profile_decode.py --batch 32 --ctx 102400 --format turboquant_k3v3
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_formats import FORMATS, format_call  # noqa: E402
from bench_kernels import KV_HEADS, AttnShape, decode_inputs, sdpa_call  # noqa: E402
from kernels.decode import decode_attention  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--ctx", type=int, default=32768)
    parser.add_argument("--bits", type=int, choices=(2, 4), default=2)
    parser.add_argument("--launches", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--group", type=int, default=4, help="query heads per KV head")
    parser.add_argument("--format", choices=sorted(FORMATS), default=None,
                        help="a bench_formats.py format instead of --bits")
    parser.add_argument("--sdpa", action="store_true", help="also launch BF16 SDPA on the same shape")
    args = parser.parse_args()
    shape = AttnShape(q_heads=args.group * KV_HEADS, head_dim=args.head_dim)
    decode, name = decode_call(args, shape)
    sdpa = sdpa_call(args.batch, args.ctx, shape) if args.sdpa else None
    for _ in range(args.launches):
        decode()
        if sdpa:
            sdpa()
    torch.cuda.synchronize()
    print(f"batch {args.batch} ctx {args.ctx} {name}: {args.launches} launches")


def decode_call(args, shape: AttnShape):
    """(a zero-argument decode call of the chosen format on random stored parts, its name)."""
    if args.format is not None:
        return format_call(args.format, args.batch, args.ctx, shape), args.format
    call_args, spec, nbytes = decode_inputs(args.batch, args.ctx, args.bits, shape)
    name = f"INT{args.bits} ({nbytes / 1e6:.1f} MB must be read per call)"
    return lambda: decode_attention(*call_args, sm_scale=args.head_dim ** -0.5, k_spec=spec, v_spec=spec), name


if __name__ == "__main__":
    main()

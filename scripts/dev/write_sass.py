"""Compile the write kernel (`kernels.quant._quantize_pack_kernel`) for an H100 offline and count its SASS per row.

No GPU needed: Triton's bundled ptxas, nvdisasm and cuobjdump do the work (helpers shared with decode_sass.py).

    python scripts/dev/write_sass.py            # INT2 g128 clip 0.96, without and with a bf16 rotation: no clip and
                                                # every clip method, at the default tile
    python scripts/dev/write_sass.py --tiles 8x1,16x1,16x2 --methods extract,descend

The kernel is specialized as `scripts/bench_kernels.py`'s [16, 8, 4096, 128] bf16 write-path call specializes it
(pointers and multiples of 16 marked divisible by 16, arguments equal to 1 folded to constants). The kernel has
no loop (one program quantizes block_t rows), so its static instruction count is what each of its warps issues
once; "per row" multiplies by the warps and divides by block_t. Prints a Markdown table: registers, local-memory
spills (LDL/STL), instructions per program and per row, the leading opcodes, and the shared-memory accesses and
block barriers by full opcode.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
from dataclasses import replace
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"      # compile only (nothing runs), so the interpreter must stay off

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode_sass import compile_for_h100, cuda_tool, opcodes, registers, shared_memory_ops  # noqa: E402
from kernels.format import QuantSpec  # noqa: E402
from kernels.quant import CLIP_METHODS, _quantize_pack_kernel, default_write_tile, launch_constants  # noqa: E402

BATCH, KV_HEADS, TOKENS, HEAD_DIM = 16, 8, 4096, 128
SPEC = QuantSpec(bits=2, group=128, clip_ratio=0.96)
NO_CLIP = "no clip"  # a method name for the same launch without the clip: the floor the clip adds to
POINTER_TYPES = {"x_ptr": "*bf16", "r_ptr": "*bf16", "codes_ptr": "*u8", "scale_ptr": "*fp16", "zero_ptr": "*fp16",
                 "offsets_ptr": "*i32"}
LOCAL_MEMORY = ("LDL", "STL")


def runtime_arguments() -> dict:
    """Scalar arguments of the bench's launch ([16, 8, 4096, 128] bf16 x, contiguous codes / scale / zero)."""
    nb, groups = HEAD_DIM * SPEC.container_bits // 8, HEAD_DIM // SPEC.group
    return dict(n_tokens=TOKENS, lm_factor=1.0, heads=KV_HEADS, stride_xa=TOKENS * HEAD_DIM, stride_xt=HEAD_DIM,
                stride_ca=TOKENS * nb, stride_ct=nb, stride_sa=TOKENS * groups, stride_st=groups)


def compile_write(rotate: bool, block_t: int, num_warps: int, clip_method: str):
    """triton.compile of the write kernel for sm_90a, specialized like the bench's launch."""
    spec = replace(SPEC, clip_ratio=None) if clip_method == NO_CLIP else SPEC
    constexprs = launch_constants(HEAD_DIM, spec, torch.bfloat16, rotate=rotate, rotation_fp32=False, interpret=False,
                                  block_t=block_t,
                                  clip_method=None if clip_method == NO_CLIP else clip_method)
    constexprs["ROW_OFFSETS"] = False
    options = dict(num_warps=num_warps, enable_fp_fusion=False)
    return compile_for_h100(_quantize_pack_kernel, constexprs, runtime_arguments(), POINTER_TYPES, options)


def variants(tiles: list[tuple[int, int]], methods: list[str]) -> list[tuple[bool, int, int, str]]:
    """(rotate, block_t, num_warps, clip method): each method at the default tile and at every extra tile."""
    out = []
    for rotate in (False, True):
        default = default_write_tile(HEAD_DIM, SPEC, rotate)
        for method in methods:
            for block_t, warps in dict.fromkeys([default, *tiles]):
                out.append((rotate, block_t, warps, method))
    return out


def parse_tiles(text: str) -> list[tuple[int, int]]:
    return [tuple(int(v) for v in t.split("x")) for t in text.split(",") if t]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiles", default="", help="extra block_t x num_warps tiles, e.g. 8x1,16x2")
    parser.add_argument("--methods", default=",".join((NO_CLIP, *CLIP_METHODS)),
                        help=f"clip methods, comma-separated ('{NO_CLIP}': the launch without the clip)")
    parser.add_argument("--top", type=int, default=8, help="opcodes listed per row")
    args = parser.parse_args()
    print(f"INT2 g{SPEC.group} clip {SPEC.clip_ratio}, [{BATCH}, {KV_HEADS}, {TOKENS}, {HEAD_DIM}] bf16, sm_90a")
    print("| rotation | clip method | block_t x warps | registers | spills (LDL/STL) | instructions / warp "
          "| per row | leading opcodes | shared memory and barriers |")
    print("|---|---|---|---|---|---|---|---|---|")
    for rotate, block_t, warps, method in variants(parse_tiles(args.tiles), args.methods.split(",")):
        cubin = compile_write(rotate, block_t, warps, method).asm["cubin"]
        lines = cuda_tool("nvdisasm", cubin, "-c").splitlines()
        ops = opcodes(lines)
        counts = collections.Counter(ops)
        spills = sum(counts[op] for op in LOCAL_MEMORY)
        shared = ", ".join(f"{op} {n}" for op, n in shared_memory_ops(lines).most_common())
        leading = ", ".join(f"{op} {n}" for op, n in counts.most_common(args.top))
        print(f"| {'bf16' if rotate else 'none'} | {method} | {block_t}x{warps} | {registers(cubin)} | {spills} "
              f"| {len(ops)} | {len(ops) * warps / block_t:.0f} | {leading} | {shared} |", flush=True)


if __name__ == "__main__":
    main()

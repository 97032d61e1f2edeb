"""Compile TurboQuant's decode kernel (stage 1, `kernels.turbo.decode`) for an H100 offline and count the SASS of
its history loop.

No GPU needed: Triton's bundled ptxas, nvdisasm and cuobjdump do the work (helpers shared with decode_sass.py).

    python scripts/dev/turbo_sass.py                      # K3V3 (the turboquant_k3v3 row), head_dim 64, 128, 256
    python scripts/dev/turbo_sass.py --bits 2:4,4:2 --head-dims 128

The kernel is specialized as a launch of `scripts/bench_formats.py`'s GQA-4 / 32k TurboQuant call would specialize
it, on `kernels.turbo.decode.gpu_config`'s large-grid launch. The history loop is the loop whose body holds the HMMA
instructions; its static instruction count is what one warp issues per BLOCK_N-token tile. Prints a Markdown table:
registers, local-memory spills (LDL/STL), loop instructions (also per 128 tokens), the leading opcodes, and the
shared-memory accesses and block barriers by full opcode.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"      # compile only (nothing runs), so the interpreter must stay off

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode_sass import (compile_for_h100, cuda_tool, history_loop, opcodes, registers,  # noqa: E402
                         shared_memory_ops)
from baselines.turboquant import TurboQuant  # noqa: E402
from kernels.decode import LOG2E, WARP_TILE_ROWS  # noqa: E402
from kernels.turbo.decode import (_decode_stage1_turbo_kernel, centroid_byte_table, chunk_rows,  # noqa: E402
                                  gpu_config)

KV_HEADS, GROUP, HIST, FP_ROWS = 8, 4, 32448, 320
POINTER_TYPES = {"q_ptr": "*bf16", "kc_ptr": "*u8", "kn_ptr": "*fp16", "vc_ptr": "*u8", "vs_ptr": "*fp16",
                 "vz_ptr": "*fp16", "fk_ptr": "*bf16", "fv_ptr": "*bf16", "cent_ptr": "*fp32", "hist_len_ptr": "*i32",
                 "fp_len_ptr": "*i32", "hist_start_ptr": "*i32", "fp_start_ptr": "*i32", "part_o_ptr": "*fp32",
                 "part_lse_ptr": "*fp32"}
LOCAL_MEMORY = ("LDL", "STL")


def runtime_arguments(head_dim: int, k_bits: int, v_bits: int) -> dict:
    """Scalar arguments of the launch ([B, H, T, *] contiguous parts as kernels/turbo/layout.py stores them)."""
    nk, nv, d = head_dim * k_bits // 8, head_dim * v_bits // 8, head_dim
    return dict(qk_scale=d ** -0.5 * LOG2E, kv_heads=KV_HEADS, q_tokens=1, n_rows=GROUP, n_hist_splits=16,
                n_fp_splits=1, stride_qb=KV_HEADS * GROUP * d, stride_qh=d, stride_qt=d,
                stride_kcb=KV_HEADS * HIST * nk, stride_kch=HIST * nk, stride_kcn=nk,
                stride_knb=KV_HEADS * HIST, stride_knh=HIST, stride_knn=1,
                stride_vcb=KV_HEADS * HIST * nv, stride_vch=HIST * nv, stride_vcn=nv,
                stride_vsb=KV_HEADS * HIST, stride_vsh=HIST, stride_vsn=1,
                stride_fb=KV_HEADS * FP_ROWS * d, stride_fh=FP_ROWS * d, stride_fn=d)


def compile_turbo(head_dim: int, k_bits: int, v_bits: int):
    """(launch config, triton.compile of stage 1 for sm_90a) with the norm correction on, as turboquant_k3v3 runs."""
    cfg = gpu_config(head_dim, "large")
    quantizer = TurboQuant(key_bits=k_bits, value_bits=v_bits)
    quantizer._resolve(head_dim)
    constexprs = dict(GROUP=GROUP, D=head_dim, K_BITS=k_bits, V_BITS=v_bits, NORM_CORRECTION=True,
                      KC=chunk_rows(head_dim), BYTE_TABLE=centroid_byte_table(quantizer.centroids),
                      WARPS=cfg.num_warps, BLOCK_R=WARP_TILE_ROWS, BLOCK_N=cfg.block_n, BLOCK_F=cfg.block_f, FP16=True)
    options = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                   **({"maxnreg": cfg.maxnreg} if cfg.maxnreg else {}))
    kernel = compile_for_h100(_decode_stage1_turbo_kernel, constexprs, runtime_arguments(head_dim, k_bits, v_bits),
                              POINTER_TYPES, options)
    return cfg, kernel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dims", default="64,128,256")
    parser.add_argument("--bits", default="3:3", help="comma-separated key:value bit widths")
    parser.add_argument("--top", type=int, default=10, help="opcodes listed per row")
    args = parser.parse_args()
    print("| head_dim | K:V bits | tokens / tile | registers | spills (whole kernel) | instructions / warp / tile | per 128 tokens "
          "| leading opcodes | shared memory and barriers |")
    print("|---|---|---|---|---|---|---|---|---|")
    for head_dim in map(int, args.head_dims.split(",")):
        for bits in args.bits.split(","):
            k_bits, v_bits = map(int, bits.split(":"))
            cfg, kernel = compile_turbo(head_dim, k_bits, v_bits)
            cubin = kernel.asm["cubin"]
            sass = cuda_tool("nvdisasm", cubin, "-c").splitlines()
            lines = history_loop(sass)
            loop = opcodes(lines)
            spills = sum(op in LOCAL_MEMORY for op in opcodes(sass))
            leading = ", ".join(f"{op} {n}" for op, n in collections.Counter(loop).most_common(args.top))
            shared = ", ".join(f"{op} {n}" for op, n in shared_memory_ops(lines).most_common())
            print(f"| {head_dim} | {k_bits}:{v_bits} | {cfg.block_n} | {registers(cubin)} | {spills} | {len(loop)} | "
                  f"{len(loop) * 128 // cfg.block_n} | {leading} | {shared} |", flush=True)


if __name__ == "__main__":
    main()

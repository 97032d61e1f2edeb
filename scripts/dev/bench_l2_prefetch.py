"""Does prefetching the output projection's weight into L2 while stage 1 reads the cache speed up the pair?

    python scripts/dev/bench_l2_prefetch.py            # Qwen3-4B shapes at batch 1 / 100k, OSCAR's INT2 layout

A batch-1 decode step reads the packed cache at about half the copy bandwidth (stage 1 is latency-bound) and then
streams W_o [hidden, q_heads * head_dim] at 65 % of it (results/bench/bench_gemv.md). This times, as CUDA-graph
replays over enough input copies to exceed L2: the attention call alone, the GEMV alone, the two one after the other,
and the two with a prefetch kernel on a side stream (forked before the attention, joined before the GEMV) that
pulls W_o into L2 with the evict_last policy, either as loads (`load`) or as prefetch instructions (`prefetch`).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_kernels import AttnShape, copy_bandwidth, decode_inputs, graph_ms  # noqa: E402
from kernels.decode import decode_attention  # noqa: E402
from kernels.gemv import gemv  # noqa: E402

QWEN3_4B = AttnShape(q_heads=32, kv_heads=8, head_dim=128)
HIDDEN = 2560
LINE_WORDS = 32            # int32 words per 128-byte L2 line


@triton.jit
def _prefetch_loads(ptr, n_words, sink_ptr, never, BLOCK: tl.constexpr):
    """Read words [0, n_words) with evict_last (program p: every num_programs-th block); store nothing (`never` = 0)."""
    acc = tl.zeros((BLOCK,), tl.int32)
    for start in tl.range(tl.program_id(0) * BLOCK, n_words, tl.num_programs(0) * BLOCK, num_stages=4):
        offs = start + tl.arange(0, BLOCK)
        acc ^= tl.load(ptr + offs, mask=offs < n_words, other=0, eviction_policy="evict_last")
    tl.store(sink_ptr + tl.arange(0, BLOCK), acc, mask=tl.arange(0, BLOCK) < never)


@triton.jit
def _prefetch_lines(ptr, n_lines, BLOCK: tl.constexpr, LINE: tl.constexpr):
    """prefetch.global.L2::evict_last of lines [0, n_lines) (LINE words each), BLOCK lines per program per step."""
    for start in range(tl.program_id(0) * BLOCK, n_lines, tl.num_programs(0) * BLOCK):
        lines = start + tl.arange(0, BLOCK)
        addr = ptr + tl.where(lines < n_lines, lines, 0) * LINE
        tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1];\n\tmov.u32 $0, 0;", "=r,l", [addr],
                                  dtype=tl.int32, is_pure=False, pack=1)


def prefetch(weight: torch.Tensor, mode: str, programs: int, sink: torch.Tensor) -> None:
    words = weight.view(torch.int32).reshape(-1)
    if mode == "load":
        _prefetch_loads[(programs,)](words, words.numel(), sink, 0, BLOCK=1024, num_warps=4)
    else:
        _prefetch_lines[(programs,)](words, words.numel() // LINE_WORDS, BLOCK=128, LINE=LINE_WORDS, num_warps=4)


def pair_call(i: int, ctx: int, mode: str | None, programs: int, parts: str = "both"):
    """The i-th input set's zero-argument call: attention and/or the o GEMV, with a side-stream prefetch or not."""
    args, spec, _ = decode_inputs(1, ctx, 2, QWEN3_4B)
    gen = torch.Generator(device="cuda").manual_seed(i)
    w_o = torch.randn(HIDDEN, QWEN3_4B.q_heads * QWEN3_4B.head_dim, device="cuda", dtype=torch.bfloat16,
                      generator=gen) * 0.02
    x = torch.randn(1, w_o.shape[1], device="cuda", dtype=torch.bfloat16, generator=gen)
    sink = torch.zeros(1024, dtype=torch.int32, device="cuda")
    side = torch.cuda.Stream()

    def call():
        main = torch.cuda.current_stream()
        if mode:
            side.wait_stream(main)
            with torch.cuda.stream(side):
                prefetch(w_o, mode, programs, sink)
        if parts != "gemv":
            decode_attention(*args, sm_scale=QWEN3_4B.head_dim ** -0.5, k_spec=spec, v_spec=spec)
        if mode:
            main.wait_stream(side)
        if parts != "attention":
            gemv(x, w_o)
    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ctx", type=int, default=102400)
    parser.add_argument("--copies", type=int, default=6)
    parser.add_argument("--programs", default="16,66,132")
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}; copy bandwidth {copy_bandwidth():.2f} TB/s; ctx {args.ctx}, batch 1\n")
    print("| calls | prefetch | programs | us per pair |\n|---|---|---|---|")
    rows = [("attention", None, 0), ("gemv", None, 0), ("both", None, 0)]
    rows += [("both", mode, int(p)) for mode in ("load", "prefetch") for p in args.programs.split(",")]
    for _ in range(2):
        for parts, mode, programs in rows:
            us = graph_ms(lambda i: pair_call(i, args.ctx, mode, programs, parts), 1, args.copies) * 1e3
            print(f"| {parts} | {mode or '-'} | {programs or '-'} | {us:.1f} |", flush=True)


if __name__ == "__main__":
    main()

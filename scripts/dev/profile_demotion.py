"""Where a frozen cache's page demotion spends its time (GPU): host time and CUDA time of `StaticState.before_step`.

    python scripts/dev/profile_demotion.py --ctx 102400 --batch 1     # Qwen3-4B shapes, OSCAR (rotation_dtype=model)
    python scripts/dev/profile_demotion.py --ctx 102400 --batch 1 --eager     # the eager demotion instead

Builds the random model and a filled three-region cache as scripts/bench_throughput.py does, freezes it, runs CUDA-graph
decode steps until the next one demotes for the third time (a graphed demotion replays from the third on:
harness/demotion_graph.py; with --eager, the second), then times that step's `before_step` (wall, synchronized) and
prints cProfile's top functions by cumulative time and the torch profiler's CUDA kernels of the same call.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_throughput import build_model, fill_three_region, make_quantizer  # noqa: E402
from harness.seam import install  # noqa: E402
from harness.static_cache import DecodeStep, freeze  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3_4b")
    parser.add_argument("--ctx", type=int, default=102400)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--quantizer", default="oscar:model")
    parser.add_argument("--eager", action="store_true", help="profile an eager demotion (graph_demotions=False)")
    args = parser.parse_args()
    model = build_model(args.model, "cuda", torch.bfloat16)
    quantizer = make_quantizer(args.quantizer, model.config)
    with install(model, quantizer, kernels="triton") as seam, torch.inference_mode():
        cache = seam.new_cache()
        fill_three_region(cache, model, args.batch, args.ctx, torch.bfloat16)
        state = freeze(cache, 5 * quantizer.page_tokens)
        step = DecodeStep(model, cache, state, graph=True, graph_demotions=not args.eager)
        profiled_demotion = 2 if args.eager else 3     # the first compiles (and the second captures the graph)
        ids = torch.randint(0, model.config.vocab_size, (args.batch, 1), device="cuda")
        demotions = 0
        while True:
            if state.demotes_next_step():
                demotions += 1
                if demotions == profiled_demotion:
                    break
            step(ids, torch.full((args.batch, 1), state.n_tokens, device="cuda"))
        torch.cuda.synchronize()
        profiler = cProfile.Profile()
        t0 = time.perf_counter()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            profiler.enable()
            state.before_step()
            profiler.disable()
            torch.cuda.synchronize()
        print(f"before_step with a demotion: {(time.perf_counter() - t0) * 1e3:.1f} ms wall (profiled)\n")
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15))


if __name__ == "__main__":
    main()

"""Every GPU kernel of a decode step, per step and per layer: which launches a row adds over another (GPU).

    python scripts/dev/step_kernels.py --ctx 102400 --rows bf16+graph+compile,oscar:model+graph+compile

Builds the rows as `scripts/bench_throughput.py` does (random Qwen3-4B-shape weights, synthetic cache), runs
--warmup steps, then profiles --steps consecutive ones (a page of 8 holds one demotion: the counts are per-step
means over them) and prints, per kernel name: launches per step and per layer, mean us per launch, ms per step;
and, timed before the profiler starts, the mean wall time of as many steps as bench_throughput's mean takes them
(`time_steps`, each step synchronized), so that the gap between it and the kernels' sum shows. --warmup defaults to
bench_throughput's (`whole_pages`: two demotions before any timed step).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_throughput import (MODELS, build_model, fill_three_region, make_quantizer, row_engine,  # noqa: E402
                              static_step, time_steps, whole_pages)
from harness.seam import install  # noqa: E402


def kernel_table(events, steps: int, layers: int) -> list[tuple[str, float, float, float]]:
    """(name, launches per layer, us per launch, ms per step) of every CUDA kernel, by ms per step."""
    total_us, launches = {}, {}
    for event in events:
        if event.device_type == torch.autograd.DeviceType.CUDA:
            total_us[event.name] = total_us.get(event.name, 0.0) + event.self_device_time_total
            launches[event.name] = launches.get(event.name, 0) + 1
    rows = [(name[:90], launches[name] / steps / layers, us / launches[name], us / steps / 1e3)
            for name, us in total_us.items()]
    return sorted(rows, key=lambda row: -row[3])


def profile_row(model, row: str, batch: int, ctx: int, warmup: int | None, steps: int) -> None:
    quantizer = make_quantizer(row, model.config)
    steps, page_warmup = whole_pages(steps, quantizer)
    warmup = page_warmup if warmup is None else warmup
    _, frozen, graph, compiled = row_engine(row)
    if not frozen:
        raise SystemExit(f"{row}: this script profiles frozen-cache rows (+graph or +frozen).")
    with install(model, quantizer, kernels="triton") as seam, torch.inference_mode():
        cache = seam.new_cache()
        fill_three_region(cache, model, batch, ctx, torch.bfloat16)
        make_step = static_step(model, cache, batch, warmup + 2 * steps, "cuda", graph=graph, compile_step=compiled)
        for _ in range(warmup):
            make_step()()
        _, wall_ms = time_steps(make_step, steps, "cuda", warmup=0)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                make_step()()
            torch.cuda.synchronize()
    table = kernel_table(prof.events(), steps, model.config.num_hidden_layers)
    print(f"\n### {row}, batch {batch}, ctx {ctx}: {sum(r[3] for r in table):.3f} ms GPU per step, "
          f"{wall_ms:.3f} ms wall per step, {sum(r[1] for r in table):.2f} launches per layer\n")
    print("| kernel | per layer | us per launch | ms per step |\n|---|---|---|---|")
    for name, per_layer, us, ms in table:
        print(f"| {name} | {per_layer:.2f} | {us:.1f} | {ms:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3_4b", choices=MODELS)
    parser.add_argument("--rows", default="bf16+graph+compile,oscar:model+graph+compile")
    parser.add_argument("--ctx", type=int, default=102400)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=None,
                        help="untimed steps (default: bench_throughput's, two demotions before any timed step)")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    model = build_model(args.model, "cuda", torch.bfloat16, 1)
    for row in args.rows.split(","):
        profile_row(model, row, args.batch, args.ctx, args.warmup, args.steps)


if __name__ == "__main__":
    main()

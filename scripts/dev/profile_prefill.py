"""Time (and optionally profile) one prefill of random tokens through BF16 and through quantized caches.

Random weights of a model's shapes (scripts/bench_throughput.py's models), one prompt of --tokens tokens, batch 1:
"dynamic" runs transformers' own DynamicCache and SDPA (no seam); a quantizer name runs the seam's cache with that
quantizer (bf16: the seam's full-precision cache; OSCAR with random orthogonal stand-in rotations, as
bench_throughput.py builds them; 'oscar:model' rotates in the model's dtype). Each prefill is timed after a warm-up
one; --profile adds, per quantizer, the CUDA kernels of one more prefill by total time:

    python scripts/dev/profile_prefill.py --tokens 32768 --quantizers dynamic,bf16,oscar,oscar:model --profile
    python scripts/dev/profile_prefill.py --model tiny --tokens 300     # CPU smoke run (fp32, reference kernels)
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_throughput import build_model, make_quantizer  # noqa: E402
from harness.seam import install  # noqa: E402
from harness.static_cache import prefill  # noqa: E402


DYNAMIC = "dynamic"   # transformers' DynamicCache without the seam


def prompt(vocab: int, tokens: int, device: str) -> dict:
    gen = torch.Generator(device=device).manual_seed(0)
    ids = torch.randint(0, vocab, (1, tokens), generator=gen, device=device)    # [1, T]
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_prefill(model, name: str, enc: dict) -> float:
    """Seconds of one prefill through a fresh cache of `name` (synchronized)."""
    from transformers import DynamicCache
    synchronize()
    start = time.perf_counter()
    if name == DYNAMIC:
        prefill(model, enc, DynamicCache(config=model.config))
    else:
        with install(model, make_quantizer(name, model.config)) as seam:
            prefill(model, enc, seam.new_cache())
    synchronize()
    return time.perf_counter() - start


def kernel_table(model, name: str, enc: dict, top: int) -> list[str]:
    """The `top` CUDA kernels of one prefill by total time: name, calls, total ms."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:   # GPU runs only
        run_prefill(model, name, enc)
    events = sorted(prof.key_averages(), key=lambda e: e.device_time_total, reverse=True)[:top]
    total = sum(e.device_time_total for e in prof.key_averages()) / 1e3
    lines = [f"#### {name}: {total:.1f} ms of kernels", "", "| kernel | calls | ms |", "|---|---|---|"]
    lines += [f"| {e.key[:90]} | {e.count} | {e.device_time_total / 1e3:.2f} |" for e in events]
    return lines + [""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3_4b", help="a bench_throughput.py model, or tiny (a CPU smoke run)")
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--quantizers", default=f"{DYNAMIC},bf16,oscar")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--profile", action="store_true", help="also list each quantizer's top CUDA kernels")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = build_model(args.model, device, torch.bfloat16 if device == "cuda" else torch.float32)
    enc = prompt(model.config.vocab_size, args.tokens, device)
    names = args.quantizers.split(",")
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(f"{args.model} shapes, random weights, one prompt of {args.tokens} tokens, {where}")
    print("| quantizer | prefill s (each run after a warm-up) |\n|---|---|")
    for name in names:
        run_prefill(model, name, enc)
        times = [run_prefill(model, name, enc) for _ in range(args.repeats)]
        print(f"| {name} | {' / '.join(f'{t:.3f}' for t in times)} |", flush=True)
    if args.profile and device == "cuda":
        for name in names:
            print("\n".join(kernel_table(model, name, enc, args.top)), flush=True)


if __name__ == "__main__":
    main()

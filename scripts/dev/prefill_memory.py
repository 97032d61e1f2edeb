"""Where a prefill's peak GPU memory goes, against the memory plan's estimate (GPU; random weights are fine).

Runs one prefill of `--batch` padded random prompts through the seam (one forward, or `--chunk` tokens per
forward as task.prefill_chunk does), with the allocator's history recorded, and prints: the plan's KV cache and
activation bytes for that workload, the peak the prefill added above the loaded model, and the largest blocks live
at that peak with the code that allocated them. Run on the GPU box from the repo root:

    python scripts/dev/prefill_memory.py --model qwen3_8b --quantizer quarot_int2 --ctx 32768 --batch 4 --chunk 8192
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harness.cache import reserve_history  # noqa: E402
from harness.memory_plan import Workload, activation_bytes, kv_per_layer  # noqa: E402
from harness.quantizer import build_quantizer, has_own_cache  # noqa: E402
from harness.seam import install  # noqa: E402
from harness.static_cache import prefill  # noqa: E402

GB = 1e9
SHOWN_CODE = ("harness/", "kernels/", "transformers/", "torch/nn/functional")


def load(model_name: str, device: str):
    from hydra import compose, initialize_config_dir
    from harness.models import load_model
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[2] / "configs"), version_base=None):
        cfg = compose(config_name="config", overrides=[f"model={model_name}", "model.source=random",
                                                        "+model.random_tokenizer=char"])
    return load_model(cfg.model, device).model


def padded_batch(batch: int, ctx: int, pad: int, vocab: int, device: str) -> dict:
    """Random ids [B, ctx]; every row after the first left-padded by `pad` tokens (an explicit mask, as a task's)."""
    ids = torch.randint(100, vocab - 1, (batch, ctx), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(batch, ctx, dtype=torch.long)
    mask[1:, :pad] = 0
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device)}


def live_at_peak(trace: list[dict]) -> tuple[int, list[tuple[int, str]]]:
    """Replay the allocator's events: the highest live total and the blocks live then, with their allocating frame."""
    live, total, peak, at_peak = {}, 0, 0, {}
    for event in trace:
        if event["action"] == "alloc":
            live[event["addr"]] = (event["size"], event.get("frames", []))
            total += event["size"]
            if total > peak:
                peak, at_peak = total, dict(live)
        elif event["action"] == "free_completed" and event["addr"] in live:
            total -= live.pop(event["addr"])[0]
    blocks = sorted(((size, where(frames)) for size, frames in at_peak.values()), reverse=True)
    return peak, blocks


def where(frames: list[dict]) -> str:
    """The innermost frames of our code, transformers or torch.nn.functional that made a block."""
    ours = [f"{f['filename'].split('site-packages/')[-1]}:{f['line']} {f['name']}" for f in frames
            if any(part in f["filename"] for part in SHOWN_CODE)]
    return " <- ".join(ours[:3]) or "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3_8b")
    parser.add_argument("--quantizer", default="quarot_int2")
    parser.add_argument("--ctx", type=int, default=32768)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--chunk", type=int, default=None)
    parser.add_argument("--pad", type=int, default=64)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    model = load(args.model, "cuda")
    quantizer = build_quantizer(args.quantizer)
    work = Workload(args.batch, args.ctx, 2, False, args.chunk, reserved=True, gpu_prefill=True,
                    packed_history=quantizer.stores_codes, padding_mask=has_own_cache(quantizer))
    print(f"plan: KV cache {sum(kv_per_layer(model.config, quantizer, work)) / GB:.2f} GB, activations "
          f"{activation_bytes(model.config, work) / GB:.2f} GB (one layer), batch {args.batch} x {args.ctx}, "
          f"chunk {args.chunk}")
    enc = padded_batch(args.batch, args.ctx, args.pad, model.config.vocab_size, "cuda")
    with install(model, quantizer, kernels="auto") as seam, torch.inference_mode():
        cache = seam.new_cache()
        reserve_history(cache, args.ctx)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.memory._record_memory_history(max_entries=200_000)
        prefill(model, enc, cache, args.chunk)
        torch.cuda.synchronize()
        trace = torch.cuda.memory._snapshot()["device_traces"][0]
        torch.cuda.memory._record_memory_history(enabled=None)
        peak = torch.cuda.max_memory_allocated() - base
    replayed, blocks = live_at_peak(trace)
    print(f"prefill peak above the loaded model: {peak / GB:.2f} GB (allocator history: {replayed / GB:.2f} GB)")
    print("| GB | allocated at |\n|---|---|")
    for size, site in blocks[:args.top]:
        print(f"| {size / GB:.3f} | {site} |")


if __name__ == "__main__":
    main()

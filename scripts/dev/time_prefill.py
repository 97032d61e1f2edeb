"""Time one prefill through the seam with and without the windowed sliding-window path (CPU or GPU).

Gemma 3's sliding-window layers get a full [T, T] mask from transformers; the CPU SDPA kernel does not skip
its masked blocks, so the seam computes those layers in query chunks of one window (`harness.seam.windowed_sdpa`).
This measures both on the same inputs, alternating, and reports the largest logit difference:

    python scripts/dev/time_prefill.py                       # Gemma 3 270M, bf16, 4k tokens, batch 1, CPU
    python scripts/dev/time_prefill.py --batch 8 --repeats 1
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import harness.seam as seam_module  # noqa: E402
from harness.quantizer import build_quantizer  # noqa: E402


def load(model_name: str, dtype: str, device: str):
    from hydra import compose, initialize_config_dir
    from harness.models import load_model
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[2] / "configs"), version_base=None):
        cfg = compose(config_name="config", overrides=[f"model={model_name}", f"model.dtype={dtype}"])
    return load_model(cfg.model, device).model


def timed_prefill(model, seam, ids: torch.Tensor, windowed: bool) -> tuple[float, torch.Tensor]:
    seam_module.WINDOWED_PREFILL = windowed
    start = time.perf_counter()
    logits = model(input_ids=ids, past_key_values=seam.new_cache(), logits_to_keep=1).logits   # [B, 1, vocab]
    if ids.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start, logits.float()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3_270m")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    model = load(args.model, args.dtype, args.device)
    ids = torch.randint(100, 20000, (args.batch, args.ctx), generator=torch.Generator().manual_seed(0)).to(args.device)
    times = {False: [], True: []}
    try:
        with seam_module.install(model, build_quantizer("bf16")) as seam, torch.inference_mode():
            for _ in range(args.repeats):
                for windowed in (False, True):
                    seconds, logits = timed_prefill(model, seam, ids, windowed)
                    times[windowed].append(seconds)
                    if windowed:
                        diff = (logits - full_logits).abs().max().item()
                    else:
                        full_logits = logits
    finally:
        seam_module.WINDOWED_PREFILL = True
    print("| model | dtype | ctx | batch | full-mask prefill s | windowed prefill s | speedup | max logit diff |")
    print("|---|---|---|---|---|---|---|---|")
    full, windowed = min(times[False]), min(times[True])
    print(f"| {args.model} | {args.dtype} | {args.ctx} | {args.batch} | {full:.2f} | {windowed:.2f} | "
          f"{full / windowed:.2f}x | {diff:.3g} |")


if __name__ == "__main__":
    main()

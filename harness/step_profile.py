"""Where one decode step's time goes: CPU wall vs GPU kernel time, split by kernel kind.

    split = profile_rows(lambda: model(...))   # {"wall_ms": .., "gpu_ms": .., "gpu_attn_ms": .., ...}

Used by `scripts/bench_throughput.py --profile`. A step whose gpu_ms is far below wall_ms is bound by
the host (Python, kernel launches, per-call planning), not by the bytes it reads.
"""
from __future__ import annotations

import time

import torch
from torch.profiler import ProfilerActivity, profile

KINDS = {  # kernel-name fragments (lower case) per kind; first match wins, the rest is "other"
    "attn": ("_decode_stage", "flash", "fmha", "attention", "sdpa", "cudnn"),
    "kv_write": ("_quantize_pack",),
    "gemm": ("gemm", "gemv", "cutlass", "xmma", "nvjet", "matmul"),
}


def kernel_kind(name: str) -> str:
    low = name.lower()
    return next((kind for kind, parts in KINDS.items() if any(p in low for p in parts)), "other")


def split_kernel_times(events, top_n: int = 16) -> dict:
    """Sum device self time (ms) per kind over profiler events that ran on the GPU; also the top_n kernels by time,
    each as [name, ms, launches]."""
    totals = {f"gpu_{kind}_ms": 0.0 for kind in (*KINDS, "other")}
    by_name: dict[str, float] = {}
    count: dict[str, int] = {}
    launches = 0
    for event in events:
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        launches += 1
        ms = event.self_device_time_total / 1e3
        totals[f"gpu_{kernel_kind(event.name)}_ms"] += ms
        by_name[event.name] = by_name.get(event.name, 0.0) + ms
        count[event.name] = count.get(event.name, 0) + 1
    totals = {k: round(v, 3) for k, v in totals.items()}
    top = sorted(by_name.items(), key=lambda item: -item[1])[:top_n]
    return {"gpu_ms": round(sum(totals.values()), 3), **totals, "kernels": launches,
            "top_kernels": [[name, round(ms, 3), count[name]] for name, ms in top]}


MAX_SKIPPED_STEPS = 2  # steps run past demoting ones before the profiled step (a demotion recurs one page later)


def profile_rows(step, warmup: int = 2, demotes_next=None) -> dict:
    """Run `step` a few times, then profile one call; wall time includes a final device sync. demotes_next (a frozen
    cache's `StaticState.demotes_next_step`): steps that would start with a page demotion are run unprofiled first,
    so the profiled one is a steady step like the timed median; the row says which it was (profiled_demotion)."""
    on_gpu = torch.cuda.is_available()
    for _ in range(warmup):
        step()
    for _ in range(MAX_SKIPPED_STEPS if demotes_next is not None else 0):
        if not demotes_next():
            break
        step()
    demotion = {} if demotes_next is None else {"profiled_demotion": demotes_next()}
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        step()
        if on_gpu:
            torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) * 1e3
    return {"wall_ms": round(wall, 3), **split_kernel_times(prof.events()), **demotion}

"""What a result row records about the machine it ran on: package versions, device, peak memory."""
from __future__ import annotations

import gc
import os
import platform
import resource

import torch


def versions() -> dict:
    import transformers
    out = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}
    try:
        import triton
        out["triton"] = triton.__version__
    except ImportError:
        pass
    return out


def device_name() -> str:
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        return torch.cuda.get_device_name(0) if count == 1 else f"{count} x {torch.cuda.get_device_name(0)}"
    return f"cpu ({os.cpu_count()} cores)"


def peak_memory_by_device() -> dict[str, float]:
    """MiB allocated at the peak on each visible GPU since `reset_peak_memory` (empty without CUDA)."""
    if not torch.cuda.is_available():
        return {}
    return {f"cuda:{i}": round(torch.cuda.max_memory_allocated(i) / 2**20, 1) for i in range(torch.cuda.device_count())}


def reset_peak_memory() -> None:
    """Start every GPU's peak afresh (a cell's row then holds its own peak, not an earlier cell's of the sweep)."""
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(index)


def release_memory() -> None:
    """Free what a finished cell left: collect its model's reference cycles and hand the allocator's cached blocks
    back to every GPU, so the next cell of a sweep in this process plans with the whole free memory."""
    gc.collect()
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            with torch.cuda.device(index):
                torch.cuda.empty_cache()


def peak_memory_mb() -> float:
    """The largest GPU's peak (what must fit on one card), or the host's peak RSS without CUDA."""
    if torch.cuda.is_available():
        return max(peak_memory_by_device().values())
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def environment() -> dict:
    """The machine fields of a result row (measured when the row is written)."""
    out = {"versions": versions(), "device": device_name(), "peak_mem_mb": round(peak_memory_mb(), 1)}
    by_device = peak_memory_by_device()
    if len(by_device) > 1:
        out["peak_mem_mb_by_device"] = by_device
    return out

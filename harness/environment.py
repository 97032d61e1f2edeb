"""What a result row records about the machine it ran on: package versions, device, peak memory."""
from __future__ import annotations

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
        return torch.cuda.get_device_name(0)
    return f"cpu ({os.cpu_count()} cores)"


def peak_memory_mb() -> float:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def environment() -> dict:
    """The machine fields of a result row (measured when the row is written)."""
    return {"versions": versions(), "device": device_name(), "peak_mem_mb": round(peak_memory_mb(), 1)}

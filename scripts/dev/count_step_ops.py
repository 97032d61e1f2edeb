"""Count the tensor ops one decode step issues, per quantizer: a CPU proxy for GPU kernel launches.

On a GPU a batch-1 decode step is bound by the host (results/bench/bench_throughput_profile.md), so every
op the seam adds per layer costs launch time. This counts, on CPU, the ops that would launch a kernel
(views, allocations and no-op casts excluded; each Triton call counted as its launches) for one decode
step of a small Qwen3 config with the cache filled like scripts/bench_throughput.py fills it:

    TRITON_INTERPRET=1 python scripts/dev/count_step_ops.py                      # bf16 model, 4 layers
    TRITON_INTERPRET=1 python scripts/dev/count_step_ops.py --quantizers bf16,oscar,oscar:model
    TRITON_INTERPRET=1 python scripts/dev/count_step_ops.py --quantizers bf16,bf16+compile,oscar:model+compile

`name:model` sets rotation_dtype=model for that quantizer; a `+compile` suffix runs the step with the model's RMSNorms,
MLPs and RoPE compiled (harness.compiled_step, as `DecodeStep(compile_step=True)` does): each compiled piece counts
as the kernels it launched, its fused inductor kernels and its extern GEMMs (torch.compile refuses to run under the
counting dispatch mode, so a compiled piece runs outside it, under the profiler). Prints a Markdown table.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
from torch._inductor import config as inductor_config
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_throughput as bench  # noqa: E402
import kernels.decode  # noqa: E402
import kernels.quant  # noqa: E402
from harness import compiled_step  # noqa: E402
from harness.seam import install  # noqa: E402

NO_KERNEL = {"view", "_unsafe_view", "slice", "transpose", "t", "expand", "select", "unsqueeze", "squeeze",
             "permute", "as_strided", "alias", "detach", "empty", "new_empty", "empty_strided", "split", "unbind",
             "split_with_sizes", "lift_fresh", "_reshape_alias", "reshape", "numpy_T"}
TRITON_LAUNCHES = {"decode_attention": 2, "quantize_pack": 1}   # stage 1 + stage 2; one write launch
COMPILE_SUFFIX = "+compile"
INDUCTOR_KERNEL_MARK = "cpp_fused"        # in the name of an inductor C++ kernel (on CUDA: a Triton kernel)
EXTERN_GEMMS = {"aten::mm", "aten::addmm", "aten::bmm"}


class OpCounter(TorchDispatchMode):
    """Counts dispatched ops by name, skipping those that launch no kernel; pausable around Triton calls."""

    def __init__(self):
        super().__init__()
        self.counts, self.paused = Counter(), False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.__name__.split(".")[0]
        no_op_cast = name == "to" and args and out is args[0]
        if not self.paused and name not in NO_KERNEL and not no_op_cast:
            self.counts[name] += 1
        return out


@contextmanager
def triton_calls_counted(counter: OpCounter):
    """Inside: each Triton entry point counts as its launches, and the ops of the interpreter itself are not counted."""
    originals = {name: getattr(kernels.decode if name == "decode_attention" else kernels.quant, name)
                 for name in TRITON_LAUNCHES}

    def wrap(name, fn):
        def call(*args, **kwargs):
            counter.paused = True
            try:
                return fn(*args, **kwargs)
            finally:
                counter.paused = False
                counter.counts[f"triton:{name}"] += TRITON_LAUNCHES[name]
        return call

    for name, fn in originals.items():
        setattr(kernels.decode if name == "decode_attention" else kernels.quant, name, wrap(name, fn))
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(kernels.decode if name == "decode_attention" else kernels.quant, name, fn)


@contextmanager
def compiled_pieces_counted(counter: OpCounter):
    """Inside: every piece `harness.compiled_step` compiles runs outside the counting mode, under the profiler, and
    counts as the inductor kernels and extern GEMMs it launched (`compiled:<piece>`)."""
    real = compiled_step._compiled

    def counted(fn):
        compiled = real(fn)

        def call(*args, **kwargs):
            with _disable_current_modes(), profile(activities=[ProfilerActivity.CPU]) as prof:
                out = compiled(*args, **kwargs)
            launches = [e for e in prof.events() if INDUCTOR_KERNEL_MARK in e.name or e.name in EXTERN_GEMMS]
            counter.counts[f"compiled:{fn.__qualname__.split('.')[0]}"] += len(launches)
            return out
        return call

    compiled_step._compiled = counted
    try:
        yield
    finally:
        compiled_step._compiled = real


def count_step(model, cache, compiled: bool = False) -> Counter:
    """Ops of the model's forward in the second decode step after the filled cache (the first one warms up and,
    `compiled`, compiles; the step's inputs are built before counting starts)."""
    with torch.inference_mode(), compiled_step.compiled_parts(model) if compiled else nullcontext():
        bench.eager_step(model, cache, 1, "cpu")()()
    ids, positions = torch.zeros((1, 1), dtype=torch.long), bench._positions(cache, 1, "cpu")
    counter = OpCounter()
    with compiled_pieces_counted(counter), triton_calls_counted(counter), torch.inference_mode():
        with compiled_step.compiled_parts(model) if compiled else nullcontext(), counter:
            model(input_ids=ids, past_key_values=cache, use_cache=True, **positions)
    return counter.counts


def ops_for(model, spec: str, ctx: int, dtype) -> Counter:
    """spec: a quantizer name, optionally ':model' for rotation_dtype=model, then optionally '+compile'."""
    from transformers import DynamicCache
    spec, compiled = spec.removesuffix(COMPILE_SUFFIX), spec.endswith(COMPILE_SUFFIX)
    if spec == "bf16":
        cache = DynamicCache(config=model.config)
        bench.fill_dynamic(cache, model, 1, ctx, dtype)
        return count_step(model, cache, compiled)
    quantizer = bench.make_quantizer(spec, model.config)
    with install(model, quantizer, kernels="triton") as seam:
        cache = seam.new_cache()
        bench.fill_three_region(cache, model, 1, ctx, dtype)
        return count_step(model, cache, compiled)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quantizers", default="bf16,naive_int2,kivi2,oscar,oscar:model")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--ctx", type=int, default=1152)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("Set TRITON_INTERPRET=1: the seam's kernel path runs under the Triton interpreter here.")
    bench.CONFIGS["count"] = dict(bench.CONFIGS["tiny"], num_hidden_layers=args.layers)
    inductor_config.cpp.enable_kernel_profile = True          # inductor's C++ kernels show in the profiler
    dtype = getattr(torch, args.dtype)
    model = bench.build_model("count", "cpu", dtype)
    print(f"| quantizer | ops per step ({args.layers} layers, {args.dtype}, ctx {args.ctx}) | per layer | top ops |")
    print("|---|---|---|---|")
    for spec in args.quantizers.split(","):
        counts = ops_for(model, spec, args.ctx, dtype)
        total = sum(counts.values())
        top = ", ".join(f"{k} {v}" for k, v in counts.most_common(10))
        print(f"| {spec} | {total} | {total / args.layers:.2f} | {top} |", flush=True)


if __name__ == "__main__":
    main()

"""End-to-end decode throughput and KV memory at long context: INT2/INT4 caches vs BF16 (GPU).

    python scripts/bench_throughput.py                          # Qwen3-4B shapes, ctx 32k/100k, batch 1/8 + same budget
    python scripts/bench_throughput.py --model qwen3_8b --ctx 100000 --batch 1 --budget-gb 70
    python scripts/bench_throughput.py --model llama32_1b --ctx 102400 --batch 1,4 \
        --quantizers bf16,bf16+graph+compile,oscar:model+graph+compile --same-budget-cap 256   # head_dim 64
    python scripts/bench_throughput.py --tiny --steps 3         # CPU smoke run (tests use this)
    python scripts/bench_throughput.py --from-json a.json       # no GPU: a saved run's tables, rebuilt from its JSON
    python scripts/bench_throughput.py --profile --ctx 102400 --batch 1   # where one (steady) decode step's time goes
    python scripts/bench_throughput.py --quantizers bf16,oscar,oscar+graph   # + the step as one CUDA graph
    python scripts/bench_throughput.py --ctx 102400 --batch 1 --quantizers bf16+graph,oscar:model+graph   # same engine
    python scripts/bench_throughput.py --ctx 102400 --batch 1 --quantizers bf16+graph+compile,oscar:model+graph+compile
    python scripts/bench_throughput.py --ctx 102400 --batch 1 --quantizers oscar:model+graph --eager-demotions
    python scripts/bench_throughput.py --ctx 32768 --batch 8 --quantizers oscar:model+graph+compile --stagger
    python scripts/bench_throughput.py --model qwen3_32b --gpus 2 --ctx 131072 --batch 1 \
        --quantizers bf16+frozen,oscar:model+frozen --budget-from bf16+frozen   # split over 2 GPUs, same-memory batch

The model is built from the real config with random bf16 weights (speed does not depend on the values). The cache is
filled with synthetic K/V written through each quantizer's write path (the Triton quantize-pack kernel on CUDA)
rather than by a prefill; BF16 uses transformers' own DynamicCache and SDPA (what users already have), bf16_static
its StaticCache; `bf16+graph` is BF16 on the harness's own engine (the identity quantizer: every row in the frozen
cache's full-precision buffer, the same Triton decode kernel and CUDA graph as the quantizers' `+graph` rows, so the
ratio against it compares caches, not engines); a further `+compile` runs that engine's step with the model's RMSNorms,
MLPs and RoPE compiled (harness.compiled_step); the other rows run the harness seam and its decode kernel. Reported
per row: ms/step (the median step: steady, no page demotion), its mean over the timed steps (on the GPU rounded up
to whole demotion pages, so the mean carries the demotions a generation pays; `timed_steps`, after `warmup_steps`
untimed ones that include two demotions), tokens/s from that mean
(what the same-budget ratios compare; a `+graph` row's page demotions are CUDA graphs of their own, or eager with
--eager-demotions, as its `demotions` says), peak GPU memory, KV bytes per token measured from allocated memory, the physical floor
of the step (weight bytes + the cache's bytes, read once, at the copy bandwidth measured in the same run: GPU.md)
and the fraction of it reached, and the largest batch that fits --budget-gb at that context (or, --budget-from ROW, in
the memory that ROW's weights and cache take at the first batch: the batch that fills the same memory); rows that
--same-budget-cap holds below that batch get no throughput ratio.
--gpus N > 1 builds the random model over N GPUs (decoder layers split in order, harness.placement) and its rows
decode through `+graph` (one CUDA graph per GPU, harness.segmented_graph; `+compile` compiles on each), `+frozen`
(the frozen cache in eager steps) or the eager engines; peak memory is then the sum over the GPUs, with each GPU's
in `peak_gb_by_device`. Models: the CONFIGS below or any shape file under configs/model/shapes/. With $OUT set, the
rows also go to $OUT/bench_throughput.json. The Markdown tables are printed last, built from that JSON alone
(`tables`), so --from-json prints the same tables from a saved run. --profile profiles one step per row; on
a frozen cache (`+frozen`, `+graph`) one that starts with no page demotion (`profiled_demotion` says so), like the
timed median. --stagger makes sequence b of a quantized cache b mod page_tokens tokens shorter (left padding), so
its sequences demote pages in different steps, as a batch of short prompts of mixed lengths does (each keeps its own
recent window); `demotion_graphs` counts the demotion layouts captured. Its ms_per_step of rows after the first is timed after a profiler session, which slowed the next
row's CUDA-graph steps on the H100 (OSCAR 5.87 ms after BF16's profile against 5.48 ms alone:
results/bench/bench_throughput_steady_profile.md): take step times from runs without --profile.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import placement  # noqa: E402
from harness.cache import ThreeRegionLayer  # noqa: E402
from harness.cli_args import positive_int, positive_ints  # noqa: E402
from harness.decode_clock import synchronize_all  # noqa: E402
from harness.environment import peak_memory_by_device, reset_peak_memory  # noqa: E402
from harness.memory_plan import Workload, kv_per_layer  # noqa: E402
from harness.step_profile import profile_rows  # noqa: E402
from harness.quantizer import build_quantizer, known_quantizers  # noqa: E402
from harness.seam import install  # noqa: E402
from harness.static_cache import DecodeStep, freeze  # noqa: E402
from report.paper_throughput import at_budget_batch  # noqa: E402
from bench_out import out_file, save  # noqa: E402

CONFIGS = {  # the public Qwen3 configs (no weights needed)
    "qwen3_4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936, rope_theta=1e6,
                     max_position_embeddings=131072, tie_word_embeddings=True),
    "qwen3_8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936, rope_theta=1e6,
                     max_position_embeddings=131072, tie_word_embeddings=False),
    "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, vocab_size=512, max_position_embeddings=8192),
}


SHAPES = Path(__file__).resolve().parents[1] / "configs" / "model" / "shapes"
MODELS = sorted({*CONFIGS, *(path.stem for path in SHAPES.glob("*.json"))})   # a name in both: CONFIGS


def model_config(name: str):
    from transformers import Qwen3Config
    from harness.random_model import shape_config
    return Qwen3Config(**CONFIGS[name]) if name in CONFIGS else shape_config(SHAPES / f"{name}.json")


def build_model(name: str, device: str, dtype, gpus: int = 1):
    """Random weights of `name`'s shape on `device`, or split layer by layer over `gpus` GPUs (even weight bytes)."""
    from harness.random_model import materialize, meta_model
    model = meta_model(model_config(name), dtype)
    if gpus < 2:
        return materialize(model, {"": device}, seed=0)
    layout = placement.module_layout(model)
    names = layout.head + layout.layers + layout.tail
    sizes = placement.module_bytes(model, names)
    device_map = placement.split([(n, sizes[n]) for n in names], {f"cuda:{i}": sum(sizes.values()) for i in range(gpus)})
    return placement.dispatch(materialize(model, device_map, seed=0), device_map)


def layer_device(model, idx: int) -> torch.device:
    """The device of decoder layer `idx` (its cache lives there)."""
    return next(model.get_submodule(f"{model.base_model_prefix}.layers.{idx}").parameters()).device


def _rows(cfg, batch: int, tokens: int, device, dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(seed)
    shape = (batch, cfg.num_key_value_heads, tokens, cfg.head_dim)               # [B, H_kv, T, D]
    return (torch.randn(shape, generator=gen, device=device, dtype=dtype),
            torch.randn(shape, generator=gen, device=device, dtype=dtype))


BF16_CACHES = ("bf16", "bf16_static")
GRAPH_SUFFIX = "+graph"    # e.g. oscar+graph: frozen cache, decode step replayed as one CUDA graph
FROZEN_SUFFIX = "+frozen"  # e.g. oscar+frozen: the same frozen cache, each step run eagerly
COMPILE_SUFFIX = "+compile"  # after +graph: that step with the model's RMSNorms, MLPs and RoPE compiled
WARMUP_STEPS = 2           # untimed steps (compilation, graph capture) of a cache without pages, and on the CPU
STATIC_SLACK = 16          # StaticCache rows beyond ctx + timed steps: warm-up and profiled steps append too


def row_engine(row_name: str) -> tuple[str, bool, bool, bool]:
    """(quantizer spec, frozen, graph, compiled) of a row name: 'oscar:model+graph+compile' -> ('oscar:model', True,
    True, True), 'bf16+frozen' -> ('bf16', True, False, False); ValueError for a +compile that does not follow +graph
    (only the captured frozen step is compiled)."""
    compiled = row_name.endswith(COMPILE_SUFFIX)
    name = row_name.removesuffix(COMPILE_SUFFIX)
    if compiled and not name.endswith(GRAPH_SUFFIX):
        raise ValueError(f"{row_name}: {COMPILE_SUFFIX} compiles the frozen step, so it follows {GRAPH_SUFFIX} "
                         f"(e.g. oscar{GRAPH_SUFFIX}{COMPILE_SUFFIX}).")
    graph, frozen = name.endswith(GRAPH_SUFFIX), name.endswith(FROZEN_SUFFIX)
    return name.removesuffix(GRAPH_SUFFIX).removesuffix(FROZEN_SUFFIX), graph or frozen, graph, compiled


def check_rows(row_names: list[str]) -> None:
    """ValueError (one sentence) for a row name this run cannot serve, before any model is built."""
    known = known_quantizers()
    for row_name in row_names:
        spec, frozen, _, compiled = row_engine(row_name)
        name = spec.partition(":")[0]
        if name not in known and (frozen or spec not in BF16_CACHES):
            raise ValueError(f"{row_name}: a row is {' or '.join(BF16_CACHES)}, or a quantizer ({', '.join(known)}) "
                             f"with an optional ':model' and {FROZEN_SUFFIX}, {GRAPH_SUFFIX} or "
                             f"{GRAPH_SUFFIX}{COMPILE_SUFFIX}.")


def fill_dynamic(cache, model, batch: int, ctx: int, dtype) -> None:
    """BF16 rows straight into transformers' own cache layers (DynamicCache or StaticCache), on each layer's GPU."""
    for idx in range(model.config.num_hidden_layers):
        k, v = _rows(model.config, batch, ctx, layer_device(model, idx), dtype, idx)
        cache.update(k, v, idx)


def fill_three_region(cache, model, batch: int, ctx: int, dtype, chunk: int = 8192, stagger: bool = False) -> None:
    """Sink and recent rows in full precision, the middle through the quantizer's write path (in chunks), on each
    layer's GPU. stagger: sequence b is b mod page_tokens tokens shorter (left padding: that many fewer recent rows),
    so the sequences reach a page beyond their recent windows in different steps."""
    cfg = model.config
    for idx, layer in enumerate(cache.layers):
        q, device = layer.quantizer, layer_device(model, idx)
        fp_rows = ctx if q.sink_tokens is None else min(q.sink_tokens + q.recent_tokens, ctx)   # identity: all
        k, v = _rows(cfg, batch, fp_rows, device, dtype, idx)
        layer.lazy_initialization(k, v)
        layer.keys, layer.values = k, v
        layer.pad = [b % q.page_tokens if stagger and layer.history_k is not None else 0 for b in range(batch)]
        layer.n_tokens = ctx
        if layer.history_k is None:
            continue
        layer.history_k.reserve(ctx - fp_rows + 64)     # room for the timed steps' demotions
        layer.history_v.reserve(ctx - fp_rows + 64)
        for start in range(0, ctx - fp_rows, chunk):
            n = min(chunk, ctx - fp_rows - start)
            hk, hv = _rows(cfg, batch, n, device, dtype, 1000 + idx * 97 + start)
            layer.history_k.append(hk)
            layer.history_v.append(hv)


def kv_bytes(cache) -> int:
    total = 0
    for layer in cache.layers:
        total += layer.nbytes() if isinstance(layer, ThreeRegionLayer) else \
            (layer.keys.numel() + layer.values.numel()) * layer.keys.element_size()
    return total


def _positions(cache, batch: int, device) -> dict:
    """position_ids [B, 1] and cache_position [1] of the next token, from the cache's length, computed on the
    host before a timed call (a StaticCache keeps its length on the device; reading it here keeps the sync
    out of the timing, as generate() does by passing cache_position)."""
    pos = int(cache.get_seq_length())
    return {"position_ids": torch.full((batch, 1), pos, device=device),
            "cache_position": torch.tensor([pos], device=device)}


def eager_step(model, cache, batch: int, device):
    """make_step() -> a call that runs one decode forward (a token per sequence) through `cache`."""
    ids = torch.randint(0, model.config.vocab_size, (batch, 1), device=device)

    def make_step():
        positions = _positions(cache, batch, device)                 # host-side inputs, outside the timing
        return lambda: model(input_ids=ids, past_key_values=cache, use_cache=True, **positions)
    return make_step


def static_step(model, cache, batch: int, steps: int, device, graph: bool, compile_step: bool = False,
                graph_demotions: bool = True):
    """make_step() for a frozen cache (harness.static_cache) sized for `steps` calls (warm-up included) and the
    profiler's: one DecodeStep call, a CUDA-graph replay if `graph` (its page demotions replayed too unless
    graph_demotions is False), with the model's RMSNorms, MLPs and RoPE compiled if `compile_step`."""
    state = freeze(cache, steps + STATIC_SLACK)
    decoder = DecodeStep(model, cache, state, graph=graph, compile_step=compile_step, graph_demotions=graph_demotions)
    ids = torch.randint(0, model.config.vocab_size, (batch, 1), device=device)

    def make_step():
        positions = torch.full((batch, 1), state.n_tokens, device=device)
        return lambda: decoder(ids, positions)
    make_step.demotes_next = state.demotes_next_step             # `profiled` skips a demoting step
    make_step.state = state
    return make_step


def time_steps(make_step, steps: int, device, warmup: int = WARMUP_STEPS) -> tuple[float, float]:
    """(median, mean) ms of `steps` decode steps, after `warmup` untimed ones (compilation, graph capture; with a
    demotion among them, its kernels' compilation too). The median is the steady step; the mean, over a whole number
    of demotion pages (`whole_pages`), what a generated token costs when every step waits for the one before (each
    is synchronized: generation, which syncs every 8 steps, can hide part of a demotion's host time)."""
    times = []
    with torch.inference_mode():
        for _ in range(steps + warmup):
            step = make_step()
            synchronize_all()
            t0 = time.perf_counter()
            step()
            synchronize_all()
            times.append((time.perf_counter() - t0) * 1e3)
    timed = sorted(times[warmup:])
    return timed[len(timed) // 2], sum(timed) / len(timed)


def whole_pages(steps: int, quantizer, stagger: bool = False) -> tuple[int, int]:
    """(timed, warm-up) steps of a quantizer's cache on the GPU: steps rounded up to whole demotion pages (one step in
    page_tokens demotes a page of recent rows into the packed history), so that a mean over them includes its share of
    demotions, after 2 x page_tokens + 1 untimed steps, which demote twice (with a CUDA-graph step the first demotion
    compiles its kernels and the second captures it: harness.demotion_graph); staggered sequences (`--stagger`) demote
    in page_tokens phases, whose first demotions take page_tokens - 1 steps more: 3 x page_tokens + 1. (CPU runs,
    smoke tests of the logic, keep `steps` after two.)"""
    page = getattr(quantizer, "page_tokens", None)
    return (steps, WARMUP_STEPS) if page is None else (-(-steps // page) * page, (3 if stagger else 2) * page + 1)


def profiled(make_step) -> dict:
    """Where one step's time goes (harness.step_profile), for a step built like the timed ones: for a frozen cache
    a steady step (no page demotion before it, as in the timed median)."""
    def run():
        with torch.inference_mode():
            make_step()()
    return profile_rows(run, demotes_next=getattr(make_step, "demotes_next", None))


def make_quantizer(spec: str, cfg):
    """A quantizer from 'name' or 'name:model' (rotation_dtype=model), checked against cfg; OSCAR gets random
    orthogonal stand-in rotations (speed does not depend on the basis)."""
    name, _, rotation_dtype = row_engine(spec)[0].partition(":")
    quantizer = build_quantizer(name, **({"rotation_dtype": rotation_dtype} if rotation_dtype else {}))
    quantizer.check(cfg)
    if name == "oscar":
        rot = torch.linalg.qr(torch.randn(cfg.head_dim, cfg.head_dim, dtype=torch.float64))[0].float()
        quantizer.rotations_k = quantizer.rotations_v = {i: rot for i in range(cfg.num_hidden_layers)}
    return quantizer


def measure(model, quantizer_name: str, batch: int, ctx: int, steps: int, device, dtype, profile: bool = False,
            graph_demotions: bool = True, stagger: bool = False) -> dict:
    """One row: fill a cache of `batch` x `ctx`, time decode steps, measure memory (and profile a step).

    quantizer_name: bf16 (transformers' DynamicCache), bf16_static (its StaticCache: no per-step growth copy),
    a quantizer name, 'name:model' (rotation_dtype=model); a '+graph' suffix decodes through a frozen cache
    with the step captured as a CUDA graph (harness.static_cache), '+frozen' through the same cache in eager steps,
    '+graph+compile' with the model's RMSNorms, MLPs and RoPE compiled in that step (harness.compiled_step).
    A '+graph' row's page demotions are CUDA graphs too unless graph_demotions is False (the row's `demotions` says).
    stagger: the sequences demote in different steps (`fill_three_region`).
    """
    from transformers import DynamicCache, StaticCache
    cfg = model.config
    if device == "cuda":
        torch.cuda.empty_cache()
        reset_peak_memory()
    before = gpu_allocated()
    warmup = WARMUP_STEPS
    if quantizer_name in BF16_CACHES:
        cache = DynamicCache(config=cfg) if quantizer_name == "bf16" else \
            StaticCache(config=cfg, max_cache_len=ctx + steps + STATIC_SLACK)
        fill_dynamic(cache, model, batch, ctx, dtype)
        make_step = eager_step(model, cache, batch, device)
        ms, mean_ms = time_steps(make_step, steps, device, warmup)
        split = profiled(make_step) if profile else {}
    else:
        quantizer, (_, frozen, graph, compiled) = make_quantizer(quantizer_name, cfg), row_engine(quantizer_name)
        steps, warmup = whole_pages(steps, quantizer, stagger) if device == "cuda" else (steps, warmup)   # CPU: a smoke run
        with install(model, quantizer, kernels="triton" if frozen else "auto") as seam:   # CPU: the interpreter
            cache = seam.new_cache()
            fill_three_region(cache, model, batch, ctx, dtype, stagger=stagger)
            graph = graph and device == "cuda"
            if frozen:
                make_step = static_step(model, cache, batch, steps + warmup, device, graph=graph,
                                        compile_step=compiled, graph_demotions=graph_demotions)
            else:
                make_step = eager_step(model, cache, batch, device)
            ms, mean_ms = time_steps(make_step, steps, device, warmup)
            split = profiled(make_step) if profile else {}
            if graph and quantizer.stores_codes:
                split["demotions"] = "graph" if graph_demotions else "eager"
                split["demotion_graphs"] = len(make_step.state.demotions.graphs) if graph_demotions else 0
            if stagger and quantizer.stores_codes:
                split["stagger"] = True
    allocated = (gpu_allocated() - before) if device == "cuda" else kv_bytes(cache)
    peaks = {name: round(mb * 2**20 / 1e9, 2) for name, mb in peak_memory_by_device().items()}
    row = {"quantizer": quantizer_name, "batch": batch, "ctx": ctx, "ms_per_step": round(ms, 3),
           "ms_per_step_mean": round(mean_ms, 3), "timed_steps": steps, "warmup_steps": warmup,
           "tokens_per_s": round(batch * 1e3 / mean_ms, 1), "kv_bytes_per_token": round(allocated / (batch * ctx), 1),
           "kv_bytes_counted_per_token": round(kv_bytes(cache) / (batch * ctx), 1),
           "peak_gb": round(sum(peaks.values()), 2) if device == "cuda" else None,
           **({"peak_gb_by_device": peaks} if len(peaks) > 1 else {}), **split}
    del cache
    return row


def gpu_allocated() -> int:
    """Bytes allocated now on every visible GPU together (0 without CUDA)."""
    if not torch.cuda.is_available():
        return 0
    return sum(torch.cuda.memory_allocated(i) for i in range(torch.cuda.device_count()))


def planned_kv_bytes(model, quantizer_name: str, batch: int, tokens: int) -> int:
    """Bytes of the row's KV cache at batch x tokens by the harness's memory plan (harness.memory_plan)."""
    work = Workload(batch=batch, tokens=tokens, dtype_bytes=2, reference_path=False, reserved=True)
    return sum(kv_per_layer(model.config, make_quantizer(quantizer_name, model.config), work))


def oom_row(model, quantizer_name: str, batch: int, ctx: int, steps: int, weights_bytes: int, err: Exception) -> dict:
    """The row of a configuration that ran out of memory: status=oom, the bytes it asks for (weights + its planned
    cache) against the GPUs' memory, and the allocator's first two sentences (the rest is advice on fragmentation)."""
    kv = planned_kv_bytes(model, quantizer_name, batch, ctx + steps)
    asked = weights_bytes + kv
    capacity = sum(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count())) \
        if torch.cuda.is_available() else None
    of = f" of the GPUs' {capacity / 1e9:.1f} GB" if capacity else ""
    allocator = ". ".join(str(err).splitlines()[0].split(". ")[:2]).rstrip(".")   # "CUDA out of memory. Tried to ..."
    reason = (f"asks about {asked / 1e9:.1f} GB{of} (weights {weights_bytes / 1e9:.1f} GB + KV cache "
              f"{kv / 1e9:.1f} GB at batch {batch} x {ctx + steps} tokens); {allocator}.")
    return {"quantizer": quantizer_name, "batch": batch, "ctx": ctx, "ms_per_step": None, "tokens_per_s": 0.0,
            "status": "oom", "asked_gb": round(asked / 1e9, 2), "error": reason}


def measure_or_oom(model, quantizer_name: str, batch: int, ctx: int, steps: int, device, dtype, weights_bytes: int,
                   profile: bool = False, graph_demotions: bool = True, stagger: bool = False) -> dict:
    """`measure`, or (the GPU ran out of memory) `oom_row`, so that a configuration that cannot fit ends its row,
    not the run."""
    try:
        return measure(model, quantizer_name, batch, ctx, steps, device, dtype, profile, graph_demotions, stagger)
    except torch.OutOfMemoryError as err:
        if device == "cuda":
            torch.cuda.empty_cache()
        return oom_row(model, quantizer_name, batch, ctx, steps, weights_bytes, err)


def copy_bandwidth(device, megabytes: int = 1024, repeats: int = 10) -> float:
    """Bytes moved per second (read + written) by a device-to-device copy of `megabytes`, the median of `repeats`."""
    src = torch.empty(megabytes * 2**20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(repeats + 1):                                  # the first copy warms up
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        dst.copy_(src)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return 2 * src.numel() / sorted(times[1:])[len(times[1:]) // 2]


def with_floor(row: dict, weights_bytes: int, bandwidth: float) -> dict:
    """The row plus floor_ms (weights + the cache's counted bytes, each read once per step, at `bandwidth`)
    and of_floor (floor_ms / ms_per_step: 1.0 would be the step at the memory's speed)."""
    if not row.get("ms_per_step"):
        return row
    cache_bytes = row["kv_bytes_counted_per_token"] * row["batch"] * row["ctx"]
    floor_ms = (weights_bytes + cache_bytes) / bandwidth * 1e3
    return {**row, "floor_ms": round(floor_ms, 3), "of_floor": round(floor_ms / row["ms_per_step"], 2)}


def max_batch(bytes_per_token: float, ctx: int, budget_gb: float, weights_bytes: int) -> int:
    """Sequences whose caches fit beside the weights (a budget taken from a row fits that row's batch exactly)."""
    return max(0, int((budget_gb * 1e9 - weights_bytes) / (bytes_per_token * ctx) + 1e-6))


def markdown(rows: list[dict], header: str) -> str:
    cols = list(dict.fromkeys(c for r in rows for c in r if not isinstance(r[c], list)))  # lists stay in the JSON
    lines = [header, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def budget_source(args) -> str:
    """Where the same-budget run's budget came from, as the table's heading says it."""
    return f"what {args.budget_from} at batch {args.batch[0]} holds" if args.budget_from else "--budget-gb"


def payload_weights(payload: dict) -> int:
    """The model's weight bytes: recorded since the tables are rebuilt from the JSON; in older runs the bytes that
    a row's floor_ms counts beside its cache (floor_ms is rounded to 1 us, so within a few MB)."""
    if "weights_bytes" in payload:
        return payload["weights_bytes"]
    row = next((r for r in payload["rows"] + payload.get("same_budget", []) if r.get("floor_ms")), None)
    if row is None:
        raise SystemExit("--from-json: the run records neither weights_bytes nor a row with a floor to derive them.")
    cache_bytes = row["kv_bytes_counted_per_token"] * row["batch"] * row["ctx"]
    return round(row["floor_ms"] / 1e3 * payload["copy_bandwidth_bytes_per_s"] - cache_bytes)


def tables(payload: dict) -> str:
    """The run's Markdown tables from its JSON payload alone: what a run prints last and --from-json prints."""
    rows, budget_rows = payload["rows"], payload.get("same_budget", [])
    cmd = "python scripts/bench_throughput.py " + " ".join(payload["argv"][1:])
    bandwidth = payload["copy_bandwidth_bytes_per_s"]
    out = [markdown(rows, f"### Decode step, {payload['model']} shapes, {payload['device']}, {payload['date']} "
                          f"(`{cmd}`); copy bandwidth {bandwidth / 1e12:.3f} TB/s")]
    if budget_rows:
        cap = payload.get("same_budget_cap", "?")
        capped = "" if all(map(at_budget_batch, budget_rows)) else \
            f"; rows below max_batch_in_budget (--same-budget-cap {cap}) get no throughput ratio"
        weights_gb = payload_weights(payload) / 1e9
        out += ["", markdown(budget_rows, f"### Same memory budget ({payload['budget_gb']:.1f} GB incl. "
                                          f"{weights_gb:.1f} GB weights: {payload.get('budget_source', '--budget-gb')})"
                                          f", ctx {budget_rows[0]['ctx']}{capped}")]
    return "\n".join(out)


def print_saved(paths: list[str]) -> None:
    """--from-json: each saved run's tables; no GPU, no model."""
    for i, path in enumerate(paths):
        try:
            payload = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise SystemExit(f"--from-json: no such file: {path}.") from None
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise SystemExit(f"--from-json: {path} is not JSON.") from None
        needed = {"rows", "argv", "model", "device", "date", "copy_bandwidth_bytes_per_s"}
        if not isinstance(payload, dict) or not needed <= payload.keys():
            raise SystemExit(f"--from-json: {path} is not a bench_throughput.py run (it lacks rows, argv, model, ...).")
        print(("\n" if i else "") + tables(payload))


def budget_from(rows: list[dict], row_name: str, ctx: int, weights: int) -> float:
    """GB that `row_name`'s first batch at `ctx` holds (weights + its cache as measured): the same-memory budget."""
    row = next((r for r in rows if r["quantizer"] == row_name and r["ctx"] == ctx and r.get("kv_bytes_per_token")),
               None)
    if row is None:
        raise SystemExit(f"--budget-from {row_name}: no measured row of it at ctx {ctx} (add it to --quantizers).")
    return (weights + row["kv_bytes_per_token"] * row["batch"] * ctx) / 1e9


def same_budget_rows(model, rows, quantizers, ctx: int, budget_gb: float, cap: int, args, device, dtype, weights,
                     bandwidth) -> list[dict]:
    """Each row name at the largest batch (up to `cap`) whose weights + measured cache fit `budget_gb` at `ctx`,
    with its throughput against each BF16 engine that ran, where both ran at their budget's batch (a row the cap
    held below it gets no ratio: that would not be a same-budget one)."""
    out = []
    for q in quantizers:
        per_token = next((r["kv_bytes_per_token"] for r in rows if r["quantizer"] == q and r["ctx"] == ctx
                          and r.get("kv_bytes_per_token")), None)
        fit = max_batch(per_token, ctx, budget_gb, weights) if per_token else 0
        run_batch = min(fit, cap)
        row = with_floor(measure_or_oom(model, q, run_batch, ctx, args.steps, device, dtype, weights,
                                        graph_demotions=not args.eager_demotions, stagger=args.stagger),
                         weights, bandwidth) \
            if run_batch else {"quantizer": q, "batch": 0, "ctx": ctx, "ms_per_step": None, "tokens_per_s": 0.0}
        out.append({**row, "max_batch_in_budget": fit})
        print("budget row:", json.dumps(out[-1]), flush=True)
    bases = (*BF16_CACHES, *(f"bf16{suffix}" for suffix in (GRAPH_SUFFIX, FROZEN_SUFFIX, GRAPH_SUFFIX + COMPILE_SUFFIX)))
    for base in bases:                                            # each BF16 that ran
        base_row = next((r for r in out if r["quantizer"] == base and r["tokens_per_s"]), None)
        for r in out:
            if base_row and at_budget_batch(base_row) and at_budget_batch(r):
                r[f"throughput_vs_{base}"] = round(r["tokens_per_s"] / base_row["tokens_per_s"], 2)
    return out


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3_4b", choices=MODELS)
    parser.add_argument("--tiny", action="store_true", help="tiny config on CPU (smoke test)")
    parser.add_argument("--gpus", type=int, default=1, help="split the model's layers over this many GPUs")
    parser.add_argument("--quantizers", default="bf16,bf16_static,naive_int2,kivi2,oscar")
    parser.add_argument("--ctx", type=positive_ints, default=[32768, 102400])
    parser.add_argument("--batch", type=positive_ints, default=[1, 8])
    parser.add_argument("--steps", type=positive_int, default=10)
    parser.add_argument("--budget-gb", type=float, default=70.0)
    parser.add_argument("--budget-from", default=None,
                        help="a row name: the budget is what its first batch at the longest ctx holds (weights + cache)")
    parser.add_argument("--same-budget-cap", type=int, default=64, help="largest batch tried in the same-budget run")
    parser.add_argument("--eager-demotions", action="store_true",
                        help="+graph rows demote pages eagerly between replays (the baseline of graphed demotions)")
    parser.add_argument("--stagger", action="store_true",
                        help="sequence b of a quantized cache b mod page_tokens tokens shorter: pages demoted in "
                             "different steps, as with short prompts of mixed lengths")
    parser.add_argument("--from-json", nargs="+", metavar="FILE", help="print saved runs' tables; no GPU, no model")
    parser.add_argument("--profile", action="store_true",
                        help="profile one decode step per row (CPU wall vs GPU time by kernel kind); skips the budget run")
    args = parser.parse_args()
    try:                                                          # a bad row name fails before the model is built
        check_rows(args.quantizers.split(","))
    except ValueError as err:
        parser.error(str(err))
    available = torch.cuda.device_count() if torch.cuda.is_available() and not args.tiny else 0
    if args.gpus > 1 and available < args.gpus:
        parser.error(f"--gpus {args.gpus}: this machine shows {available} GPU(s).")
    if args.budget_from and args.budget_from not in args.quantizers.split(","):
        parser.error(f"--budget-from {args.budget_from} must be one of --quantizers.")
    return args


def main() -> None:
    args = parse_args()
    if args.from_json:
        print_saved(args.from_json)
        return
    out = out_file("bench_throughput_profile.json" if args.profile else "bench_throughput.json")
    quantizers = args.quantizers.split(",")
    device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    name = "tiny" if args.tiny else args.model
    model = build_model(name, device, dtype, args.gpus)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    ctxs, batches = args.ctx, args.batch
    bandwidth = copy_bandwidth(device)
    print(f"copy bandwidth: {bandwidth / 1e12:.3f} TB/s (read + written)", flush=True)
    dev = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    dev = f"{args.gpus} x {dev}" if args.gpus > 1 else dev
    stamp, rows = datetime.date.today().isoformat(), []
    payload = {"device": dev, "date": stamp, "model": name, "argv": sys.argv, "copy_bandwidth_bytes_per_s": bandwidth,
               "weights_bytes": weights, "same_budget_cap": args.same_budget_cap,
               "placement": getattr(model, "hf_device_map", None), "budget_gb": None, "rows": rows,
               "same_budget": []}
    for c, b, q in [(c, b, q) for c in ctxs for b in batches for q in quantizers]:
        row = measure_or_oom(model, q, b, c, args.steps, device, dtype, weights, args.profile, not args.eager_demotions,
                             args.stagger)
        rows.append(with_floor(row, weights, bandwidth))
        print("row:", json.dumps({k: v for k, v in rows[-1].items() if not isinstance(v, list)}), flush=True)
        save(out, payload)
    budget_gb = budget_from(rows, args.budget_from, ctxs[-1], weights) if args.budget_from else args.budget_gb
    budget_rows = [] if args.profile else same_budget_rows(model, rows, quantizers, ctxs[-1], budget_gb,
                                                           args.same_budget_cap, args, device, dtype, weights, bandwidth)
    payload.update(budget_gb=budget_gb, budget_source=budget_source(args), same_budget=budget_rows)
    save(out, payload)
    print(tables(payload))

if __name__ == "__main__":
    main()

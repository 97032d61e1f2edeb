"""The memory plan of a cell, per device, made from the model's config before any weight loads.

    placement, plan = plan_cell(cfg, quantizer, device="cuda")
    print(plan.describe())                  # weights + KV cache + activations + reserve per device
    if plan.refusal(): raise ...            # one sentence naming the numbers

* weights: the parameters and buffers of a meta-device build of the model (exact), per device-map entry;
* KV cache at the cell's batch and context (prompt + generation budget), for the quantizer's layout: the
  full-precision sink + recent (+ one page) rows, the packed history at its stored bits per element (codes
  + scales/zeros) with the growth slack its buffers are allocated with (`harness/packed_history.py`; none for
  a generation task, whose history is created at prompt + budget: `harness.cache.reserve_history`), the
  dequantized mirror of the reference path (CPU), and sliding-window layers at the whole prompt (transformers'
  sliding layer keeps the prefill's rows until the first decode step);
* activations: an estimate of the largest transient of one decoder layer during a one-forward prefill, or of
  one chunk (task.prefill_chunk: plus the layer's cache read as full-precision K/V); with an explicit mask (several
  sequences, or a chunk on the CPU) also the mask, SDPA's float copy of it and K/V repeated per query head
  (residual stream, attention with the rotations' fp32 copies, the MLP), on every device holding layers,
  plus the logits (and OSCAR's calibration forward) on the lm_head's device;
* reserve: 1 GiB per GPU (CUDA context, cuBLAS workspace, allocator rounding); OSCAR's calibration capture
  (float64 q/k/v on the host) is counted on `cpu`.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from harness import placement as pl
from harness.quantizer import has_own_cache

GB = 1e9
CUDA_RESERVE = 2**30


@dataclass
class Workload:
    """What the cell holds at its peak: batch x tokens (prompt + generation) in the model's dtype."""

    batch: int
    tokens: int
    dtype_bytes: int
    reference_path: bool      # the PyTorch reference keeps a dequantized mirror of the history
    prefill_chunk: int | None = None   # tokens per prefill forward (task.prefill_chunk); None: the whole prompt
    reserved: bool = False    # the packed history is created at `tokens` (a generation task), not grown by doubling
    gpu_prefill: bool = False  # the seam's GPU prefill: no float copy of a mask nor K/V per query head (it attends
                               # sequence by sequence), and one sequence's later chunks have no mask (harness.seam)
    packed_history: bool = False  # a chunk decodes a packed history through fp32 (kernel path; the reference path
                                  # reads its dequantized mirror)
    padding_mask: bool = True     # a padded batch's prefill builds transformers' [B, 1, q, T] bool mask (not on the
                                  # GPU over the seam's own cache: its padding rows alone, harness.seam.kvq_mask)
    stored_prefill: bool = False  # `prefill_attends_quantized` over a quantizing cache: a one-forward prefill reads
                                  # its history as stored too (harness.seam.prefill_operands)


@dataclass
class DevicePlan:
    weights: int = 0
    kv: int = 0
    activations: int = 0
    reserve: int = 0
    budget: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.activations + self.reserve


@dataclass
class MemoryPlan:
    devices: dict[str, DevicePlan]
    layer_devices: list[str]
    device_map: dict[str, str] | None      # None: no placement fits the devices
    notes: list[str] = field(default_factory=list)
    capture: int = 0                       # host bytes of OSCAR's calibration capture (in cpu's reserve)

    def refusal(self) -> str | None:
        """One sentence naming the numbers when a device cannot hold its part, else None."""
        over = [(d, p) for d, p in self.devices.items() if p.total > p.budget]
        if self.device_map is not None and not over:
            return None
        if self.device_map is None:
            plans, where = list(self.devices.values()), f"{', '.join(self.devices)} together"
        else:
            device, worst = max(over, key=lambda item: item[1].total - item[1].budget)
            plans, where = [worst], device
        need, have = sum(p.total for p in plans), sum(p.budget for p in plans)
        advice = ("a smaller quantizer.calibration.budget or precomputed rotations (quantizer.rotation_dir)"
                  if where == "cpu" and self.capture else "more GPUs (device_map=auto, +model.gpus=N on SLURM), a "
                  "shorter ctx, a smaller batch or a quantized KV cache")
        return (f"This cell needs {need / GB:.1f} GB on {where} ({self.parts(plans)}) but has {have / GB:.1f} GB, "
                f"so it was refused before loading any weights; give it {advice}.")

    @staticmethod
    def parts(plans) -> str:
        plans = list(plans)
        total = {name: sum(getattr(p, name) for p in plans) for name in ("weights", "kv", "activations", "reserve")}
        return (f"weights {total['weights'] / GB:.1f} + KV cache {total['kv'] / GB:.1f} + activations "
                f"~{total['activations'] / GB:.1f} + reserve {total['reserve'] / GB:.1f} GB")

    def describe(self) -> str:
        lines = [f"  {d}: {self.parts([p])} = {p.total / GB:.1f} GB of {p.budget / GB:.1f} GB"
                 + (f" (layers {_span(self.layer_devices, d)})" if d in self.layer_devices else "")
                 for d, p in self.devices.items()]
        return "\n".join(["[memory plan]", *lines, *(f"  note: {n}" for n in self.notes)])

    def as_row(self) -> dict:
        """GB per device (the rows' `run.memory_plan`)."""
        return {d: {k: round(getattr(p, k) / GB, 3) for k in ("weights", "kv", "activations", "reserve", "total",
                                                             "budget")}
                for d, p in self.devices.items()}


def _span(layer_devices: list[str], device: str) -> str:
    idx = [i for i, d in enumerate(layer_devices) if d == device]
    return f"{idx[0]}-{idx[-1]}"


# ----------------------------------------------------------------------------- bytes of one part
def model_head_dim(config) -> int:
    """The attention head_dim of a transformers config (explicit, or hidden_size / heads)."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def shape_of(config) -> dict:
    heads = config.num_attention_heads
    return {"hidden": config.hidden_size, "intermediate": config.intermediate_size, "heads": heads,
            "kv_heads": getattr(config, "num_key_value_heads", None) or heads,
            "head_dim": model_head_dim(config), "vocab": config.vocab_size}


def layer_kinds(config) -> list[str]:
    types = getattr(config, "layer_types", None)
    return list(types) if types else ["full_attention"] * config.num_hidden_layers


def spec_bits(spec, head_dim: int) -> float:
    """Stored bits per element of one quantized tensor: codes + scales/zeros (a spec that keeps its own
    accounting, such as a non-uniform format's, gives it itself)."""
    from kernels.format import bits_per_element
    own = getattr(spec, "bits_per_element", None)
    return float(own()) if callable(own) else bits_per_element(spec, head_dim)


def layer_quantizer(quantizer, layer_idx: int, num_layers: int):
    """The quantizer that stores one layer (a quantizer may leave some layers in full precision)."""
    for_layer = getattr(quantizer, "for_layer", None)
    return for_layer(layer_idx, num_layers) if callable(for_layer) else quantizer


def layer_kv_bytes(config, quantizer, kind: str, work: Workload) -> int:
    """Bytes of one layer's KV cache at the workload's peak (module docstring)."""
    from harness.packed_history import grown_rows
    shape = shape_of(config)
    row = work.batch * shape["kv_heads"] * shape["head_dim"]               # elements per token per tensor
    fp_bytes = row * work.dtype_bytes
    if kind == "sliding_attention" or not quantizer.stores_codes or has_own_cache(quantizer):
        return 2 * work.tokens * fp_bytes
    sink = work.tokens if quantizer.sink_tokens is None else quantizer.sink_tokens
    fp_rows = min(work.tokens, sink + quantizer.recent_tokens + quantizer.page_tokens)
    held = max(work.tokens - fp_rows, 0)
    if held and not work.reserved:
        held = grown_rows(held)
    total = 0
    for spec in (quantizer.key_spec, quantizer.value_spec):
        if spec is None:
            total += work.tokens * fp_bytes
            continue
        total += fp_rows * fp_bytes + int(held * row * spec_bits(spec, shape["head_dim"]) / 8)
        total += held * fp_bytes if work.reference_path else 0
    return total


def kv_per_layer(config, quantizer, work: Workload) -> list[int]:
    """Bytes of each layer's KV cache, through the quantizer that stores that layer."""
    kinds = layer_kinds(config)
    return [layer_kv_bytes(config, layer_quantizer(quantizer, i, len(kinds)), kind, work)
            for i, kind in enumerate(kinds)]


def is_chunked(work: Workload) -> bool:
    """The prompt is prefilled in several forwards (a chunk at least as long as it is one forward)."""
    return work.prefill_chunk is not None and work.prefill_chunk < work.tokens


def activation_bytes(config, work: Workload) -> int:
    """Largest transient of one decoder layer in a prefill forward (an estimate): of the whole prompt, or of one
    chunk, which also reads the layer's whole cache as full-precision K/V (under `prefill_attends_quantized` a
    one-forward prefill too: the rows as stored, in place of its own, decoding the packed history on the kernel path).

    With an explicit mask (several sequences, which may be padded; a chunk on the CPU; one whole sequence gets
    SDPA's causal flag, and on the GPU its chunks too) the forward holds the [B, q, T] bool mask (not on the GPU over
    the seam's own cache, which gets each sequence's padding rows alone), and on the CPU transformers' SDPA path the
    float copy SDPA makes of it and K/V repeated per query head (repeat_kv; on the GPU the seam attends sequence by
    sequence, `harness.seam.padded_causal_sdpa`). H100 allocator traces in results/bench/prefill_memory.md: four
    hidden-size tensors live at a chunk's MLP peak; the packed history is decoded one sequence and KV head at a time
    (three fp32 temporaries of that size; of the whole history before, 6.4 GB at 4 x 128k)."""
    s, shape = work.dtype_bytes, shape_of(config)
    chunked = is_chunked(work)
    tokens = work.batch * (work.prefill_chunk if chunked else work.tokens)
    residual = 4 * tokens * shape["hidden"] * s          # embeddings, the residual, its norm, the layer's input
    attention = tokens * shape["head_dim"] * (shape["heads"] * (8 + 2 * s) + shape["kv_heads"] * (4 * s + 8))
    history = work.batch * work.tokens * shape["head_dim"] * s                   # one head's K or V, every token
    if chunked:
        attention += 2 * shape["kv_heads"] * history                             # the cache read as fp K / V
    if (chunked or work.stored_prefill) and work.packed_history:   # decoding one sequence's K or V of one KV head:
        attention += 3 * work.tokens * shape["head_dim"] * 4                    # three fp32 temporaries of its size
    if (work.batch > 1 and work.padding_mask) or (chunked and not work.gpu_prefill):
        mask = 1 if work.gpu_prefill else 1 + s             # the bool mask (+ SDPA's float copy: not on the GPU)
        attention += mask * tokens * work.tokens
        repeats = shape["heads"] > shape["kv_heads"] and not work.gpu_prefill    # repeat_kv
        attention += 2 * shape["heads"] * history if repeats else 0
    mlp = 3 * tokens * shape["intermediate"] * s
    return residual + max(attention, mlp)


def logits_bytes(config, quantizer, work: Workload) -> int:
    """Last-position logits of a generation step, or the full logits of OSCAR's calibration forward."""
    vocab = shape_of(config)["vocab"]
    calibration = getattr(quantizer, "calibration", None)
    seq = int(calibration.get("seq_len", 2048)) if calibration and not getattr(quantizer, "rotation_dir", None) else 0
    return max(work.batch, seq) * vocab * (work.dtype_bytes + 4)


def capture_bytes(config, quantizer) -> int:
    """Host bytes of OSCAR's calibration capture: float64 q, k, v of `budget` tokens per layer."""
    calibration = getattr(quantizer, "calibration", None)
    if not calibration or getattr(quantizer, "rotation_dir", None):
        return 0
    shape = shape_of(config)
    per_token = (shape["heads"] + 2 * shape["kv_heads"]) * shape["head_dim"] * 8
    return int(calibration.get("budget", 20000)) * per_token * config.num_hidden_layers


# ----------------------------------------------------------------------------- the plan
def plan_memory(config, quantizer, work: Workload, sizes: dict[str, int], layout: pl.Layout,
                device_map: dict[str, str] | None, budgets: dict[str, int]) -> MemoryPlan:
    """Per-device bytes for a device map (None: no split fits; the plan then sums over the devices)."""
    kv = kv_per_layer(config, quantizer, work)
    where = device_map or {"": next(iter(budgets))}
    layer_devs = pl.layer_devices(where, layout)
    plans = {d: DevicePlan(budget=budgets.get(d, 0)) for d in dict.fromkeys([*budgets, *pl.devices_in(where)])}
    for name, size in sizes.items():
        plans[pl.owner(where, name)].weights += size
    for device, layer_kv in zip(layer_devs, kv):
        plans[device].kv += layer_kv
    for device in set(layer_devs):
        plans[device].activations += activation_bytes(config, work)
    lm_head = "lm_head" if "lm_head" in sizes else (layout.tail or layout.head)[-1]
    plans[pl.owner(where, lm_head)].activations += logits_bytes(config, quantizer, work)
    for device, plan in plans.items():
        plan.reserve = CUDA_RESERVE if device.startswith("cuda") else 0
    host = capture_bytes(config, quantizer)
    if host:
        plans.setdefault("cpu", DevicePlan(budget=budgets.get("cpu") or pl.device_budget("cpu"))).reserve += host
    prefill = f"prefill chunks of {work.prefill_chunk} tokens" if is_chunked(work) else "a one-forward prefill"
    notes = [f"KV cache for {quantizer.name} at batch {work.batch} x {work.tokens} tokens; "
             f"activations estimated for {prefill}"]
    if host:
        notes.append(f"cpu reserve includes {host / GB:.1f} GB of OSCAR calibration capture (float64 q/k/v)")
    return MemoryPlan(plans, layer_devs, device_map, notes, host)


def auto_device_map(config, quantizer, work: Workload, sizes: dict[str, int], layout: pl.Layout,
                    budgets: dict[str, int]) -> dict[str, str] | None:
    """Layers in order over the devices, each device keeping room for its reserve and one layer's activations."""
    kv = kv_per_layer(config, quantizer, work)
    act = activation_bytes(config, work) + logits_bytes(config, quantizer, work)
    limits = {d: b - act - (CUDA_RESERVE if d.startswith("cuda") else 0) for d, b in budgets.items()}
    items = [(n, sizes[n]) for n in layout.head] + [(n, sizes[n] + k) for n, k in zip(layout.layers, kv)]
    return pl.split(items + [(n, sizes[n]) for n in layout.tail], limits)


def cell_workload(cfg, device: str, use_kernels: bool) -> Workload:
    """Batch and tokens (prompt + generation budget) of a cell, in its model's dtype. A task with a generation
    budget (max_new_tokens) generates through harness.generate, which reserves the history at that size."""
    from harness.models import model_dtype
    tokens = int(cfg.ctx.tokens) + int(cfg.task.get("max_new_tokens", 0) or 0)
    dtype = model_dtype(cfg.model)
    chunk = cfg.task.get("prefill_chunk")
    return Workload(int(cfg.task.get("batch_size", 1) or 1), tokens, torch.finfo(dtype).bits // 8, not use_kernels,
                    int(chunk) if chunk else None, reserved="max_new_tokens" in cfg.task,
                    gpu_prefill=device.startswith("cuda"))


def requested_devices(cfg, device: str) -> tuple[str, list[str] | dict]:
    """('single', [device]) | ('auto', visible GPUs) | ('explicit', the map): from device_map and model.gpus."""
    device_map = cfg.get("device_map")
    gpus = int(cfg.model.get("gpus", 1) or 1)
    if device_map is None and gpus <= 1:
        return "single", [pl.device_of(device)]
    if device_map is None or device_map == "auto":
        return "auto", pl.visible_devices()
    if isinstance(device_map, str):
        raise ValueError(f"device_map must be null, auto or a mapping of module names to devices, got '{device_map}'.")
    from omegaconf import OmegaConf
    return "explicit", {str(k): pl.device_of(v) for k, v in OmegaConf.to_container(device_map).items()}


def plan_cell(cfg, quantizer, device: str, use_kernels: bool, budgets: dict[str, int] | None = None,
              config=None) -> MemoryPlan:
    """Placement and memory plan of a cell from its configs alone (the quantizer is checked on the config);
    `config`: the model's transformers config where the caller has read it already (else `model_config`)."""
    from harness.models import model_config, model_dtype
    from harness.random_model import meta_model
    config = model_config(cfg.model) if config is None else config
    quantizer.check(config)
    work = replace(cell_workload(cfg, device, use_kernels), packed_history=use_kernels and quantizer.stores_codes,
                   padding_mask=not device.startswith("cuda") or has_own_cache(quantizer),
                   stored_prefill=quantizer.prefill_attends_quantized and quantizer.stores_codes)
    meta = meta_model(config, model_dtype(cfg.model))
    layout = pl.module_layout(meta)
    sizes = pl.module_bytes(meta, layout.head + layout.layers + layout.tail)
    mode, devices = requested_devices(cfg, device)
    listed = pl.devices_in(devices) if mode == "explicit" else devices
    budgets = budgets or pl.budgets(listed, cfg.get("max_memory"))
    if mode == "single":
        device_map = {"": devices[0]}
    elif mode == "auto":
        device_map = auto_device_map(config, quantizer, work, sizes, layout, budgets)
    else:
        device_map = devices
    plan = plan_memory(config, quantizer, work, sizes, layout, device_map, budgets)
    gpus = int(cfg.model.get("gpus", 1) or 1)
    if mode == "auto" and gpus > len(devices):
        plan.notes.append(f"model.gpus={gpus} but {len(devices)} device(s) visible: placed over {', '.join(devices)}")
    return plan

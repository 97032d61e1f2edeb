"""Where a model's parts live: one device, or a layer-wise split over several (transformers' `device_map`).

    layout = module_layout(meta)                          # head | decoder layers | tail module names
    device_map = split(items, {"cuda:0": 70e9, ...})      # module name -> device, in layer order
    with on_device(torch.device("cuda:1")): launch()      # Triton launches on the tensors' own GPU

A device map names the embedding and everything computed before the layers (RoPE) as the head, each
decoder layer on its own, and the final norm and lm_head as the tail (an lm_head tied to the embedding goes
with the head: tied weights share one device). `device_map: auto` splits them in order over the visible
GPUs, as evenly as the layers allow within each budget (harness/memory_plan.py gives the costs: weights
plus each layer's KV cache); transformers (`from_pretrained(device_map=...)`) or `dispatch` then put each
part straight on its device, and accelerate's hooks carry the activations from device to device.
"""
from __future__ import annotations

import math
import re
from contextlib import nullcontext
from dataclasses import dataclass

import torch

LAYERS, TAIL = "layers", ("norm",)


@dataclass
class Layout:
    """Module names of a causal LM in forward order, for a device map."""

    head: list[str]       # embedding, RoPE, anything the layers need first
    layers: list[str]     # decoder layers, in order
    tail: list[str]       # final norm, lm_head (unless tied to the embedding)


def module_layout(model: torch.nn.Module) -> Layout:
    """Head / layers / tail module names of a transformers causal LM (works on a meta-device model)."""
    prefix = getattr(model, "base_model_prefix", "model")
    base = getattr(model, prefix)
    head, layers, tail = [], [], []
    for name, _ in base.named_children():
        full = f"{prefix}.{name}"
        if name == LAYERS:
            layers = [f"{full}.{i}" for i in range(len(getattr(base, name)))]
        else:
            (tail if name in TAIL else head).append(full)
    for name, child in model.named_children():
        if name == prefix:
            continue
        tied = any(p is q for p in child.parameters() for q in base.parameters())
        (head if tied or name != "lm_head" else tail).append(name)
    return Layout(head, layers, tail)


def module_bytes(model: torch.nn.Module, names: list[str]) -> dict[str, int]:
    """Bytes of parameters and buffers under each module name (a tensor shared by several counts once, first)."""
    seen, out = set(), {}
    for name in names:
        total = 0
        for tensor in [*model.get_submodule(name).parameters(), *model.get_submodule(name).buffers()]:
            if id(tensor) not in seen:
                seen.add(id(tensor))
                total += tensor.numel() * tensor.element_size()
        out[name] = total
    return out


def device_of(name: str) -> str:
    """A device name in one spelling: 'cuda' -> 'cuda:0', 0 -> 'cuda:0', 'cpu' -> 'cpu'."""
    if isinstance(name, int) or str(name).isdigit():
        return f"cuda:{int(name)}"
    return "cuda:0" if str(name) == "cuda" else str(name)


def split(items: list[tuple[str, int]], limits: dict[str, int]) -> dict[str, str] | None:
    """Spread named costs in order over the devices, as evenly as the items allow, each within its limit.

    items: (module name, bytes it brings) in forward order; limits: device -> bytes it may take. Returns
    module -> device, or None when the devices cannot hold everything. The cap on every device's load is
    the smallest that still places everything (a binary search: a larger cap never places less).
    """
    if _sequential(items, limits) is None:
        return None
    low, high = math.ceil(sum(c for _, c in items) / len(limits)), max(limits.values())
    while low < high:
        cap = (low + high) // 2
        if _sequential(items, {d: min(limit, cap) for d, limit in limits.items()}) is None:
            low = cap + 1
        else:
            high = cap
    return _sequential(items, {d: min(limit, low) for d, limit in limits.items()})


def _sequential(items: list[tuple[str, int]], limits: dict[str, int]) -> dict[str, str] | None:
    """Fill the devices in order, moving on when the next item does not fit; None if they run out."""
    devices, out, used, index = list(limits), {}, 0, 0
    for name, cost in items:
        while used + cost > limits[devices[index]]:
            index, used = index + 1, 0
            if index == len(devices):
                return None
        out[name], used = devices[index], used + cost
    return out


def devices_in(device_map: dict[str, str]) -> list[str]:
    """The devices a device map uses, in first-use order."""
    return list(dict.fromkeys(device_of(d) for d in device_map.values()))


def owner(device_map: dict[str, str], name: str) -> str:
    """The device of module `name`: the longest device-map entry that contains it ("" contains everything)."""
    owners = [key for key in device_map if key == "" or name == key or name.startswith(key + ".")]
    if not owners:
        raise ValueError(f"The device map places no device for {name} (it must place whole decoder layers).")
    return device_of(device_map[max(owners, key=len)])


def layer_devices(device_map: dict[str, str], layout: Layout) -> list[str]:
    """The device of each decoder layer."""
    return [owner(device_map, layer) for layer in layout.layers]


def parse_bytes(size) -> int:
    """'70GiB', '80GB', '512MiB' or a number of bytes -> bytes."""
    match = re.fullmatch(r"\s*([\d.]+)\s*([KMGT]?)(i?)B?\s*", str(size), flags=re.IGNORECASE)
    if not match:
        raise ValueError(f"max_memory value {size!r} is not a size like '70GiB', '80GB' or a number of bytes.")
    number, unit, binary = match.groups()
    power = "KMGT".find(unit.upper()) + 1 if unit else 0
    return int(float(number) * (1024 if binary or not unit else 1000) ** power)


def visible_devices() -> list[str]:
    """The GPUs this process may use (CUDA_VISIBLE_DEVICES: on SLURM, the job's), or the CPU."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return [f"cuda:{i}" for i in range(count)] or ["cpu"]


def device_budget(device: str) -> int:
    """Bytes a device can give this cell now: free GPU memory, or the host's available memory."""
    if device.startswith("cuda"):
        return torch.cuda.mem_get_info(torch.device(device))[0]
    with open("/proc/meminfo") as fh:
        fields = dict(line.split(":", 1) for line in fh)
    return int(fields["MemAvailable"].split()[0]) * 1024


def budgets(devices: list[str], max_memory: dict | None) -> dict[str, int]:
    """device -> bytes: `max_memory` where it names the device, else what the device has free."""
    given = {device_of(k): parse_bytes(v) for k, v in (max_memory or {}).items()}
    return {d: given[d] if d in given else device_budget(d) for d in devices}


def on_device(device: torch.device):
    """Make a CUDA tensor's own GPU current (Triton launches on the current device); nothing elsewhere."""
    return torch.cuda.device(device) if device.type == "cuda" else nullcontext()


def dispatch(model: torch.nn.Module, device_map: dict[str, str]) -> torch.nn.Module:
    """Hooks that carry activations between the devices of a model placed over several (accelerate), on the
    device map's blocks only (`block_hooks_only`)."""
    if len(devices_in(device_map)) > 1:
        from accelerate import dispatch_model
        dispatch_model(model, device_map=device_map, main_device=devices_in(device_map)[0])   # inputs stay put
    model.hf_device_map = dict(device_map)
    return block_hooks_only(model, device_map)


def block_hooks_only(model: torch.nn.Module, device_map: dict[str, str]) -> torch.nn.Module:
    """Remove the hooks accelerate's dispatch puts on every module inside a block of the device map (it hooks each
    submodule with parameters, `attach_execution_device_hook`). A block's own hook brings its inputs to its device,
    where all its parameters are, so an inner hook moves nothing; its wrapped forward, an instance attribute, would
    hide the module from what swaps forwards for a step (harness.compiled_step). The blocks keep theirs: a decoder
    layer's hook also moves the tensors every layer is handed (RoPE's cos and sin) to its device. Hooks that load
    offloaded weights (a block mapped to "cpu" or "disk" beside GPUs) stay."""
    if len(devices_in(device_map)) < 2:
        return model
    from accelerate.hooks import AlignDevicesHook, remove_hook_from_module
    for block_name in device_map:
        block = model.get_submodule(block_name)
        for name, module in block.named_modules(prefix=block_name):
            hook = getattr(module, "_hf_hook", None)
            if (name != block_name and name not in device_map and type(hook) is AlignDevicesHook
                    and not hook.offload):
                remove_hook_from_module(module)          # leaves the class's forward bound on the instance
                if getattr(vars(module).get("forward"), "__func__", None) is type(module).forward:
                    del module.forward
    return model

"""Random weights with a real model's shape (`model.source=random`): dry runs for speed, memory and placement.

    config = shape_config(Path("configs/model/shapes/qwen3_8b.json"))   # config.json shape fields
    model = meta_model(config, torch.bfloat16)                           # no storage anywhere yet
    materialize(model, {"": "cuda:0"}, seed=0)                           # allocated and drawn on its devices

The model is built on the meta device, then each entry of the device map is allocated where it belongs
(`to_empty`) and drawn there by transformers' own initializer (normal weights, unit norms, the real RoPE
buffers), so no full copy of the weights ever exists in host memory.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent


def shape_file(shape: str | None, model_name: str) -> Path:
    """The shape file a model config names (a path relative to the repository root, or absolute)."""
    if not shape:
        raise ValueError(f"Model '{model_name}' has no `shape:` file, so model.source=random cannot build it "
                         f"(give it one: +model.shape=configs/model/shapes/<name>.json).")
    path = Path(shape) if Path(shape).is_absolute() else REPO_ROOT / shape
    if not path.is_file():
        raise FileNotFoundError(f"Shape file '{path}' of model '{model_name}' does not exist.")
    return path


def shape_fields(path: Path) -> dict:
    """config.json fields of a shape file, less its notes (keys starting with `_`)."""
    fields = json.loads(Path(path).read_text())
    return {key: value for key, value in fields.items() if not key.startswith("_")}


def shape_config(path: Path):
    """A transformers config from a shape file (its `model_type` picks the config class)."""
    from transformers import AutoConfig
    fields = shape_fields(path)
    return AutoConfig.for_model(fields.pop("model_type"), **fields)


def meta_model(config, dtype: torch.dtype) -> torch.nn.Module:
    """The causal LM of `config` with every parameter and buffer on the meta device (no storage)."""
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")


def materialize(model: torch.nn.Module, device_map: dict[str, str], seed: int) -> torch.nn.Module:
    """Allocate each device-map entry of a meta model on its device, then draw the weights there.

    device_map: module name -> device ("" = the whole model). Raises ValueError naming what it left on meta.
    """
    for name, device in device_map.items():
        model.get_submodule(name).to_empty(device=device)
    left = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise ValueError(f"The device map places no device for {left[0]} (and {len(left) - 1} more tensors).")
    for module in model.modules():
        module.__dict__.pop("_is_hf_initialized", None)     # set by from_config; initialize_weights skips such modules
    torch.manual_seed(seed)
    model.initialize_weights()              # weights, norms and the RoPE buffers, on the devices they sit on
    model.tie_weights()                     # to_empty gave tied parameters storages of their own
    return model.eval()

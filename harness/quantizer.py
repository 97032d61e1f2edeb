"""The `KVQuantizer` interface, and building a quantizer (or any class) from a config's `_target_`.

A quantizer is data plus small functions: how K and V are stored (a `QuantSpec` each, or None for
full precision; a quantizer with a format of its own overrides quantize / dequantize and names its kernels
with `kernel_ops`), the full-precision window sizes (sink / recent / demotion page), optional
rotations (R_K applied to q and k after RoPE; R_V folded into v_proj and undone on the attention
output), and `bits_per_element(ctx)`. The cache (harness/cache.py) and the seam (harness/seam.py) are
shared by every quantizer, so a new method is one small module plus one YAML. The registry is the
folder configs/quantizer: each YAML names its class with `_target_` and gives its options.
"""
from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from typing import Any

import torch

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs" / "quantizer"


def has_own_cache(quantizer) -> bool:
    """Whether `quantizer` brings a cache of its own (`build_cache`, e.g. transformers' QuantizedCache) instead of
    the seam's three-region layers."""
    return hasattr(quantizer, "build_cache")


class KVQuantizer:
    """Identity-by-default base class; subclasses override what they change."""

    name = "base"
    key_spec: Any = None            # kernels.format.QuantSpec | None (None = keep full precision)
    value_spec: Any = None
    sink_tokens: int | None = None  # None = unbounded: every token stays full precision (identity)
    recent_tokens: int = 0
    page_tokens: int = 8            # demotion granularity during decode (METHOD_OSCAR §7.3)
    metadata_bits: int = 16         # bits of one scale or zero as stored
    rotation_dtype: str = "float32"  # runtime rotations in fp32, or "model": in the activations' dtype (as released)
    chunk_keeps_recent: bool = True  # a non-final prefill chunk keeps its recent window in full precision; False:
                                     # every token past the sink is quantized, as the release's server (§7.2)
    prefill_attends_quantized: bool = False  # a prefill chunk attends to K/V as the cache stores them (sink and recent
                                             # rows in full precision, the rest through the quantizer); False: to its
                                             # own rows in full precision (serving semantics, OSCAR's protocol)

    def __init__(self, name: str | None = None, chunk_keeps_recent: bool = True,
                 prefill_attends_quantized: bool = False, **options):
        self.options = options
        self.chunk_keeps_recent = boolean_option("chunk_keeps_recent", chunk_keeps_recent)
        self.prefill_attends_quantized = boolean_option("prefill_attends_quantized", prefill_attends_quantized)
        if name:
            self.name = name

    # ---------------------------------------------------------------- lifecycle
    def validate(self) -> None:
        """Raise ValueError (one sentence) for options that no model can run with; called before any weights load.

        Subclasses extend it (calling super().validate()): the one `harness.pipeline.validate` pass of a cell."""
        check_windows(self.name, self.sink_tokens, self.recent_tokens, self.page_tokens)
        check_prefill_semantics(self)

    def check(self, model_config) -> None:
        """Raise ValueError (one sentence) if this quantizer cannot run on the model; called before weights load."""

    def prepare(self, model, tokenizer) -> None:
        """Calibrate / build rotations once the model is loaded (no-op for data-free quantizers)."""

    # ---------------------------------------------------------------- rotations
    def key_rotation(self, layer_idx: int) -> torch.Tensor | None:
        """R_K [D, D] applied as k @ R_K and q @ R_K after RoPE, or None."""
        return None

    def value_rotation(self, layer_idx: int) -> torch.Tensor | None:
        """R_V [D, D]: v_proj is folded so v' = v @ R_V, and the attention output is mapped back by R_V^T."""
        return None

    def for_layer(self, layer_idx: int, num_layers: int) -> "KVQuantizer":
        """The quantizer that stores layer `layer_idx` of `num_layers`: this one, unless a subclass leaves some
        layers in full precision (TurboQuant's `skip_boundary_layers` returns the identity for those)."""
        return self

    def key_offset(self, layer_idx: int) -> torch.Tensor | None:
        """[H_kv, D] subtracted from every stored key (after R_K), or None.

        Exact for attention: q.(k - m) = q.k - q.m shifts every logit of a query row by the same amount,
        and softmax ignores that; only the quantizer sees the centred keys.
        """
        return None

    # ---------------------------------------------------------------- storage
    @property
    def stores_codes(self) -> bool:
        return self.key_spec is not None or self.value_spec is not None

    def quantize(self, x: torch.Tensor, spec):
        from kernels.format import quantize
        return quantize(x, spec)

    def dequantize(self, qt) -> torch.Tensor:
        from kernels.format import dequantize
        return dequantize(qt)

    def kernel_ops(self):
        """The Triton kernels of the format `quantize` stores (kernels/ops.py: write, part shapes, decode): the
        affine format's, unless a subclass that overrides quantize / dequantize names its own (TurboQuant)."""
        from kernels.ops import AFFINE
        return AFFINE

    def bits_per_element(self, ctx: int) -> float:
        """Average stored bits per K/V element at context `ctx`, counting codes, metadata and full-precision windows."""
        return 16.0

    def artifacts(self) -> dict[str, str]:
        """Digest of each file or text this quantizer was built from (recorded in the rows); none by default."""
        return {}

    def describe(self) -> dict:
        return {"name": self.name, "sink": self.sink_tokens, "recent": self.recent_tokens, **self.options}


def boolean_option(name: str, value) -> bool:
    """A true/false quantizer option as given (a string such as "yes" from the command line is refused in one
    sentence, where bool() would read it as true)."""
    if not isinstance(value, bool):
        raise ValueError(f"quantizer option {name} must be true or false, got {value!r}.")
    return value


def check_prefill_semantics(quantizer: KVQuantizer) -> None:
    """`prefill_attends_quantized` where the seam's cache can honour it: a chunk attends to its layer's rows as
    stored once it is written, which a non-final chunk under `chunk_keeps_recent=False` does not know yet (the next
    chunk quantizes its recent window), and a quantizer with a cache of its own (transformers' QuantizedCache)
    prefills through that cache, not the seam's."""
    if not quantizer.prefill_attends_quantized:
        return
    if not quantizer.chunk_keeps_recent:
        raise ValueError(f"{quantizer.name}: prefill_attends_quantized=true needs chunk_keeps_recent=true (with false "
                         f"a non-final prefill chunk's stored rows are not known while it attends).")
    if has_own_cache(quantizer):
        raise ValueError(f"{quantizer.name}: prefill_attends_quantized=true is not supported by a quantizer with its "
                         f"own cache (its prefill attends in full precision).")


def check_windows(name: str, sink: int | None, recent: int, page: int) -> None:
    """Window sizes the cache can honour: sink/recent >= 0, page >= 1, recent a whole number of pages."""
    if (sink is not None and sink < 0) or recent < 0:
        raise ValueError(f"{name}: sink and recent must be >= 0, got sink={sink}, recent={recent}.")
    if page < 1:
        raise ValueError(f"{name}: page must be >= 1, got {page}.")
    if recent % page:
        raise ValueError(f"{name}: recent ({recent}) must be a multiple of the demotion page ({page}).")


def known_quantizers() -> list[str]:
    """Every quantizer with a config file in configs/quantizer (the registry is that folder)."""
    return sorted(path.stem for path in CONFIG_DIR.glob("*.yaml"))


def locate(target: str, what: str) -> type:
    """The class a config's `_target_` names ("package.module.Class"), or ValueError in one sentence."""
    module_name, _, attr = str(target).rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as err:
        raise ValueError(f"{what} names _target_ '{target}', which cannot be imported ({err}).") from None


def instantiate(options: dict, what: str):
    """The `_target_` class of a config node (a plain dict) built with the node's other keys; ValueError in one
    sentence when the target is missing or cannot be imported."""
    options = dict(options)
    target = options.pop("_target_", None)
    if not target:
        raise ValueError(f"{what} config '{options.get('name')}' has no _target_ naming its class.")
    cls = locate(target, f"{what} '{options.get('name')}'")
    try:
        return cls(**options)
    except (TypeError, ZeroDivisionError) as err:   # an option the class does not take, a zero size, ...
        raise ValueError(f"{what} '{options.get('name')}' cannot be built from its options ({err}).") from None


def quantizer_from_config(options: dict) -> KVQuantizer:
    """Instantiate the quantizer a config node describes: its `_target_` class with the other keys as options;
    a key that no `__init__` of the class takes (a misspelt `+quantizer.x=...`) is refused in one sentence."""
    target = options.get("_target_")
    if target:
        taken = init_options(locate(target, f"Quantizer '{options.get('name')}'"))
        unknown = sorted(set(options) - {"_target_"} - taken)
        if unknown:
            raise ValueError(f"Quantizer '{options.get('name')}' has no option {', '.join(map(repr, unknown))}; "
                             f"it takes: {', '.join(sorted(taken))}.")
    return instantiate(options, "Quantizer")


def init_options(cls) -> set[str]:
    """The named parameters of the `__init__` chain of `cls` (each passes the rest on through **options)."""
    names: set[str] = set()
    for klass in cls.__mro__[:-1]:                                  # object's __init__ takes nothing of ours
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = list(inspect.signature(init).parameters.values())[1:]
        names |= {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        if not any(p.kind == p.VAR_KEYWORD for p in params):
            break
    return names


def build_quantizer(name: str, **overrides) -> KVQuantizer:
    """Instantiate a quantizer by name: configs/quantizer/<name>.yaml, then `overrides` (imports lazily)."""
    path = CONFIG_DIR / f"{name}.yaml"
    if not path.exists():
        raise ValueError(f"Unknown quantizer '{name}'; known: {', '.join(known_quantizers())}.")
    from omegaconf import OmegaConf
    options = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    return quantizer_from_config({**options, **overrides, "name": name})

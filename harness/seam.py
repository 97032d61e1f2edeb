"""The one place that touches transformers: attention function, mask function, cache, weight folding.

    with install(model, quantizer) as seam:
        out = model.generate(ids, attention_mask=mask, past_key_values=seam.new_cache(), ...)

`install` registers the `kvq` attention implementation (AttentionInterface) together with a mask
function (AttentionMaskInterface; without it transformers passes attention_mask=None and silently
drops sliding-window and padding masks), folds R_V into v_proj, and switches the model to `kvq`.
Leaving the context restores the weights and the previous attention implementation.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
from torch.nn.attention.bias import causal_lower_right
from transformers import AttentionInterface
from transformers.cache_utils import Cache, DynamicSlidingWindowLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import (AttentionMaskInterface, causal_mask_function, prepare_padding_mask,
                                       sdpa_mask)

from harness.cache import KVView, ThreeRegionLayer, rotate
from harness.memory_plan import model_head_dim
from harness.placement import on_device
from harness.quantizer import KVQuantizer, has_own_cache

ATTN_NAME = "kvq"
PADDING_FROM_CACHE: set[int] = set()   # id() of each installed model's config whose full-attention layers are all
                                       # the seam's quantized-cache layers (they attend past their own padding)
WINDOWED_PREFILL = True   # sliding-window layers prefill in window-sized query chunks (windowed_sdpa); False: one masked SDPA
SUPPORTED_MODEL_TYPES = ("qwen3", "qwen2", "llama", "mistral", "gemma3_text", "gemma3")


def check_architecture(config) -> None:
    """Refuse architectures the seam has not been verified on, by name, before any weights load."""
    model_type = getattr(config, "model_type", "?")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"Architecture '{model_type}' is not supported by the KV seam; "
                         f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}.")


def kvq_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention over a `KVView` (quantized-cache layers) or plain tensors (sliding layers, no cache).

    query: [B, H_q, T_q, D] post-RoPE. Returns ([B, T_q, H_q, D], None) like transformers' sdpa.
    """
    pads, kernel_path = None, False
    if isinstance(key, KVView):
        key.layer.observe_padding(attention_mask)                                 # once: each sequence's padding
        kernel_path = key.layer.use_kernels
        if key.layer.key_rotation is not None:                                    # on the cache device, rotation dtype
            query = rotate(query, key.layer.key_rotation, use_kernel=kernel_path)
        if key.keys is None:
            out = kernel_decode(key.layer, query, attention_mask, scaling)
            return unrotate_output(module, out, kernel_path), None
        (key, value), pads = prefill_operands(key), key.layer.pad
    window = getattr(module, "sliding_window", None)
    by_padding = pads is not None and padded_causal_prefill(query, attention_mask, window, kwargs.get("softcap"))
    if padding_rows_only(query, attention_mask) and not by_padding:
        attention_mask = causal_with_padding(attention_mask, query.shape[-2])     # [B, 1, T_q, T_kv]
    if attention_mask is None and causal_chunk(query, key):
        out = causal_chunk_sdpa(query, key, value, scaling, dropout)              # [B, T_q, H_q, D]
    elif by_padding:
        out = padded_causal_sdpa(query, key, value, pads, scaling, dropout)       # [B, T_q, H_q, D]
    elif WINDOWED_PREFILL and window and _windowed_prefill_applies(query, key, attention_mask, window):
        out = windowed_sdpa(module, query, key, value, attention_mask, window,
                            scaling=scaling, dropout=dropout, **kwargs)
    elif kwargs.get("softcap") is None and grouped_masked_prefill(query, key, value, attention_mask):
        out = gqa_sdpa(query, key, value, attention_mask, scaling, dropout)      # [B, T_q, H_q, D]
    else:
        out, _ = sdpa_attention_forward(module, query, key, value, attention_mask,
                                        scaling=scaling, dropout=dropout, **kwargs)   # [B, T_q, H_q, D]
    return unrotate_output(module, out, kernel_path), None


def prefill_operands(view: KVView) -> tuple[torch.Tensor, torch.Tensor]:
    """The K and V [B, H_kv, T_kv, D] a call attends to on the PyTorch path: the view's (the layer's rows, the call's
    own in full precision), or for a prefill under the quantizer's `prefill_attends_quantized` (`KVView.as_stored`)
    every row as the cache now stores it (sink and recent window in full precision, the rest read back from the
    quantized history), read once the chunk's padding is known (`observe_padding` settled it)."""
    return view.layer.materialize() if view.as_stored else (view.keys, view.values)


def grouped_masked_prefill(query, key, value, attention_mask) -> bool:
    """A GPU prefill forward of a GQA model with an explicit mask over a layer whose padding the seam does not know
    (a quantized-cache layer attends sequence by sequence, `padded_causal_sdpa`), where transformers' SDPA path
    would repeat K/V per query head (`repeat_kv`: 8.6 GB at 4 x 128k for Qwen3-8B, results/bench/prefill_memory.md)
    while SDPA's grouped attention reads them as they are."""
    return (query.is_cuda and isinstance(attention_mask, torch.Tensor) and query.shape[-2] > 1
            and query.shape[1] != key.shape[1] and key.shape[-1] == value.shape[-1] <= 256)


def causal_chunk(query, key) -> bool:
    """A GPU prefill chunk whose keys run past its queries, given no mask: `kvq_mask` left it out because it is
    plain causal, aligned to the last key (lower right). transformers itself leaves a mask out only for a single
    query, queries as long as the keys, or a static cache's empty future slots, and no cache of the seam has those
    (each holds exactly the tokens seen)."""
    return query.is_cuda and 1 < query.shape[-2] < key.shape[-2]


def causal_chunk_sdpa(query, key, value, scaling, dropout) -> torch.Tensor:
    """Causal SDPA of T_q queries over T_kv >= T_q keys, the queries the last T_q positions, without a materialized
    mask (flash attention's lower-right causal where it applies): query [B, H_q, T_q, D], key/value
    [B, H_kv, T_kv, D] -> [B, T_q, H_q, D]."""
    return gqa_sdpa(query, key, value, causal_lower_right(query.shape[-2], key.shape[-2]), scaling, dropout)


def padded_causal_prefill(query, attention_mask, window, softcap) -> bool:
    """A GPU prefill forward over a quantized-cache layer whose mask is causal plus each sequence's padding (what
    transformers builds for a full-attention layer of a padded batch), no window, no softcap."""
    return (query.is_cuda and query.shape[-2] > 1 and isinstance(attention_mask, torch.Tensor) and not window
            and softcap is None)


def padded_causal_sdpa(query, key, value, pads: list[int], scaling, dropout) -> torch.Tensor:
    """Causal SDPA of each sequence over its keys after its `pads[b]` padding ones, without the batch's mask (SDPA
    would copy its [B, 1, T_q, T_kv] bool mask into a float one: 8.6 GB at 4 x 128k in 8k chunks): query
    [B, H_q, T_q, D], key/value [B, H_kv, T_kv, D], the queries the last T_q positions -> [B, T_q, H_q, D]. A query
    row before its sequence's first token (padding) sees no key and gets zeros."""
    t_q, t_kv = query.shape[-2], key.shape[-2]
    out = query.new_zeros(query.shape[0], t_q, query.shape[1], query.shape[-1])  # [B, T_q, H_q, D]
    for b, pad in enumerate(pads):
        rows = min(t_q, t_kv - pad)                                              # the chunk's rows past the padding
        if rows > 0:
            out[b, t_q - rows:] = causal_chunk_sdpa(query[b:b + 1, :, t_q - rows:], key[b:b + 1, :, pad:],
                                                    value[b:b + 1, :, pad:], scaling, dropout)[0]
    return out


def padding_rows_only(query, attention_mask) -> bool:
    """A prefill forward handed `kvq_mask`'s padding rows [B, 1, 1, T_kv] instead of the full causal mask."""
    return isinstance(attention_mask, torch.Tensor) and query.shape[-2] > 1 and attention_mask.shape[-2] == 1


def causal_with_padding(padding: torch.Tensor, q_length: int) -> torch.Tensor:
    """The full mask [B, 1, T_q, T_kv] of the padding rows [B, 1, 1, T_kv], the queries the last T_q positions (what
    transformers builds), for a layer that cannot attend by its padding."""
    t_kv = padding.shape[-1]
    causal = torch.ones(q_length, t_kv, dtype=torch.bool, device=padding.device).tril(t_kv - q_length)  # [T_q, T_kv]
    return padding & causal


def padding_rows(q_length: int, kv_length: int, q_offset, kv_offset, mask_function, attention_mask, local_size,
                 config) -> bool:
    """Whether a GPU prefill mask can be given as padding rows alone: plain causal with the queries the last
    positions (no window, no custom pattern) over full-attention layers that are all the seam's quantized-cache
    layers, which attend sequence by sequence past each one's padding (`padded_causal_sdpa`)."""
    return (id(config) in PADDING_FROM_CACHE and mask_function is causal_mask_function
            and local_size is None and not isinstance(q_offset, torch.Tensor) and attention_mask is not None
            and q_length > 1 and q_offset + q_length == kv_offset + kv_length)


def lower_right_causal(q_length: int, kv_length: int, q_offset, kv_offset, mask_function, attention_mask,
                       local_size) -> bool:
    """Whether transformers' mask for these arguments is plain causal over keys that end with the queries, and
    longer than them (a later prefill chunk): no padding, no window, no custom pattern."""
    if mask_function is not causal_mask_function or local_size is not None or isinstance(q_offset, torch.Tensor):
        return False
    if not 1 < q_length < kv_length or q_offset + q_length != kv_offset + kv_length:
        return False
    padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
    return padding is None or bool(padding.all())


def kvq_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
             mask_function=causal_mask_function, attention_mask=None, local_size=None, device="cpu", **kwargs):
    """transformers' `sdpa_mask`, except on the GPU for a later prefill chunk with no padding (`lower_right_causal`):
    None, which `kvq_attention` reads as causal to the last key (`causal_chunk_sdpa`), so no [B, 1, T_q, T_kv]
    mask is built (one sequence at 128k in 8k chunks: a 1.07 GB bool mask and SDPA's 2.15 GB float copy of it;
    results/bench/prefill_memory.md); and for a padded prefill over the seam's own cache (`padding_rows`): the
    padding rows [B, 1, 1, T_kv] alone (4.3 GB less at 4 x 128k in 8k chunks), which a layer that cannot attend by
    its padding expands (`causal_with_padding`). The CPU keeps transformers' mask (the committed CPU rows ran with
    it)."""
    if torch.device(device).type == "cuda" and lower_right_causal(q_length, kv_length, q_offset, kv_offset,
                                                                  mask_function, attention_mask, local_size):
        return None
    if torch.device(device).type == "cuda" and padding_rows(q_length, kv_length, q_offset, kv_offset, mask_function,
                                                            attention_mask, local_size, kwargs.get("config")):
        padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)[:, kv_offset:kv_offset + kv_length]
        if not bool(padding.all()):                   # no padding at all: transformers' causal skip, as before
            return padding.bool()[:, None, None, :]                               # [B, 1, 1, T_kv]
    return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                     kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
                     local_size=local_size, device=device, **kwargs)


def gqa_sdpa(query, key, value, attention_mask, scaling, dropout) -> torch.Tensor:
    """SDPA over K/V [B, H_kv, T, D] shared by groups of query heads [B, H_q, T_q, D] -> [B, T_q, H_q, D]."""
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous()


def _windowed_prefill_applies(query, key, attention_mask, window: int) -> bool:
    """A long chunk over a sliding-window layer with an explicit [.., T_q, T_kv] mask (the mask hides the rest)."""
    t_q, t_kv = query.shape[-2], key.shape[-2]
    return (t_q > 2 * window and isinstance(attention_mask, torch.Tensor)
            and tuple(attention_mask.shape[-2:]) == (t_q, t_kv))


def windowed_sdpa(module, query, key, value, attention_mask, window: int, **kwargs) -> torch.Tensor:
    """Sliding-window attention in query chunks of `window` rows, each over the keys its window can reach.

    A query at position p sees keys in (p - window, p]; the mask still decides, so the result is the full
    masked SDPA's up to summation order, at O(T * window) instead of O(T^2) cost (the CPU SDPA kernel does
    not skip masked blocks). query [B, H_q, T_q, D], key/value [B, H_kv, T_kv, D] -> [B, T_q, H_q, D].
    """
    t_q, t_kv = query.shape[-2], key.shape[-2]
    offset = t_kv - t_q                                                # keys before the first query
    outs = []
    for q0 in range(0, t_q, window):
        q1 = min(q0 + window, t_q)
        k0, k1 = max(0, offset + q0 - window), offset + q1
        out, _ = sdpa_attention_forward(module, query[..., q0:q1, :], key[..., k0:k1, :], value[..., k0:k1, :],
                                        attention_mask[..., q0:q1, k0:k1], **kwargs)
        outs.append(out)                                                          # [B, q1 - q0, H_q, D]
    return torch.cat(outs, dim=1)


def kernel_decode(layer, query, attention_mask, scaling) -> torch.Tensor:
    """Triton split-K decode over [sink | packed history | recent] with the decode kernel of the layer quantizer's
    format (the identity: over its fp rows alone); query [B, H_q, T_q, D] -> [B, T_q, H_q, D]."""
    lengths = layer.decode_lengths(attention_mask, query.device)         # hist_len, fp_len, hist_start, fp_start
    k_spec, v_spec = layer.kernel_specs
    with on_device(query.device):                                         # the layer's GPU (models split over several)
        out = layer.quantizer.kernel_ops().decode_attention(                  # [B, H_q, T_q, D]
            query, *layer.kernel_operands(), *lengths, sm_scale=scaling, k_spec=k_spec, v_spec=v_spec)
    return out.transpose(1, 2).contiguous()     # no copy for the kernels' token-major output (kernels.decode)


def unrotate_output(module, out: torch.Tensor, use_kernel: bool = False) -> torch.Tensor:
    """Map the attention output [B, T_q, H_q, D] back from the R_V basis (v_proj was folded): out @ R_V^T
    (use_kernel: a cache on the kernel path, `harness.cache.rotate`)."""
    r_v_t = getattr(module, "_kvq_output_rotation", None)                # R_V^T in the rotation dtype
    if r_v_t is None:
        return out
    return rotate(out, r_v_t, use_kernel=use_kernel)


AttentionInterface.register(ATTN_NAME, kvq_attention)
AttentionMaskInterface.register(ATTN_NAME, kvq_mask)


def attention_modules(model) -> list[torch.nn.Module]:
    """The self-attention modules of a decoder, in layer order (those with layer_idx and v_proj)."""
    found = [m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "v_proj") and hasattr(m, "o_proj")]
    return sorted(found, key=lambda m: m.layer_idx)


def fold_value_rotation(module, rotation: torch.Tensor, runtime_dtype: str = "float32") -> torch.Tensor:
    """v_proj <- per KV head R^T W_h (and b_h R) in fp32, so v' = v @ R; returns the original weight.

    Also keeps R (fp32, for analysis) and R^T in the runtime rotation dtype for `unrotate_output`.
    """
    proj, d = module.v_proj, rotation.shape[0]
    original = proj.weight.data.clone()
    rot = rotation.to(torch.float32).to(proj.weight.device)
    w = proj.weight.data.float().view(-1, d, proj.weight.shape[-1])           # [H_kv, D, hidden]
    proj.weight.data.copy_(torch.einsum("ed,hei->hdi", rot, w).reshape_as(proj.weight))
    if proj.bias is not None:
        module._kvq_bias_backup = proj.bias.data.clone()
        proj.bias.data.copy_((proj.bias.data.float().view(-1, d) @ rot).reshape_as(proj.bias))
    module._kvq_value_rotation = rot
    out_dtype = proj.weight.dtype if runtime_dtype == "model" else torch.float32
    module._kvq_output_rotation = rot.T.contiguous().to(out_dtype)
    return original


def lacks_kernels(quantizer) -> bool:
    """Whether the quantizer replaces KVQuantizer.quantize / dequantize without naming the kernels of its format
    (`kernel_ops`): the stock kernels would store the affine format instead."""
    cls = type(quantizer)
    own_format = cls.quantize is not KVQuantizer.quantize or cls.dequantize is not KVQuantizer.dequantize
    return own_format and cls.kernel_ops is KVQuantizer.kernel_ops


def kernels_enabled(device: torch.device, mode: str, quantizer=None, head_dim: int | None = None) -> bool:
    """auto: Triton kernels on CUDA only; triton: forced (CPU needs TRITON_INTERPRET=1); reference: never.

    A quantizer with quantize/dequantize hooks of its own and no kernels for that format (`lacks_kernels`), or a
    model whose head_dim the kernels are not built for (`kernels.dispatch.HEAD_DIMS`), runs on the reference path
    under auto and is refused under `kernels=triton`.
    """
    from kernels.dispatch import unsupported_head_dim, use_triton
    custom = quantizer is not None and quantizer.stores_codes and lacks_kernels(quantizer)
    if custom and mode == "triton":
        raise ValueError(f"Quantizer '{quantizer.name}' overrides quantize/dequantize without Triton kernels for "
                         f"its format (kernel_ops); run it with kernels=reference (or auto).")
    no_build = head_dim is not None and unsupported_head_dim(head_dim)
    if no_build and mode == "triton":
        raise ValueError(f"kernels=triton: {no_build}; run it with kernels=auto or kernels=reference (the PyTorch "
                         f"reference path).")
    if mode == "auto":
        return device.type == "cuda" and not custom and not no_build
    return use_triton(device, mode) and not custom


class Seam:
    """Installed state: which layers are patched and how to build a cache for them."""

    def __init__(self, model, quantizer, kernels: str = "auto"):
        self.model, self.quantizer, self.kernels = model, quantizer, kernels
        self.modules = attention_modules(model)
        self.previous_impl = model.config._attn_implementation
        self.use_kernels = kernels_enabled(next(model.parameters()).device, kernels, quantizer,
                                           model_head_dim(model.config))
        self._weights: dict[int, torch.Tensor] = {}

    @property
    def patched_layers(self) -> int:
        return len(self.modules)

    def layer_types(self) -> list[str]:
        types = getattr(self.model.config, "layer_types", None)
        return list(types) if types else ["full_attention"] * self.model.config.num_hidden_layers

    def new_cache(self) -> Cache:
        """A fresh cache: three-region layers for full attention, stock sliding layers otherwise
        (or the quantizer's own cache, e.g. transformers' QuantizedCache)."""
        if has_own_cache(self.quantizer):
            return self.quantizer.build_cache(self.model)
        layers, step_memo, kinds = [], {}, self.layer_types()
        for idx, kind in enumerate(kinds):
            if kind == "sliding_attention":
                layers.append(DynamicSlidingWindowLayer(sliding_window=self.model.config.sliding_window))
            else:
                layers.append(ThreeRegionLayer(self.quantizer.for_layer(idx, len(kinds)), idx,
                                               use_kernels=self.use_kernels, step_memo=step_memo))
        return Cache(layers=layers)

    def apply(self) -> "Seam":
        check_architecture(self.model.config)
        if not self.modules:
            raise ValueError("No attention modules with v_proj/o_proj found; the KV seam cannot patch this model.")
        kinds = self.layer_types()
        for module in self.modules:
            if kinds[module.layer_idx] == "sliding_attention":
                continue                      # sliding layers stay full precision and unrotated
            rotation = self.quantizer.for_layer(module.layer_idx, len(kinds)).value_rotation(module.layer_idx)
            if rotation is not None:
                self._weights[module.layer_idx] = fold_value_rotation(module, rotation, self.quantizer.rotation_dtype)
        self.model.set_attn_implementation(ATTN_NAME)
        if not has_own_cache(self.quantizer):                         # last: nothing after it can fail unregistered
            PADDING_FROM_CACHE.add(id(self.model.config))
        return self

    def remove(self) -> None:
        for module in self.modules:
            if module.layer_idx in self._weights:
                module.v_proj.weight.data.copy_(self._weights[module.layer_idx])
                if hasattr(module, "_kvq_bias_backup"):
                    module.v_proj.bias.data.copy_(module._kvq_bias_backup)
                    del module._kvq_bias_backup
            for attr in ("_kvq_value_rotation", "_kvq_output_rotation"):
                if hasattr(module, attr):
                    delattr(module, attr)
        self._weights.clear()
        PADDING_FROM_CACHE.discard(id(self.model.config))
        self.model.set_attn_implementation(self.previous_impl)


@contextmanager
def install(model, quantizer, kernels: str = "auto"):
    """Patch `model` for `quantizer` inside the block; always restore it afterwards."""
    seam = Seam(model, quantizer, kernels).apply()
    try:
        yield seam
    finally:
        seam.remove()

"""The three-region KV cache: full-precision sink | quantized history | full-precision recent.

One `ThreeRegionLayer` per full-attention layer (sliding-window layers keep transformers' own
full-precision `DynamicSlidingWindowLayer`: they hold at most `sliding_window` tokens).
Tokens are stored in position order; K rows are stored rotated by R_K and, if the quantizer has one,
minus a per-channel offset (V rows arrive already in the R_V basis because v_proj is folded).
Region sizes come from the quantizer (METHOD_OSCAR §7):
  * the first `sink_tokens` tokens stay full precision (None = all of them: the identity);
  * the last `recent_tokens` (+ up to page-1 slack) stay full precision;
  * everything between is quantized; during decode the oldest recent tokens are demoted in pages
    of `page_tokens` (just before the next tokens are appended, so the tokens of the current step
    always attend to themselves unquantized); a prefill chunk demotes everything beyond the recent
    window at once and attends to its own rows in full precision.
`update()` returns a `KVView` that the seam's attention function reads.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicLayer

KERNEL_MAX_QUERY_TOKENS = 16     # decode steps and short chunks (decode kernel); longer chunks are prefill (reference)


@dataclass
class KVView:
    """What a cache layer hands to the attention function for one forward call."""

    layer: "ThreeRegionLayer"
    keys: torch.Tensor | None      # [B, H_kv, T_kv, D] position-ordered, rotated basis; None on the kernel path
    values: torch.Tensor | None    # [B, H_kv, T_kv, D]
    new_tokens: int                # tokens appended by this call (the queries)


class PackedHistory:
    """Quantized rows of one tensor (K or V) of one layer, in growable buffers along the token axis.

    On the reference path a dequantized mirror is kept (each row is dequantized once, when it is
    written); on the kernel path only the packed bytes exist and the decode kernel reads them.
    """

    def __init__(self, quantizer, spec, use_kernels: bool):
        self.quantizer, self.spec, self.use_kernels = quantizer, spec, use_kernels
        self.length = 0
        self.head_dim = 0
        self.buffers: dict[str, torch.Tensor] = {}   # codes/scale/zero, token-like axis at dim -2
        self.used: dict[str, int] = {}
        self._mirror: torch.Tensor | None = None      # [B, H_kv, N, D] reference-path mirror

    def append(self, rows: torch.Tensor) -> None:
        """Quantize and store `rows` [B, H_kv, n, D]."""
        self.head_dim, self.dtype = rows.shape[-1], rows.dtype
        if self.use_kernels:
            from kernels.quant import quantize_pack
            parts = dict(zip(("codes", "scale", "zero"), quantize_pack(rows, self.spec)))
        else:
            qt = self.quantizer.quantize(rows.float(), self.spec)
            parts = {"codes": qt.codes, "scale": qt.scale, "zero": qt.zero}
            deq = self.quantizer.dequantize(qt).to(rows.dtype)
            self._mirror = deq if self._mirror is None else torch.cat([self._mirror, deq], dim=-2)
        for key, part in parts.items():
            self._push(key, part, rows.shape[-2])
        self.length += rows.shape[-2]

    def allocate(self, like: torch.Tensor, tokens: int) -> None:
        """Make the buffers hold `tokens` rows of the shape of `like` [B, H_kv, *, D] (kept rows are copied).

        Gives an empty history its (empty) operands for the decode kernel, and a frozen cache its fixed storage.
        """
        from kernels.quant import packed_shapes
        self.head_dim, self.dtype = like.shape[-1], getattr(self, "dtype", like.dtype)
        codes_shape, meta_shape = packed_shapes((*like.shape[:-2], tokens, like.shape[-1]), self.spec)
        dtypes = {"codes": torch.uint8, "scale": self.spec.torch_scale_dtype, "zero": self.spec.torch_scale_dtype}
        for key, shape in (("codes", codes_shape), ("scale", meta_shape), ("zero", meta_shape)):
            used = self.used.get(key, 0)
            buf = like.new_zeros(shape, dtype=dtypes[key])
            if used:
                buf[..., :used, :] = self.buffers[key][..., :used, :]
            self.buffers[key], self.used[key] = buf, used

    def reserve(self, tokens: int) -> None:
        """Size the buffers for `tokens` rows when they are first created (no doubling slack, e.g. benchmarks)."""
        self.reserved_tokens = tokens

    @property
    def dequantized(self) -> torch.Tensor:
        """[B, H_kv, N, D] reconstruction (the mirror, or decoded from the packed bytes on the kernel path)."""
        if self._mirror is not None:
            return self._mirror
        from kernels.format import QuantizedTensor
        qt = QuantizedTensor(self.view("codes"), self.view("scale"), self.view("zero"), self.spec, self.head_dim)
        return self.quantizer.dequantize(qt).to(self.dtype)

    def _push(self, key: str, part: torch.Tensor, tokens: int) -> None:
        buf, used, n = self.buffers.get(key), self.used.get(key, 0), part.shape[-2]
        if buf is None or used + n > buf.shape[-2]:
            reserved = getattr(self, "reserved_tokens", 0) * n // max(tokens, 1)   # rows of this tensor per token
            capacity = max(reserved, used + n) if buf is None and reserved else max(2 * (used + n), 64)
            grown = part.new_empty(*part.shape[:-2], capacity, part.shape[-1])
            if buf is not None:
                grown[..., :used, :] = buf[..., :used, :]
            buf = self.buffers[key] = grown
        buf[..., used:used + n, :] = part
        self.used[key] = used + n

    def view(self, key: str) -> torch.Tensor:
        return self.buffers[key][..., : self.used[key], :]

    def select_batch(self, index: torch.Tensor) -> None:
        """Keep batch rows `index` [B'] (in that order, repeats allowed) of every buffer."""
        self.buffers = {key: buf[index.to(buf.device)] for key, buf in self.buffers.items()}
        if self._mirror is not None:
            self._mirror = self._mirror[index.to(self._mirror.device)]

    def nbytes(self) -> int:
        return sum(self.view(k).numel() * self.view(k).element_size() for k in self.buffers)


def decode_demotion(n_recent: int, quantizer) -> int:
    """Recent rows to demote before a decode step: whole pages beyond the recent window (METHOD_OSCAR §7.3)."""
    excess = n_recent - quantizer.recent_tokens
    return max(0, excess // quantizer.page_tokens * quantizer.page_tokens)


def region_starts(pad: torch.Tensor, n_sink: int, n_hist: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(history_start, fp_start) [B] int32 of sequences whose first visible position is `pad` [B]."""
    hist_start = (pad - n_sink).clamp(0, n_hist)
    fp_start = torch.where(pad <= n_sink, pad, n_sink + (pad - n_sink - n_hist).clamp_min(0))
    return hist_start.to(torch.int32), fp_start.to(torch.int32)


class ThreeRegionLayer(DynamicLayer):
    """A full-attention cache layer laid out as sink | quantized history | recent."""

    is_sliding = False

    def __init__(self, quantizer, layer_idx: int, use_kernels: bool = False, step_memo: dict | None = None):
        super().__init__()
        self.quantizer, self.layer_idx = quantizer, layer_idx
        self.use_kernels = use_kernels and quantizer.stores_codes
        self.step_memo = {} if step_memo is None else step_memo   # shared by a cache's layers (decode_lengths)
        self.n_tokens = 0
        self.n_sink = 0
        self.history_k = self.history_v = None
        self.static = None            # a StaticState once `harness.static_cache.freeze` fixed the buffers
        r_k = quantizer.key_rotation(layer_idx)
        self.key_rotation = None if r_k is None else r_k.float()
        offset = quantizer.key_offset(layer_idx)
        self.key_offset = None if offset is None else offset.float()[None, :, None, :]   # [1, H_kv, 1, D]

    # ---------------------------------------------------------------- transformers' layer API
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        rotation_dtype = self.dtype if self.quantizer.rotation_dtype == "model" else torch.float32
        if self.key_rotation is not None:            # moved once here, not on every decode step
            self.key_rotation = self.key_rotation.to(self.device, rotation_dtype)
        if self.key_offset is not None:
            self.key_offset = self.key_offset.to(self.device, rotation_dtype)
        self.keys = key_states.new_empty(*key_states.shape[:2], 0, key_states.shape[-1])   # full-precision rows
        self.values = value_states.new_empty(*value_states.shape[:2], 0, value_states.shape[-1])
        if self.quantizer.stores_codes:
            self.history_k = PackedHistory(self.quantizer, self.quantizer.key_spec, self.use_kernels)
            self.history_v = PackedHistory(self.quantizer, self.quantizer.value_spec, self.use_kernels)
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        """Store new K/V [B, H_kv, T, D] (K rotated here) and return a view for the attention function."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.static is not None:
            return self.static.write(self, self.transform_keys(key_states), value_states)
        key_states = self.transform_keys(key_states)
        new = key_states.shape[-2]
        decode = new <= KERNEL_MAX_QUERY_TOKENS
        if decode:
            self._demote(prefill=False)   # demote before appending: the new tokens attend to themselves unquantized
        self.keys = torch.cat([self.keys, key_states], dim=-2)
        self.values = torch.cat([self.values, value_states], dim=-2)
        self.n_tokens += new
        self._grow_sink()
        if not decode:
            self._demote(prefill=True)
        if self.use_kernels and decode:
            view = KVView(self, None, None, new)        # the decode kernel reads the packed storage
            return view, view
        keys, values = self.materialize()
        keys[..., -new:, :] = key_states         # the current chunk attends to itself in full precision
        values[..., -new:, :] = value_states
        view = KVView(self, keys, values, new)
        return view, view

    def get_seq_length(self) -> int:
        return self.n_tokens

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.n_tokens + query_length, 0

    # transformers' batch operations (beam search, contrastive search): applied to every region's buffers
    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._select_batch(beam_idx)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._select_batch(indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._select_batch(torch.arange(self.keys.shape[0]).repeat_interleave(repeats))

    def crop(self, max_length: int) -> None:
        raise NotImplementedError("The three-region KV cache cannot be cropped (assisted decoding and DoLa need "
                                  "that): its demoted tokens are quantized, so use num_beams / greedy / sampling.")

    def _select_batch(self, index: torch.Tensor) -> None:
        """Keep batch rows `index` [B'] of the sink/recent rows and of the packed history."""
        if self.static is not None:
            raise NotImplementedError("A frozen (static) three-region cache cannot reorder or select its batch rows.")
        if not self.is_initialized:
            return
        index = index.to(self.keys.device)
        self.keys, self.values = self.keys[index], self.values[index]
        for history in (self.history_k, self.history_v):
            if history is not None:
                history.select_batch(index)
        self.step_memo.clear()

    def reset(self) -> None:
        self.n_tokens = self.n_sink = 0
        self.step_memo.clear()
        self.history_k = self.history_v = None
        super().reset()

    # ---------------------------------------------------------------- regions
    def transform_keys(self, key_states: torch.Tensor) -> torch.Tensor:
        """k @ R_K - m (each part only if the quantizer has it) in the rotation dtype; [B, H_kv, T, D] in and out."""
        if self.key_rotation is None and self.key_offset is None:
            return key_states
        keys = key_states.to((self.key_rotation if self.key_rotation is not None else self.key_offset).dtype)
        if self.key_rotation is not None:
            keys = keys @ self.key_rotation
        if self.key_offset is not None:
            keys = keys - self.key_offset
        return keys.to(key_states.dtype)

    def _grow_sink(self) -> None:
        sink = self.quantizer.sink_tokens
        self.n_sink = self.n_tokens if sink is None else min(self.n_tokens, sink)

    def _demote(self, prefill: bool) -> None:
        """Move the oldest recent tokens beyond the recent window into the quantized history."""
        if not self.quantizer.stores_codes:
            return
        n_recent = self.keys.shape[-2] - self.n_sink
        excess = n_recent - self.quantizer.recent_tokens
        n_move = excess - excess % self._alignment() if prefill else decode_demotion(n_recent, self.quantizer)
        if n_move <= 0:
            return
        lo, hi = self.n_sink, self.n_sink + n_move
        self.history_k.append(self.keys[..., lo:hi, :])
        self.history_v.append(self.values[..., lo:hi, :])
        self.keys = torch.cat([self.keys[..., :lo, :], self.keys[..., hi:, :]], dim=-2)
        self.values = torch.cat([self.values[..., :lo, :], self.values[..., hi:, :]], dim=-2)

    def _alignment(self) -> int:
        """Prefill demotes any count, except channel-axis (KIVI) keys, which need whole token groups."""
        spec = self.quantizer.key_spec
        return spec.group if getattr(spec, "axis", "token") == "channel" else 1

    def sequence_starts(self, attention_mask) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padding offsets (history_start, fp_start) [B] int32 from a bool mask [B, 1, T_q, T_kv] or None."""
        batch = self.keys.shape[0]
        zeros = torch.zeros(batch, dtype=torch.int32, device=self.keys.device)
        if attention_mask is None or attention_mask.dtype != torch.bool:
            return zeros, zeros
        pad = attention_mask[:, 0, -1, :].int().argmax(dim=-1).to(torch.int32)     # first visible position
        return region_starts(pad, self.n_sink, self.history_length)

    def decode_lengths(self, attention_mask, device) -> tuple[torch.Tensor, ...]:
        """(hist_len, fp_len, hist_start, fp_start), int32 [B] each, for the decode kernel.

        Every full-attention layer of a step has the same regions and gets the same mask object, so the
        first layer builds these small tensors and the others reuse them (results/bench/step_ops.md).
        """
        if self.static is not None:
            return self.static.lengths
        batch, n_fp = self.keys.shape[0], self.keys.shape[-2]
        key = (self.n_tokens, self.n_sink, self.history_length, n_fp, batch, id(attention_mask), str(device))
        if self.step_memo.get("key") != key:
            hist_start, fp_start = self.sequence_starts(attention_mask)
            hist_len = torch.full((batch,), self.history_length, dtype=torch.int32, device=device)
            fp_len = torch.full((batch,), n_fp, dtype=torch.int32, device=device)
            # the mask is kept so that its id cannot be reused by another object while the key holds it
            self.step_memo.update(key=key, mask=attention_mask, lengths=(hist_len, fp_len, hist_start, fp_start))
        return self.step_memo["lengths"]

    def kernel_operands(self) -> tuple[torch.Tensor, ...]:
        """(k codes, k scale, k zero, v codes, v scale, v zero, fp keys, fp values) for the decode kernel.

        A frozen cache hands over whole buffers: fixed shapes, read only up to the lengths on the device.
        """
        parts = []
        for history in (self.history_k, self.history_v):
            if not history.buffers:                  # no token demoted yet (a prompt shorter than sink + recent)
                history.allocate(self.keys, 0)
            parts += [history.buffers[k] if self.static else history.view(k) for k in ("codes", "scale", "zero")]
        return (*parts, self.keys, self.values)

    @property
    def history_length(self) -> int:
        return 0 if self.history_k is None else self.history_k.length

    def materialize(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Position-ordered [sink | dequantized history | recent] K and V, [B, H_kv, T, D]."""
        if self.history_length == 0:
            return self.keys.clone(), self.values.clone()
        s = self.n_sink
        keys = torch.cat([self.keys[..., :s, :], self.history_k.dequantized, self.keys[..., s:, :]], dim=-2)
        values = torch.cat([self.values[..., :s, :], self.history_v.dequantized, self.values[..., s:, :]], dim=-2)
        return keys, values

    def nbytes(self) -> int:
        """Bytes held by this layer: full-precision rows plus packed history (codes and metadata)."""
        full = (self.keys.numel() + self.values.numel()) * self.keys.element_size() if self.is_initialized else 0
        packed = 0 if self.history_k is None else self.history_k.nbytes() + self.history_v.nbytes()
        return full + packed

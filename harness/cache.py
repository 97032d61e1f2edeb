"""The three-region KV cache: full-precision sink | quantized history | full-precision recent, per sequence.

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
    window at once (the window then slides over the chunk's own tokens: a chunk at least a window long reads every
    earlier token past the sink quantized) and attends to its own rows in full precision; with the quantizer's
    `chunk_keeps_recent` false a chunk followed by another (a non-final chunk) demotes every token past the sink, as
    the release's server does (METHOD_OSCAR §7.2), so a shorter later chunk reads none of the previous one in full
    precision either; decided when the next call shows whether the chunk was the last.
Regions are counted per sequence from its first real token, so a prompt gets the same sink, history,
recent window and demotions alone as inside a left-padded batch (docs/architecture.md, "Batch invariance").
Storage: each batch row of the full-precision buffers holds [unused | sink | recent], right-aligned (the
decode kernel skips the unused rows through fp_start); each row of the packed history starts at index 0.
The padding of each row is learnt from the first attention mask the seam hands over (`observe_padding`),
so the first prefill chunk's demotion waits until then (`settle`; that chunk attends to itself in full
precision anyway).
`update()` returns a `KVView` that the seam's attention function reads.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicLayer

from harness.packed_history import PackedHistory
from kernels.rotate import rotate_rows, rotate_rows_reference, rotation_kernel_serves

KERNEL_MAX_QUERY_TOKENS = 16     # decode steps and short chunks (decode kernel); longer chunks are prefill (reference)


def rotate(x: torch.Tensor, rotation: torch.Tensor, offset: torch.Tensor | None = None,
           use_kernel: bool = False) -> torch.Tensor:
    """(x @ R - offset[h]) in the rotation's dtype, back in x's dtype; x [B, H, T, D], offset [H, D] (in the
    rotation's dtype) or None. use_kernel: a cache on the kernel path, where `kernels.rotate.rotate_rows` takes fp32
    rotations in one launch (through an upcast, cuBLAS's fp32 GEMM and a cast, the three rotations of a decode step
    cost ~75 us per layer more than bf16 ones on an H200: results/bench/bench_throughput_rotate_rows.md)."""
    if use_kernel and rotation_kernel_serves(x, rotation):
        return rotate_rows(x, rotation, offset)
    return rotate_rows_reference(x, rotation, offset)


@dataclass
class KVView:
    """What a cache layer hands to the attention function for one forward call."""

    layer: "ThreeRegionLayer"
    keys: torch.Tensor | None      # [B, H_kv, T_kv, D] position-ordered, rotated basis; None on the kernel path
    values: torch.Tensor | None    # [B, H_kv, T_kv, D]
    new_tokens: int                # tokens appended by this call (the queries)
    as_stored: bool = False        # a prefill under `prefill_attends_quantized`: keys / values are the call's own
                                   # rows [B, H_kv, new, D]; the seam reads the layer as stored once the padding is
                                   # known (harness.seam.prefill_operands)


def decode_demotion(n_recent: int, quantizer) -> int:
    """Recent rows to demote before a decode step: whole pages beyond the recent window (METHOD_OSCAR §7.3)."""
    excess = n_recent - quantizer.recent_tokens
    return max(0, excess // quantizer.page_tokens * quantizer.page_tokens)


class ThreeRegionLayer(DynamicLayer):
    """A full-attention cache layer laid out as sink | quantized history | recent in every sequence."""

    is_sliding = False

    def __init__(self, quantizer, layer_idx: int, use_kernels: bool = False, step_memo: dict | None = None):
        super().__init__()
        self.quantizer, self.layer_idx = quantizer, layer_idx
        self.use_kernels = use_kernels        # the identity too: its decode kernel reads the fp rows alone
        self.step_memo = {} if step_memo is None else step_memo   # shared by the layers, per device (decode_lengths)
        self.n_tokens = 0
        self.prompt_tokens = 0    # a chunked prefill's padded prompt length (`set_padding`): calls within it are
                                  # prefill chunks however short, the first call after it a decode step
        self.pad: list[int] | None = None      # left padding of each sequence, once the seam saw a mask
        self._pending = False                  # a prefill chunk's demotion waits for the padding
        self.history_k = self.history_v = None
        self.reserved_tokens = 0      # > 0: the histories are created holding this many tokens (`reserve_history`)
        self.static = None            # a StaticState once `harness.static_cache.freeze` fixed the buffers
        self._no_history = None       # the identity's empty kernel operands (`_no_history_operands`)
        r_k = quantizer.key_rotation(layer_idx)
        self.key_rotation = None if r_k is None else r_k.float()
        offset = quantizer.key_offset(layer_idx)
        self.key_offset = None if offset is None else offset.float()[None, :, None, :]   # [1, H_kv, 1, D]

    # ---------------------------------------------------------------- transformers' layer API
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        rotation_dtype = self.dtype if self.quantizer.rotation_dtype == "model" else torch.float32
        if self.key_rotation is not None:            # moved once here, not on every decode step
            self.key_rotation = self.key_rotation.to(self.device, rotation_dtype).contiguous()
        if self.key_offset is not None:
            self.key_offset = self.key_offset.to(self.device, rotation_dtype)
        self.keys = key_states.new_empty(*key_states.shape[:2], 0, key_states.shape[-1])   # full-precision rows
        self.values = value_states.new_empty(*value_states.shape[:2], 0, value_states.shape[-1])
        if self.quantizer.stores_codes:
            self.history_k = PackedHistory(self.quantizer, self.quantizer.key_spec, self.use_kernels)
            self.history_v = PackedHistory(self.quantizer, self.quantizer.value_spec, self.use_kernels)
            if self.reserved_tokens:
                self.history_k.reserve(self.reserved_tokens)
                self.history_v.reserve(self.reserved_tokens)
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        """Store new K/V [B, H_kv, T, D] (K rotated here) and return a view for the attention function."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.static is not None:
            return self.static.write(self, self.transform_keys(key_states), value_states)
        key_states = self.transform_keys(key_states)
        new = key_states.shape[-2]
        # a first call is a prefill however short: a prompt of <= 16 tokens alone is prefilled as inside a batch
        decode = 0 < self.n_tokens and self.n_tokens >= self.prompt_tokens and new <= KERNEL_MAX_QUERY_TOKENS
        if self.n_tokens:       # a pending chunk followed by another is a non-final one
            self.settle(keep_recent=decode or self.quantizer.chunk_keeps_recent)
        if decode:
            self._demote(prefill=False)   # demote before appending: the new tokens attend to themselves unquantized
        self.keys = torch.cat([self.keys, key_states], dim=-2)
        self.values = torch.cat([self.values, value_states], dim=-2)
        self.n_tokens += new
        if not decode:
            self._pending = True          # settled now if the padding is known, else once the seam saw the mask
            if self.pad is not None and self.quantizer.chunk_keeps_recent:
                self.settle()             # (else by the next call, which says whether this chunk was the last)
        if self.use_kernels and decode:
            view = KVView(self, None, None, new)        # the decode kernel reads the packed storage
            return view, view
        if not decode and self.quantizer.prefill_attends_quantized:
            view = KVView(self, key_states, value_states, new, as_stored=True)
            return view, view
        keys, values = self._materialize()
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
        """Keep batch rows `index` [B'] of the sink/recent rows, of the packed history and of the padding."""
        if self.static is not None:
            raise NotImplementedError("A frozen (static) three-region cache cannot reorder or select its batch rows.")
        if not self.is_initialized:
            return
        index = index.to(self.keys.device)
        self.keys, self.values = self.keys[index], self.values[index]
        for history in (self.history_k, self.history_v):
            if history is not None:
                history.select_batch(index)
        if self.pad is not None:
            self.pad = [self.pad[i] for i in index.tolist()]
        self.step_memo.clear()

    def reset(self) -> None:
        self.n_tokens = self.prompt_tokens = 0
        self.pad, self._pending = None, False
        self.step_memo.clear()
        self.history_k = self.history_v = None
        super().reset()

    # ---------------------------------------------------------------- regions, per sequence
    def transform_keys(self, key_states: torch.Tensor) -> torch.Tensor:
        """k @ R_K - m (each part only if the quantizer has it) in the rotation dtype; [B, H_kv, T, D] in and out."""
        if self.key_rotation is None and self.key_offset is None:
            return key_states
        if self.key_rotation is not None:
            offset = None if self.key_offset is None else self.key_offset[0, :, 0, :]              # [H_kv, D]
            return rotate(key_states, self.key_rotation, offset, use_kernel=self.use_kernels)
        return (key_states.to(self.key_offset.dtype) - self.key_offset).to(key_states.dtype)

    def observe_padding(self, attention_mask) -> None:
        """Learn each sequence's left padding from the first mask the seam sees (bool [B, 1, T_q, T_kv] or None)."""
        if self.pad is not None:
            return
        batch = self.keys.shape[0]
        if attention_mask is None or attention_mask.dtype != torch.bool:
            self.pad = [0] * batch
        else:
            self.pad = attention_mask[:, 0, -1, :].int().argmax(dim=-1).tolist()   # first visible position
        if self.quantizer.chunk_keeps_recent:
            self.settle()

    @property
    def fp_rows(self) -> int:
        """Full-precision rows in use per batch row (a frozen cache's buffers hold more)."""
        return self.static.n_fp if self.static is not None else self.keys.shape[-2]

    def regions(self) -> tuple[list[int], list[int], list[int]]:
        """(sink, history, recent) token counts of each sequence, from its first real token."""
        sink_cap, pad = self.quantizer.sink_tokens, self.pad or [0] * self.keys.shape[0]
        real = [max(0, self.n_tokens - p) for p in pad]          # 0 while a chunked prefill is still in the padding
        sink = real if sink_cap is None else [min(n, sink_cap) for n in real]
        hist = self.history_k.lengths if self.history_k is not None and self.history_k.lengths else [0] * len(pad)
        return sink, list(hist), [n - s - h for n, s, h in zip(real, sink, hist)]

    def fp_starts(self) -> list[int]:
        """First full-precision row of each sequence's sink (the rows before it hold nothing)."""
        sink, _, recent = self.regions()
        return [self.fp_rows - s - r for s, r in zip(sink, recent)]

    def settle(self, keep_recent: bool = True) -> None:
        """Fix the padding and demote what the last prefill chunk left beyond the recent window, or (keep_recent
        False: a non-final chunk under `chunk_keeps_recent=False`) every token past the sink (a cache read or updated
        again before any attention mask reached it, i.e. driven without the seam, is unpadded)."""
        if self.pad is None:
            self.pad = [0] * self.keys.shape[0]
        if self._pending:
            self._pending = False
            self._demote(prefill=True, keep_recent=keep_recent)

    def _demote(self, prefill: bool, keep_recent: bool = True) -> None:
        """Move each sequence's oldest recent tokens beyond its recent window (none kept: keep_recent False) into
        the quantized history."""
        if not self.quantizer.stores_codes:
            return
        _, _, recent = self.regions()
        align, window = self._alignment(), self.quantizer.recent_tokens if keep_recent else 0
        if prefill:
            counts = [max(0, r - window) // align * align for r in recent]
        else:
            counts = [decode_demotion(r, self.quantizer) for r in recent]
        if max(counts) > 0:
            trim = demote_rows(self, counts)
            self.keys, self.values = self.keys[..., trim:, :], self.values[..., trim:, :]
            if prefill:     # a view would keep the whole chunk's full-precision rows alive until the next step
                self.keys, self.values = self.keys.clone(), self.values.clone()

    def _alignment(self) -> int:
        """Prefill demotes any count, except channel-axis (KIVI) keys, which need whole token groups."""
        spec = self.quantizer.key_spec
        return spec.group if getattr(spec, "axis", "token") == "channel" else 1

    def decode_lengths(self, attention_mask, device) -> tuple[torch.Tensor, ...]:
        """(hist_len, fp_len, hist_start, fp_start), int32 [B] each, for the decode kernel.

        Every full-attention layer of a step has the same regions, so the first layer builds these small
        tensors and the others reuse them (results/bench/step_ops.md), one set per device (a model split over
        several GPUs). The per-sequence ones change only when a demotion does; a host list goes to the device
        only then, and only when the sequences differ.
        """
        if self.static is not None:
            return self.static.lengths_on(device)
        self.observe_padding(attention_mask)
        batch, n_fp = self.keys.shape[0], self.keys.shape[-2]
        _, hist, _ = self.regions()
        starts = self.fp_starts()
        memo = self.step_memo.setdefault(str(device), {})
        rows_key = (tuple(hist), tuple(starts), batch)
        if memo.get("rows_key") != rows_key:
            memo.update(rows_key=rows_key, rows=(_int32(hist, device), _int32([0] * batch, device),
                                                 _int32(starts, device)))
        if memo.get("step_key") != (rows_key, n_fp):
            hist_len, hist_start, fp_start = memo["rows"]
            fp_len = torch.full((batch,), n_fp, dtype=torch.int32, device=device)
            memo.update(step_key=(rows_key, n_fp), lengths=(hist_len, fp_len, hist_start, fp_start))
        return memo["lengths"]

    def kernel_operands(self) -> tuple[torch.Tensor, ...]:
        """(k codes, k scale, k zero, v codes, v scale, v zero, fp keys, fp values) for the decode kernel.

        A frozen cache hands over whole buffers: fixed shapes, read only up to the lengths on the device.
        """
        if self.history_k is None:                   # the identity (no packed history): the kernel reads fp rows only
            return (*self._no_history_operands()[1] * 2, self.keys, self.values)
        parts = []
        for history in (self.history_k, self.history_v):
            if not history.buffers:                  # no token demoted yet (a prompt shorter than sink + recent)
                history.allocate(self.keys, 0)
            parts += [history.buffers[k] if self.static else history.view(k) for k in ("codes", "scale", "zero")]
        return (*parts, self.keys, self.values)

    @property
    def kernel_specs(self) -> tuple:
        """(k spec, v spec) of the packed history the decode kernel reads (a placeholder for the identity)."""
        if self.history_k is None:
            spec, _ = self._no_history_operands()
            return spec, spec
        return self.history_k.spec, self.history_v.spec

    def _no_history_operands(self) -> tuple:
        """(spec, (codes, scale, zero)) of the identity's empty history: the INT2 kernel's variant with no tokens,
        built once per batch shape and device rather than every step."""
        key = (tuple(self.keys.shape[:2]), self.keys.shape[-1], self.keys.device)
        if self._no_history is None or self._no_history[0] != key:
            from kernels.format import QuantSpec
            spec = QuantSpec(bits=2, group=self.keys.shape[-1])
            self._no_history = (key, spec, empty_history(self.keys, spec))
        return self._no_history[1:]

    @property
    def history_length(self) -> int:
        """Quantized tokens of the longest sequence."""
        self.settle()
        return 0 if self.history_k is None else self.history_k.length

    def materialize(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Position-ordered [padding | sink | dequantized history | recent] K and V, [B, H_kv, n_tokens, D].

        Padding positions hold zeros once a sequence's rows were rearranged (the attention mask hides them).
        """
        self.settle()
        return self._materialize()

    def _materialize(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.history_k is None or self.history_k.length == 0:
            return self.keys.clone(), self.values.clone()
        return self._in_position_order(self.keys, self.history_k), self._in_position_order(self.values, self.history_v)

    def _in_position_order(self, fp: torch.Tensor, history: PackedHistory) -> torch.Tensor:
        """[B, H_kv, n_tokens, D] from the fp rows [B, H_kv, F, D] and the history of each sequence, written into one
        buffer (the history decoded a sequence and a KV head at a time: no whole-history temporaries)."""
        sink, hist, recent = self.regions()
        out = fp.new_empty(*fp.shape[:-2], self.n_tokens, fp.shape[-1])            # [B, H_kv, n_tokens, D]
        for b, (pad, s, h, r, f0) in enumerate(zip(self.pad, sink, hist, recent, self.fp_starts())):
            at = min(pad, self.n_tokens)                                             # padding rows: zeros
            out[b, :, :at] = 0
            out[b, :, at:at + s] = fp[b, :, f0:f0 + s]
            history.decode_into(out[b, :, at + s:at + s + h], b)
            out[b, :, at + s + h:at + s + h + r] = fp[b, :, f0 + s:f0 + s + r]
        return out

    def nbytes(self) -> int:
        """Bytes held by this layer: full-precision rows plus packed history (codes and metadata)."""
        full = (self.keys.numel() + self.values.numel()) * self.keys.element_size() if self.is_initialized else 0
        packed = 0 if self.history_k is None else self.history_k.nbytes() + self.history_v.nbytes()
        return full + packed


def empty_history(like: torch.Tensor, spec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Codes, scale and zero of a history with no tokens, for the rows `like` [B, H_kv, *, D] (identity decode)."""
    batch, heads, _, head_dim = like.shape
    codes = like.new_zeros(batch, heads, 0, head_dim * spec.container_bits // 8, dtype=torch.uint8)
    meta = like.new_zeros(batch, heads, 0, 1, dtype=torch.float16)              # one (empty) group per token
    return codes, meta, meta


def _int32(values: list[int], device) -> torch.Tensor:
    """int32 [B] on `device`: a fill when all values are equal (no host-to-device copy), else a copy."""
    if len(set(values)) == 1:
        return torch.full((len(values),), values[0], dtype=torch.int32, device=device)
    return torch.tensor(values, dtype=torch.int32).to(device)


def set_padding(cache, attention_mask: torch.Tensor) -> None:
    """Tell each three-region layer its sequences' left padding and the prompt's length from its [B, T] mask before
    a chunked prefill: a first chunk may hold nothing but padding for a short prompt, so its own mask cannot say,
    and a last chunk of at most KERNEL_MAX_QUERY_TOKENS tokens is still a prefill chunk, not a decode step (so the
    chunk before it is a non-final one, as `chunk_keeps_recent` places it)."""
    pad = attention_mask.int().argmax(dim=-1).tolist()                            # first real token of each row
    for layer in getattr(cache, "layers", []):
        if isinstance(layer, ThreeRegionLayer):
            layer.pad, layer.prompt_tokens = list(pad), attention_mask.shape[1]


def reserve_history(cache, tokens: int) -> None:
    """Before a generation of at most `tokens` tokens per sequence (prompt + new): each three-region layer's
    packed history is created at that size, not grown by doubling as the prefill demotes (a 128k prompt left
    twice its packed bytes allocated, and a chunked prefill copied them at every doubling)."""
    for layer in getattr(cache, "layers", []):
        if isinstance(layer, ThreeRegionLayer) and not layer.is_initialized:
            quantizer = layer.quantizer                       # the sink and recent rows never reach the history
            kept = (quantizer.sink_tokens or 0) + quantizer.recent_tokens
            layer.reserved_tokens = max(tokens - kept, 1)


def set_lengths(dst: torch.Tensor, values: list[int]) -> None:
    """dst [B] <- values without making the host wait for the device: a fill when all values are equal, else a
    non-blocking copy from pinned memory (a plain copy from pageable memory waits for the queued work)."""
    if len(set(values)) == 1:
        dst.fill_(values[0])
        return
    src = torch.tensor(values, dtype=dst.dtype)
    dst.copy_(src.pin_memory() if dst.is_cuda else src, non_blocking=dst.is_cuda)


class RowIndex:
    """Long [B, n] device tensors of row indices, built from host lists once per distinct list and device and kept:
    a CUDA graph replays the tensors its capture read (harness/demotion_graph.py), so they live as long as the
    graph's owner; an index missing during a capture is an error, not a host-to-device copy inside the graph."""

    def __init__(self):
        self._made: dict[tuple, torch.Tensor] = {}

    def __call__(self, rows: tuple[tuple[int, ...], ...], device) -> torch.Tensor:
        """rows: one tuple of row indices per batch row."""
        key = (rows, str(device))
        if key not in self._made:
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("a demotion captured as a CUDA graph needs its row indices built before the "
                                   "capture (its first run, eager, builds them).")
            self._made[key] = torch.tensor(rows, dtype=torch.long).to(device)
        return self._made[key]


def demote_rows(layer: ThreeRegionLayer, counts: list[int], write=None, move_sinks: bool = True) -> int:
    """Quantize counts[b] rows after sequence b's sink into its history and move its sink up behind them.

    Works in place on the layer's fp rows [B, H_kv, F, D] (F = layer.fp_rows); returns how many leading
    rows no sequence uses any more (the caller drops or shifts them out). write(history, rows) stores the rows
    [B, H_kv, max(counts), D] in a history (default: `history.append(rows, counts)`); move_sinks=False leaves the
    sinks where they are (a caller that moves the rows after the demoted ones down to them instead).
    """
    sink, _, recent = layer.regions()
    n_fp, width = layer.fp_rows, max(counts)
    first = [n_fp - r for r in recent]                                        # each sequence's oldest recent row
    index = _demoted_rows_index(first, width, layer.keys)                     # [B, width] or None (a slice)
    for rows, history in ((layer.keys, layer.history_k), (layer.values, layer.history_v)):
        rows_out = _rows_from(rows, first, width, index)                      # [B, H_kv, width, D]
        if write is None:
            history.append(rows_out, counts)
        else:
            write(history, rows_out)
        if move_sinks:
            _move_sinks(rows, [f - s for f, s in zip(first, sink)], sink, counts)
    return min(f - s + c for f, s, c in zip(first, sink, counts))


def _demoted_rows_index(first: list[int], width: int, rows: torch.Tensor) -> torch.Tensor | None:
    """Long [B, width]: rows first[b] .. first[b] + width - 1 of rows [B, H_kv, F, D] (clamped to F - 1), built on
    the host and copied once for the keys and the values; None where every sequence starts at the same row (a slice
    serves)."""
    last = rows.shape[-2] - 1
    if len(set(first)) == 1 and first[0] + width <= last + 1:
        return None
    return (torch.tensor(first)[:, None] + torch.arange(width)).clamp_max(last).to(rows.device)


def _rows_from(rows: torch.Tensor, first: list[int], width: int, index: torch.Tensor | None) -> torch.Tensor:
    """Rows first[b] .. first[b] + width - 1 of each batch row of rows [B, H_kv, F, D]: a slice, or one gather
    through `_demoted_rows_index`'s index."""
    if index is None:
        return rows[..., first[0]:first[0] + width, :]
    return rows.gather(2, index[:, None, :, None].expand(rows.shape[0], rows.shape[1], width, rows.shape[-1]))


def as_words(rows: torch.Tensor) -> torch.Tensor:
    """rows [..., D] as 8-byte words [..., D * itemsize / 8] where the layout allows (else rows): the same bytes, for
    copies, which torch's strided copy kernels run element by element (a quarter of the elements for 16-bit rows)."""
    size = rows.element_size()
    aligned = all(stride * size % 8 == 0 for stride in rows.stride()[:-1]) and rows.storage_offset() * size % 8 == 0
    return rows.view(torch.int64) if rows.stride(-1) == 1 and rows.shape[-1] * size % 8 == 0 and aligned else rows


def _move_sinks(rows: torch.Tensor, starts: list[int], sink: list[int], counts: list[int]) -> None:
    """Copy each sequence's sink rows [start, start + sink) up by counts[b] rows, in place."""
    rows = as_words(rows)
    if len(set(zip(starts, sink, counts))) == 1:
        start, s, c = starts[0], sink[0], counts[0]
        if s and c:
            rows[..., start + c:start + c + s, :] = rows[..., start:start + s, :].clone()
        return
    for b, (start, s, c) in enumerate(zip(starts, sink, counts)):
        if s and c:
            rows[b, :, start + c:start + c + s, :] = rows[b, :, start:start + s, :].clone()

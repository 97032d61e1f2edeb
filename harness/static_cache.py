"""Static decode for three-region caches: fixed buffers, lengths on the device, one CUDA graph per generation.

    state = freeze(cache, max_new_tokens, attention_mask)        # after the prefill (eager)
    step = DecodeStep(model, cache, state, graph=True)           # CUDA: captured on its second call
    step = DecodeStep(model, cache, state, graph=True, compile_step=True)   # + RMSNorm/MLP/RoPE fused (compiled_step)
    logits = step(next_ids, position_ids)                        # [B, 1, V], one token per sequence
    tokens = static_generate(model, enc, cache, max_new_tokens, eos_ids, pad_id, graph=True)  # all of the above

`freeze` gives every full-attention layer a full-precision buffer of sink + recent + page rows and a
packed history sized for the whole generation (the identity, BF16: a full-precision buffer for every row
of the generation, so BF16 decodes through the same kernel and graph as the quantizers), and puts the
lengths the decode kernel reads in device tensors shared by all layers. A decode step then changes no shape, allocates nothing the kernels keep
and reads no host state, so CUDA captures it once and replays it: the host cost of a step (about
2,700 kernel launches for Qwen3-4B, results/bench/bench_throughput_profile.md) becomes one graph launch.
Between replays, when a sequence's recent window has grown by a page, its oldest page is demoted into
its history in place, by the rule of the dynamic cache (`ThreeRegionLayer._demote`, per sequence), so a frozen
cache holds exactly the rows the dynamic one would: eagerly, or with a CUDA-graph step as a demotion graph of its
own (harness/demotion_graph.py).
"""
from __future__ import annotations

import math
import weakref
from contextlib import nullcontext
from functools import lru_cache
from typing import NamedTuple

import torch

from harness.cache import (KVView, RowIndex, ThreeRegionLayer, as_words, decode_demotion, demote_rows, set_lengths,
                           set_padding)
from harness.compiled_step import compile_step_refusal, compiled_parts
from harness.demotion_graph import DemotionGraphs, demotion_graph_refusal
from harness.placement import on_device
from harness.segmented_graph import SegmentedGraph
from kernels.step_rows import write_step_rows, write_step_rows_reference


class DeviceLengths(NamedTuple):
    """The device tensors of a frozen cache's regions on one GPU (a model over several keeps one per GPU)."""

    hist_len: torch.Tensor     # int32 [B]
    fp_len: torch.Tensor       # int32 [B]
    hist_start: torch.Tensor   # int32 [B]
    fp_start: torch.Tensor     # int32 [B]
    write_pos: torch.Tensor    # long [1]: fp row of the newest token


class StaticState:
    """Region lengths of a frozen cache: host ints (to plan demotions) mirrored by int32 device tensors.

    The layers point at this state (`layer.static`); it points back through weak proxies, so dropping the
    cache frees its buffers without a garbage-collector pass. Every layer has the regions of the first.
    A model split over several GPUs keeps one mirror of the device tensors per GPU (`lengths_on`), each
    updated by the same step, so no layer's kernel reads another GPU's memory.
    """

    def __init__(self, layers: list[ThreeRegionLayer], n_fp: int, max_new_tokens: int):
        first = layers[0]
        self.layers = [weakref.proxy(layer) for layer in layers]
        self.quantizer, self.n_tokens = first.quantizer, first.n_tokens
        self.n_fp = n_fp                                                             # fp rows in use (the buffers hold more)
        self.steps_left = max_new_tokens
        self.batch = first.keys.shape[0]
        self.demotions = None                  # a DemotionGraphs once a CUDA-graph decode step set it
        self.demoted = False                   # whether a decode step demoted a page yet
        devices = dict.fromkeys(layer.keys.device for layer in layers)               # first-use order
        self.mirrors = {str(device): self._device_lengths(device) for device in devices}
        self.hist_len, self.fp_len, self.hist_start, self.fp_start, self.write_pos = \
            self.mirrors[str(first.keys.device)]                                     # the first layer's GPU

    def _device_lengths(self, device) -> DeviceLengths:
        def int32(value):
            return torch.full((self.batch,), value, dtype=torch.int32, device=device)
        write_pos = torch.full((1,), self.n_fp - 1, dtype=torch.long, device=device)
        return DeviceLengths(int32(0), int32(self.n_fp), int32(0), int32(0), write_pos)

    def lengths_on(self, device) -> tuple[torch.Tensor, ...]:
        """(hist_len, fp_len, hist_start, fp_start), int32 [B] each, as mirrored on `device` (a layer's GPU): what
        `decode_attention` reads."""
        return self.mirrors[str(device)][:4]

    def write(self, layer: ThreeRegionLayer, keys: torch.Tensor, values: torch.Tensor):
        """Store one step's rotated keys / values [B, H_kv, 1, D] at the fp row `write_pos` (device index)."""
        if keys.shape[-2] != 1:
            raise ValueError(f"a frozen cache takes one token per sequence per step, got {keys.shape[-2]}.")
        write_pos = self.mirrors[str(layer.keys.device)].write_pos
        if layer.use_kernels:
            with on_device(layer.keys.device):                   # Triton launches on the current GPU
                write_step_rows(layer.keys, layer.values, keys, values, write_pos)      # one launch
        else:
            write_step_rows_reference(layer.keys, layer.values, keys, values, write_pos)
        view = KVView(layer, None, None, 1)
        return view, view

    def advance(self) -> None:
        """The device half of one step (captured with the forward): one more fp row per sequence."""
        for device in self.mirrors:
            self.advance_on(device)

    def advance_on(self, device) -> None:
        """`advance` for the mirror on one device (a segmented capture advances each in its own segment)."""
        mirror = self.mirrors[str(device)]
        mirror.fp_len.add_(1)
        mirror.write_pos.add_(1)

    def stepped(self) -> None:
        """The host half of one step, after the forward ran (or was replayed)."""
        self.n_fp += 1
        self.n_tokens += 1
        self.steps_left -= 1
        for layer in self.layers:
            layer.n_tokens = self.n_tokens

    def demotion_counts(self) -> list[int]:
        """Rows of each sequence the next step's `before_step` demotes (whole pages beyond the recent window)."""
        _, _, recent = self.layers[0].regions()
        return [decode_demotion(r, self.quantizer) for r in recent]

    def demotes_next_step(self) -> bool:
        """Whether the next step starts with a demotion (one step in page_tokens does: its eager row shifts and
        quantize-pack launches come on top of the replayed step)."""
        return max(self.demotion_counts()) > 0

    def next_demotion_sets_up(self) -> bool:
        """Whether the next step's demotion is a one-time cost: a layout's first demotion (its write kernels compile
        on a fresh machine) or its capture as a CUDA graph; not a replay, nor an eager demotion after the first."""
        counts = self.demotion_counts()
        if max(counts) == 0:
            return False
        return not self.demoted if self.demotions is None else self.demotions.sets_up(counts)

    def before_step(self) -> None:
        """Refuse a step beyond the frozen capacity; demote whole pages beyond each recent window (a replayed CUDA
        graph where `demotions` holds one for this demotion, else eagerly)."""
        if self.steps_left <= 0:
            raise ValueError("more decode steps than the max_new_tokens the cache was frozen for.")
        counts = self.demotion_counts()
        if max(counts) == 0:
            return
        for layer in self.layers:
            _check_room(layer, counts)
        with torch.inference_mode():
            trim = self.demotions.demote(counts) if self.demotions is not None else self.demote_on_device(counts)
        self.n_fp -= trim
        self.demoted = True
        self.sync_lengths()

    def demote_on_device(self, counts: list[int], write=None, device: str | None = None,
                         index: RowIndex | None = None) -> int:
        """Every layer's `demote_in_place`, then the fp lengths on the device down by the trim (returned); the host's
        n_fp and the per-sequence lengths are the caller's. write, index: as `demote_rows`' (a graphed demotion's
        device-offset write and its kept row indices, harness/demotion_graph.py; default: indices built once for
        every layer of this call). device: only the layers and the mirror on that device (a cache split over GPUs
        demotes as one graph per GPU)."""
        layers = [layer for layer in self.layers if device is None or str(layer.keys.device) == device]
        mirrors = list(self.mirrors.values()) if device is None else [self.mirrors[device]]
        index = RowIndex() if index is None else index
        for layer in layers:                            # every layer has the same regions, so the same trim
            trim = demote_in_place(layer, counts, write, index)
        for mirror in mirrors:
            mirror.fp_len.sub_(trim)
            mirror.write_pos.sub_(trim)
        return trim

    def sync_lengths(self) -> None:
        """Copy the host's per-sequence history lengths and fp starts to the device tensors (no host sync)."""
        first = self.layers[0]
        _, hist, _ = first.regions()
        starts = first.fp_starts()
        for mirror in self.mirrors.values():
            set_lengths(mirror.hist_len, hist)
            set_lengths(mirror.fp_start, starts)


def _check_room(layer: ThreeRegionLayer, counts: list[int]) -> None:
    """ValueError where appending counts[b] tokens to a history would pass its frozen capacity."""
    for history in (layer.history_k, layer.history_v):
        if max(held + n for held, n in zip(history.lengths, counts)) > history.capacity():
            raise ValueError("the frozen history is full: more decode steps than it was sized for.")


def demote_in_place(layer: ThreeRegionLayer, counts: list[int], write=None, index: RowIndex | None = None) -> int:
    """`demote_rows` into the fixed buffers, with each sink moved up behind its demoted rows and the fp rows shifted
    down over the rows no sequence uses; returns the rows shifted out. Where every sequence's sink starts at row 0
    and all demote one count c (a static decode's steady state), moving the sink up by c and everything down by c
    would leave the sink where it was: only the rows after the demoted ones move (the same bytes in every row, half
    the copies). Otherwise (`_demote_by_gather`) one gather per buffer takes both the demoted rows and every kept row
    from its new place."""
    n_fp, sink = layer.fp_rows, sinks_at_row_zero(layer, counts)
    if sink is not None:
        demote_rows(layer, counts, write, move_sinks=False)
        _shift_down(layer, sink + counts[0], n_fp, counts[0])
        return counts[0]
    return _demote_by_gather(layer, counts, write, RowIndex() if index is None else index)


def _demote_by_gather(layer: ThreeRegionLayer, counts: list[int], write, index: RowIndex) -> int:
    """`demote_rows` and the moves of `demote_in_place` for sequences that differ: per buffer, one gather of each
    sequence's `width` demoted rows followed by its kept rows in their new places (new row j holds old row j + trim,
    or, where its sink lands (up by its count c), old row j + trim - c), the write of the first and one copy of the
    rest; the rows below a sink's new place are unused (copied, never read). Returns the trim."""
    sink, _, recent = layer.regions()
    width, trim, sources = _gather_sources(layer.fp_rows, tuple(sink), tuple(recent), tuple(counts),
                                           layer.keys.shape[-2] - 1)
    kept = layer.fp_rows - trim
    source = index(sources, layer.keys.device)                                # [B, width + kept]
    for rows, history in ((layer.keys, layer.history_k), (layer.values, layer.history_v)):
        words = as_words(rows)                                                # [B, H_kv, F, W]
        taken = words.gather(2, source[:, None, :, None].expand(*words.shape[:2], width + kept, words.shape[-1]))
        rows_out = taken[..., :width, :].view(rows.dtype)                     # [B, H_kv, width, D]
        if write is None:
            history.append(rows_out, counts)
        else:
            write(history, rows_out)
        words[..., :kept, :] = taken[..., width:, :]
    return trim


@lru_cache(maxsize=64)
def _gather_sources(n_fp: int, sink: tuple, recent: tuple, counts: tuple, last: int) -> tuple[int, int, tuple]:
    """(width, trim, old row of each gathered row [B, width + kept]) of `_demote_by_gather`, built once per layout
    for every layer."""
    width = max(counts)
    starts = [n_fp - r - s for s, r in zip(sink, recent)]                    # each sequence's first sink row
    trim = min(start + c for start, c in zip(starts, counts))
    sources = []
    for start, s, c in zip(starts, sink, counts):
        demoted = [min(start + s + i, last) for i in range(width)]
        moved = [j + trim - (c if start + c <= j + trim < start + c + s else 0) for j in range(n_fp - trim)]
        sources.append(tuple(demoted + moved))
    return width, trim, tuple(sources)


def sinks_at_row_zero(layer: ThreeRegionLayer, counts: list[int]) -> int | None:
    """The sink rows every sequence keeps at row 0 when all demote one count, else None."""
    sink = layer.regions()[0]
    return sink[0] if set(layer.fp_starts()) == {0} and len(set(zip(sink, counts))) == 1 else None


def _shift_down(layer: ThreeRegionLayer, start: int, end: int, by: int) -> None:
    """fp rows [start, end) of keys and values move down by `by` rows (overlapping: through a copy)."""
    if by == 0 or start >= end:
        return
    for rows in (layer.keys, layer.values):
        words = as_words(rows)                                            # [B, H_kv, F, D * itemsize / 8]
        words[..., start - by:end - by, :] = words[..., start:end, :].clone()


def freeze(cache, max_new_tokens: int, attention_mask: torch.Tensor | None = None) -> StaticState:
    """Give a prefilled cache fixed buffers for `max_new_tokens` decode steps; returns the shared StaticState.

    attention_mask: the prompt's [B, T] padding mask (1 = token, left padding) or None; only read when the
    layers have not learnt their padding from the prefill's attention mask.
    """
    layers = list(getattr(cache, "layers", []))
    refusal = _cache_refusal(layers, getattr(layers[0], "n_tokens", 0) if layers else 0)
    if refusal is None and not layers[0].is_initialized:
        refusal = "static decode needs a prefilled cache."
    if refusal:
        raise ValueError(refusal)
    first = layers[0]
    pad = None if attention_mask is None else attention_mask.int().argmax(dim=-1).tolist()   # first real token
    with torch.inference_mode(first.keys.is_inference()):      # a prefill under inference mode wrote the buffers
        for layer in layers:
            if layer.pad is None and pad is not None:
                layer.pad = pad
            layer.settle()        # the prefill's (last chunk's) demotion, if still pending (unknown padding: none)
    n_fp = first.keys.shape[-2]
    fp_rows = _fp_capacity(first, n_fp, max_new_tokens)
    for layer in layers:
        _fix_buffers(layer, fp_rows, max_new_tokens)
    state = StaticState(layers, n_fp, max_new_tokens)
    for layer in layers:
        layer.static = state
    state.sync_lengths()
    return state


def _fp_capacity(layer: ThreeRegionLayer, n_fp: int, max_new_tokens: int) -> int:
    """Full-precision rows a frozen layer needs: sink + recent window + a page (every later row is demoted),
    or, for the identity (no history), every prompt row plus every decoded one."""
    quantizer = layer.quantizer
    if quantizer.sink_tokens is None:
        return n_fp + max_new_tokens
    sink, _, _ = layer.regions()
    return max(n_fp, max(sink) + quantizer.recent_tokens + quantizer.page_tokens)


def _fix_buffers(layer: ThreeRegionLayer, fp_rows: int, max_new_tokens: int) -> None:
    """fp rows into [B, H_kv, fp_rows, D] buffers; histories sized for every row that can still be demoted."""
    n_fp = layer.keys.shape[-2]
    for name in ("keys", "values"):
        rows = getattr(layer, name)
        buffer = rows.new_zeros(*rows.shape[:2], fp_rows, rows.shape[-1])          # [B, H_kv, fp_rows, D]
        buffer[..., :n_fp, :] = rows
        setattr(layer, name, buffer)
    if layer.history_k is None:                                                     # the identity: fp rows only
        return
    align = math.lcm(layer.quantizer.page_tokens, layer.history_k.spec.group, layer.history_v.spec.group)
    _, hist, recent = layer.regions()
    tokens = max(h + r for h, r in zip(hist, recent)) + max_new_tokens
    for history in (layer.history_k, layer.history_v):
        history.allocate(layer.keys, -(-tokens // align) * align)


class DecodeStep:
    """One decode step over a frozen cache: eager, or (graph=True, CUDA) captured once and replayed (a model split
    over several GPUs as one graph per GPU, harness.segmented_graph).

    The first call runs eagerly (on a side stream when capturing: it compiles the kernels and warms the
    allocator), the second captures the step and replays it, every later call only replays. The returned
    logits [B, 1, V] live in a static buffer: read them before the next call. compile_step=True runs the model's
    RMSNorms, MLPs and RoPE as torch.compile'd kernels (harness.compiled_step), compiled in that first call.
    With graph=True the page demotions between steps are CUDA graphs too (harness.demotion_graph; graph_demotions=False
    keeps them eager, a benchmark's baseline).
    """

    def __init__(self, model, cache, state: StaticState, graph: bool = False, compile_step: bool = False,
                 graph_demotions: bool = True):
        refusal = compile_step_refusal(model) if compile_step else None
        if refusal:
            raise ValueError(refusal)
        if graph and not all(device.startswith("cuda") for device in state.mirrors):
            raise ValueError(f"CUDA-graph decode needs the frozen cache on CUDA devices, got "
                             f"{', '.join(state.mirrors)}; decode it with graph=False (eager steps).")
        if graph and not torch.cuda.is_available():
            raise ValueError("CUDA-graph decode needs a CUDA device.")
        self.model, self.cache, self.state, self.graph = model, cache, state, graph
        self.compile_step = compile_step
        batch, device = state.batch, state.hist_len.device
        self.input_ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.position_ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.cache_position = torch.zeros(1, dtype=torch.long, device=device)
        self.calls, self.cuda_graph, self.logits = 0, None, None
        self.segmented = graph and len(state.mirrors) > 1                # one CUDA graph per GPU (segmented_graph.py)
        if graph and graph_demotions and demotion_graph_refusal(state) is None:
            state.demotions = DemotionGraphs(state)                      # page demotions replayed too

    @property
    def setup_calls(self) -> int:
        """Calls that prepare the step rather than run it at speed: the eager warm-up (it compiles the kernels)
        and, with a CUDA graph, the capture."""
        return 2 if self.graph else 1

    def _forward(self, advance: bool = True) -> torch.Tensor:
        if advance:
            self.state.advance()
        with compiled_parts(self.model) if self.compile_step else nullcontext():
            return self.model(input_ids=self.input_ids, position_ids=self.position_ids,
                              cache_position=self.cache_position, past_key_values=self.cache,
                              use_cache=True).logits                                    # [B, 1, V]

    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """input_ids, position_ids: [B, 1] of the token each sequence appends -> logits [B, 1, V]."""
        self.state.before_step()
        self.input_ids.copy_(input_ids)
        self.position_ids.copy_(position_ids)
        self.cache_position.fill_(self.state.n_tokens)
        with torch.inference_mode():
            if not self.graph:
                self.logits = self._forward()
            elif self.calls == 0:
                self.logits = self._warm_up()
            else:
                if self.cuda_graph is None:
                    self._capture()
                self.cuda_graph.replay()
        self.state.stepped()
        self.calls += 1
        return self.logits

    def _warm_up(self) -> torch.Tensor:
        device = self.input_ids.device
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            logits = self._forward()
        torch.cuda.current_stream(device).wait_stream(side)
        return logits

    def _capture(self) -> None:
        if self.segmented:
            self.cuda_graph = SegmentedGraph(self.model)
            self.logits = self.cuda_graph.capture(lambda: self._forward(advance=False), self.input_ids.device,
                                                  on_begin=self.state.advance_on)
            return
        self.cuda_graph = torch.cuda.CUDAGraph()
        device = self.input_ids.device       # the model's GPU, which need not be the current one (device_map cuda:1):
        with torch.cuda.device(device), torch.cuda.graph(self.cuda_graph, stream=torch.cuda.Stream(device=device)):
            self.logits = self._forward()    # torch.cuda.graph's default stream lives on its first capture's GPU


def static_decode_refusal(cache, prompt_tokens: int) -> str | None:
    """Why `static_generate` cannot serve this generation (one sentence), or None when it can."""
    return _cache_refusal(list(getattr(cache, "layers", [])), prompt_tokens)


def _cache_refusal(layers: list, prompt_tokens: int) -> str | None:
    """Why a cache of these layers cannot be frozen after a prompt of `prompt_tokens` tokens, or None."""
    if not layers or not all(isinstance(layer, ThreeRegionLayer) for layer in layers):
        return ("static decode needs three-region layers only (full attention in every layer; sliding-window "
                "layers keep a growing cache).")
    if not all(layer.use_kernels for layer in layers):
        return "static decode needs the Triton kernel path (CUDA, or kernels=triton)."
    if len({layer.quantizer.stores_codes for layer in layers}) > 1:
        return ("static decode needs the same regions in every layer; a quantizer that keeps some layers in full "
                "precision (skip_boundary_layers) decodes through generate.")
    sink = layers[0].quantizer.sink_tokens
    if sink is not None and prompt_tokens < sink:
        return f"static decode needs prompts of at least sink_tokens={sink} tokens, got {prompt_tokens}."
    return None


def prefill(model, enc: dict, cache, chunk: int | None = None) -> torch.Tensor:
    """Run the prompt through `cache` -> the last position's logits [B, V]: one forward, or (chunk) forwards of
    `chunk` tokens each, every later chunk attending to what the cache stores of the earlier ones (their quantized
    history, as a serving engine's chunked prefill reads it), so the activations of one chunk bound the peak."""
    mask = enc["attention_mask"]
    positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)           # [B, T] as generate() builds them
    total = mask.shape[1]
    step = chunk or total
    if step < total:
        set_padding(cache, mask)
    with torch.inference_mode():                          # logits of the last position only: [B, 1, V], not [B, T, V]
        for start in range(0, total, step):
            end = min(start + step, total)
            logits = model(input_ids=enc["input_ids"][:, start:end], attention_mask=mask[:, :end],
                           position_ids=positions[:, start:end], past_key_values=cache, use_cache=True,
                           logits_to_keep=1).logits[:, -1]
    return logits


def static_generate(model, enc: dict, cache, max_new_tokens: int, eos_ids: list[int], pad_id: int, graph: bool,
                    choose=None, stopped=None, compile_step: bool = False, clock=None,
                    prefill_chunk: int | None = None) -> torch.Tensor:
    """Generation like `model.generate`: eager prefill, then frozen-cache decode steps.

    enc: input_ids / attention_mask [B, T] (left padding). choose: logits [B, V] -> tokens [B] (greedy when
    None; a harness.sampling.TokenChooser samples). stopped: the tokens so far (a list of [B]) -> bool [B],
    the sequences whose text reached a stop string, asked every 8 steps. compile_step: as `DecodeStep` takes it.
    clock: a harness.decode_clock.DecodeClock that counts the prefill and the decode steps, or None.
    prefill_chunk: tokens per prefill forward (`prefill`), None for one forward.
    Returns the new tokens [B, <= max_new_tokens]; a sequence that produced an EOS id (or stopped) gets pad_id
    afterwards, and decoding ends once all have.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}.")
    choose = choose or (lambda logits: logits.argmax(-1))
    mask = enc["attention_mask"]
    started = clock.mark() if clock else 0.0
    logits = prefill(model, enc, cache, prefill_chunk)
    started = clock.prefilled(started) if clock else 0.0
    state = freeze(cache, max_new_tokens, mask)
    step = DecodeStep(model, cache, state, graph=graph, compile_step=compile_step)
    next_position = mask.long().sum(-1, keepdim=True)                              # [B, 1]
    eos = torch.tensor(eos_ids or [-1], device=mask.device)
    done = torch.zeros(mask.shape[0], dtype=torch.bool, device=mask.device)
    tokens, decoded = [], 0                      # decoded: steps after the setup already on the clock
    for i in range(max_new_tokens):
        token = torch.where(done, pad_id, choose(logits))                         # [B]
        tokens.append(token)
        done |= torch.isin(token, eos)
        if i == max_new_tokens - 1:
            break
        if i % 8 == 7:                                                             # a host sync every 8 steps
            if stopped is not None:
                done |= stopped(tokens)
            if bool(done.all()):
                break
        demotion_setup = clock is not None and step.calls >= step.setup_calls and state.next_demotion_sets_up()
        if demotion_setup:                      # timed apart like the first steps: it compiles or captures once
            started = clock.decoded(started, step.calls - step.setup_calls - decoded)
            decoded = step.calls - step.setup_calls
        logits = step(token[:, None], next_position + i)[:, -1]
        if clock and step.calls == step.setup_calls:                     # compiled (and captured): replays follow
            started = clock.set_up(started, step.setup_calls)
        elif demotion_setup:
            started, decoded = clock.set_up_demotion(started), decoded + 1
    if clock and step.calls:
        if step.calls < step.setup_calls:                                # the generation ended inside the setup
            started = clock.set_up(started, step.calls)
        clock.decoded(started, max(step.calls - step.setup_calls - decoded, 0))
    return torch.stack(tokens, dim=1)

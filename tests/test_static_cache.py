"""A frozen (static) three-region cache decodes exactly like the dynamic one; bad uses are refused early.

CPU: the Triton kernels run under the interpreter. On a GPU box run with TRITON_INTERPRET=0: every test then
runs on CUDA, and the CUDA-graph test replays the captured step.
"""
import sys
from collections import Counter
from contextlib import contextmanager

import pytest
import torch

from harness.quantizer import build_quantizer
from harness.seam import install
from harness.demotion_graph import DemotionGraphs
from harness.static_cache import DecodeStep, freeze

PROMPTS = ["The grass is green. The sky is blue. The sun is yellow. " * 2, "Here we go. There and back again."]
STEPS = 20   # recent 16, page 4: the frozen cache demotes five times
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Triton kernel against the reference path (materialized rows, SDPA): fp32 under the interpreter, fp16 dot operands
# on the GPU (one logit of 200 off by 1.3e-4 on the H100); kernel against the same kernel stays at 1e-4.
KERNEL_VS_REFERENCE_TOL = 1e-4 if DEVICE == "cpu" else 1e-3


def _setup(tiny, tmp_path, monkeypatch, name="oscar", **overrides):
    monkeypatch.setenv("OSCAR_CACHE", str(tmp_path))
    model, tok = tiny("qwen3")
    quantizer = build_quantizer(name, **({"sink": 4, "recent": 16, "page": 4} | overrides))
    quantizer.check(model.config)
    quantizer.prepare(model, tok)
    return model.to(DEVICE), tok, quantizer


def _prompt_positions(mask: torch.Tensor) -> torch.Tensor:
    """generate()'s position ids for a left-padded prompt: [B, T]."""
    return (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)


def static_greedy(model, tok, quantizer, steps=STEPS, device=DEVICE, graph=False, compile_step=False,
                  demotions="default", prompts=PROMPTS):
    """Prefill eagerly, freeze, then greedy-decode with DecodeStep (eagerly, or replaying a CUDA graph; with the
    model's RMSNorms, MLPs and RoPE compiled if compile_step). demotions: "default" (DecodeStep's choice), "eager"
    (graph_demotions=False) or "uncaptured" (a DemotionGraphs' device work run eagerly, e.g. on CPU)."""
    enc = tok(prompts, return_tensors="pt", padding=True).to(device)
    with install(model, quantizer, kernels="triton") as seam, torch.inference_mode():
        cache = seam.new_cache()
        logits = model(**enc, position_ids=_prompt_positions(enc.attention_mask), past_key_values=cache).logits
        state = freeze(cache, steps, enc.attention_mask)
        step = DecodeStep(model, cache, state, graph=graph, compile_step=compile_step,
                          graph_demotions=demotions == "default")
        if demotions == "uncaptured":
            state.demotions = DemotionGraphs(state, capture=False)
        positions = enc.attention_mask.sum(-1, keepdim=True)                        # [B, 1] next position
        tokens, all_logits = [], [logits[:, -1]]
        for _ in range(steps - 1):
            tokens.append(all_logits[-1].argmax(-1, keepdim=True))                   # [B, 1]
            all_logits.append(step(tokens[-1], positions)[:, -1].clone())
            positions = positions + 1
        tokens.append(all_logits[-1].argmax(-1, keepdim=True))
    return torch.cat(tokens, dim=1), all_logits, cache, state


def dynamic_greedy(model, tok, quantizer, steps=STEPS, kernels="triton", prompts=PROMPTS):
    enc = tok(prompts, return_tensors="pt", padding=True).to(DEVICE)
    with install(model, quantizer, kernels=kernels) as seam, torch.inference_mode():
        cache = seam.new_cache()
        out = model.generate(**enc, max_new_tokens=steps, min_new_tokens=steps, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, pad_token_id=tok.pad_token_id, past_key_values=cache)
    return out.sequences[:, enc.input_ids.shape[1]:], out.logits, cache


def test_frozen_cache_decodes_like_the_dynamic_cache(tiny, tmp_path, monkeypatch):
    model, tok, quantizer = _setup(tiny, tmp_path, monkeypatch)
    dyn_tokens, dyn_logits, dyn_cache = dynamic_greedy(model, tok, quantizer)
    tokens, logits, cache, state = static_greedy(model, tok, quantizer)
    assert torch.equal(tokens, dyn_tokens)
    for a, b in zip(logits, dyn_logits):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    dyn, frozen = dyn_cache.layers[0], cache.layers[0]
    assert frozen.regions() == dyn.regions() and max(dyn.regions()[1]) > 0 and state.n_fp == dyn.keys.shape[-2]
    assert state.hist_len.tolist() == dyn.regions()[1] and state.fp_len.tolist() == [state.n_fp] * 2
    assert state.fp_start.tolist() == dyn.fp_starts()
    for b, n in enumerate(dyn.regions()[1]):                                          # same rows, same codes
        assert torch.equal(frozen.history_k.buffers["codes"][b, :, :n], dyn.history_k.view("codes")[b, :, :n])
    torch.testing.assert_close(frozen.keys[..., :state.n_fp, :], dyn.keys)


def test_bf16_decodes_through_the_frozen_cache_and_kernel(tiny):
    """The identity freezes every prompt row plus room for each decoded one, and its kernel steps (no history)
    give the reference path's tokens and logits (materialized rows, SDPA)."""
    model, tok = tiny("qwen3")
    model.to(DEVICE)
    quantizer = build_quantizer("bf16")
    ref_tokens, ref_logits, _ = dynamic_greedy(model, tok, quantizer, kernels="reference")
    tokens, logits, cache, state = static_greedy(model, tok, quantizer)
    assert torch.equal(tokens, ref_tokens)
    for a, b in zip(logits, ref_logits):
        torch.testing.assert_close(a, b, rtol=KERNEL_VS_REFERENCE_TOL, atol=KERNEL_VS_REFERENCE_TOL)
    prompt = tok(PROMPTS, return_tensors="pt", padding=True).input_ids.shape[1]
    assert state.hist_len.tolist() == [0, 0] and state.n_fp == prompt + STEPS - 1
    assert cache.layers[0].keys.shape[-2] == prompt + STEPS and cache.layers[0].history_k is None


@contextmanager
def _frozen_naive_int2(tiny, tmp_path, monkeypatch, steps=12):
    """Inside: PROMPTS prefilled into naive INT2's cache, frozen for `steps` steps -> (cache, state, step(i)), step(i)
    decoding token 1 at each sequence's position i past its prompt."""
    model, tok, quantizer = _setup(tiny, tmp_path, monkeypatch, name="naive_int2")
    enc = tok(PROMPTS, return_tensors="pt", padding=True).to(DEVICE)
    with install(model, quantizer, kernels="triton") as seam, torch.inference_mode():
        cache = seam.new_cache()
        model(**enc, position_ids=_prompt_positions(enc.attention_mask), past_key_values=cache)
        state = freeze(cache, steps, enc.attention_mask)
        decode, ids = DecodeStep(model, cache, state), torch.ones(2, 1, dtype=torch.long, device=DEVICE)
        yield cache, state, lambda i: decode(ids, enc.attention_mask.sum(-1, keepdim=True) + i)


def test_frozen_buffers_keep_their_storage(tiny, tmp_path, monkeypatch):
    """A CUDA graph replays fixed addresses: no buffer may be reallocated while decoding."""
    with _frozen_naive_int2(tiny, tmp_path, monkeypatch) as (cache, state, step):
        layer = cache.layers[1]
        before = [t.data_ptr() for t in layer.kernel_operands()]
        for i in range(12):
            step(i)
        assert [t.data_ptr() for t in layer.kernel_operands()] == before
        with pytest.raises(ValueError, match="more decode steps"):
            step(12)


def test_demotes_next_step_says_which_steps_demote_a_page(tiny, tmp_path, monkeypatch):
    """`StaticState.demotes_next_step` is true exactly before the steps whose `before_step` demotes (the history
    grows by a page, the fp rows shrink): one step in page_tokens once the recent window is full."""
    with _frozen_naive_int2(tiny, tmp_path, monkeypatch) as (cache, state, step):
        said, did = [], []
        for i in range(12):
            said.append(state.demotes_next_step())
            history = sum(cache.layers[0].regions()[1])
            step(i)
            did.append(sum(cache.layers[0].regions()[1]) > history)
    assert said == did and 2 <= sum(did) <= 4          # 12 steps, pages of 4 rows


def test_a_dropped_frozen_cache_is_freed_without_a_gc_pass(tiny, tmp_path, monkeypatch):
    """Layers, their StaticState and its demotion graphs must not form a reference cycle: the buffers (and, on the GPU,
    the graphs, whose release must not land inside a later capture) go with the last reference."""
    import gc
    import weakref
    model, tok, quantizer = _setup(tiny, tmp_path, monkeypatch, name="naive_int2")
    enc = tok(PROMPTS, return_tensors="pt", padding=True).to(DEVICE)
    gc.disable()
    try:
        with install(model, quantizer, kernels="triton") as seam, torch.inference_mode():
            cache = seam.new_cache()
            model(**enc, position_ids=_prompt_positions(enc.attention_mask), past_key_values=cache)
            state = freeze(cache, 4, enc.attention_mask)
            state.demotions = DemotionGraphs(state, capture=False)         # as DecodeStep(graph=True) sets it
            step = DecodeStep(model, cache, state)
            step(torch.ones(2, 1, dtype=torch.long, device=DEVICE), enc.attention_mask.sum(-1, keepdim=True))
            layer, buffer = weakref.ref(cache.layers[0]), weakref.ref(cache.layers[0].keys)
            demotions = weakref.ref(state.demotions)
            del cache, step, state
        assert layer() is None and buffer() is None and demotions() is None
    finally:
        gc.enable()


def test_freeze_refuses_what_cannot_be_static(tiny, tmp_path, monkeypatch):
    model, tok, quantizer = _setup(tiny, tmp_path, monkeypatch, name="naive_int2")
    enc = tok(PROMPTS, return_tensors="pt", padding=True).to(DEVICE)
    with install(model, quantizer, kernels="reference") as seam, torch.inference_mode():
        cache = seam.new_cache()
        model(**enc, past_key_values=cache)
        with pytest.raises(ValueError, match="kernel path"):
            freeze(cache, 4)
    gemma = tiny("gemma3")[0].to(DEVICE)
    with install(gemma, build_quantizer("naive_int2"), kernels="triton") as seam:
        with pytest.raises(ValueError, match="sliding-window"):
            freeze(seam.new_cache(), 4)


@pytest.mark.parametrize("name", ["bf16", "oscar"])
def test_compiled_step_decodes_like_the_uncompiled_one(name, tiny, tmp_path, monkeypatch):
    """The step with the model's RMSNorms, MLPs and RoPE compiled: the same tokens, logits within float noise; every
    compiled piece ran in every step, and the model leaves the step with its stock forwards."""
    from harness import compiled_step
    if name == "bf16":                                                  # the identity takes no window options
        (model, tok), quantizer = tiny("qwen3"), build_quantizer("bf16")
        model.to(DEVICE)
    else:
        model, tok, quantizer = _setup(tiny, tmp_path, monkeypatch, name=name)
    modeling = sys.modules[type(model.model.layers[0].self_attn).__module__]         # transformers' modeling_qwen3
    stock_rope = modeling.apply_rotary_pos_emb
    plain_tokens, plain_logits, *_ = static_greedy(model, tok, quantizer, steps=6)
    calls, real = Counter(), compiled_step._compiled

    def counted(fn):
        compiled = real(fn)

        def call(*args, **kwargs):
            calls[fn.__qualname__] += 1
            return compiled(*args, **kwargs)
        return call

    monkeypatch.setattr(compiled_step, "_compiled", counted)
    tokens, logits, *_ = static_greedy(model, tok, quantizer, steps=6, compile_step=True)
    assert torch.equal(tokens, plain_tokens)
    for a, b in zip(logits, plain_logits):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    layers, steps = model.config.num_hidden_layers, 5
    assert calls == {"Qwen3RMSNorm.forward": (2 * layers + 1) * steps, "fused_gated_mlp_forward": layers * steps,
                     "normed_rope_for.<locals>.normed_rope": layers * steps}   # input, post-attention; final norm
    # (the q and k norms run inside the RoPE call: harness.deferred_norms)
    assert not any("forward" in vars(m) for m in model.modules())
    assert modeling.apply_rotary_pos_emb is stock_rope


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_graph_replays_the_compiled_step_like_the_uncompiled_graph(tiny, tmp_path, monkeypatch):
    """Compiled in the warm-up, then captured: the replayed compiled step gives the plain graph's tokens."""
    model, tok, quantizer = _setup(tiny, tmp_path, monkeypatch)
    plain_tokens, plain_logits, *_ = static_greedy(model, tok, quantizer, device="cuda", graph=True)
    tokens, logits, *_ = static_greedy(model, tok, quantizer, device="cuda", graph=True, compile_step=True)
    assert torch.equal(tokens, plain_tokens)
    for a, b in zip(logits, plain_logits):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def _segment_graphs_before_layer_1(monkeypatch) -> list:
    """Make every DecodeStep with a graph capture its step segment by segment on one GPU, with a boundary forced
    before layer 1 (as a second GPU would place one); returns the list the SegmentedGraphs are appended to."""
    from harness import segmented_graph, static_cache
    made, init = [], static_cache.DecodeStep.__init__

    def split_graph(m):
        made.append(segmented_graph.SegmentedGraph(m, split_before=(m.model.layers[1],)))
        return made[-1]

    def segmented_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.segmented = True

    monkeypatch.setattr(static_cache, "SegmentedGraph", split_graph)
    monkeypatch.setattr(static_cache.DecodeStep, "__init__", segmented_init)
    return made


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_segmented_capture_replays_like_one_graph(tiny, tmp_path, monkeypatch):
    """The step captured as two graphs on one GPU (a boundary forced before layer 1, as a second GPU would place
    one): the single graph's tokens and logits, step after step."""
    model, tok, quantizer = _setup(tiny, tmp_path, monkeypatch)
    plain_tokens, plain_logits, *_ = static_greedy(model, tok, quantizer, device="cuda", graph=True)
    made = _segment_graphs_before_layer_1(monkeypatch)
    tokens, logits, *_ = static_greedy(model, tok, quantizer, device="cuda", graph=True)
    assert len(made) == 1 and [str(s.device) for s in made[0].segments] == ["cuda:0", "cuda:0"]
    assert torch.equal(tokens, plain_tokens)
    for a, b in zip(logits, plain_logits):
        torch.testing.assert_close(a, b)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_segmented_capture_replays_the_compiled_step_like_one_graph(tiny, tmp_path, monkeypatch):
    """The compiled step (harness.compiled_step) captured as two graphs (a boundary forced before layer 1, as a
    model split over two GPUs gets): the single compiled graph's tokens, logits within float noise."""
    model, tok, quantizer = _setup(tiny, tmp_path, monkeypatch)
    plain_tokens, plain_logits, *_ = static_greedy(model, tok, quantizer, device="cuda", graph=True,
                                                   compile_step=True)
    made = _segment_graphs_before_layer_1(monkeypatch)
    tokens, logits, *_ = static_greedy(model, tok, quantizer, device="cuda", graph=True, compile_step=True)
    assert len(made) == 1 and [str(s.device) for s in made[0].segments] == ["cuda:0", "cuda:0"]
    assert torch.equal(tokens, plain_tokens)
    for a, b in zip(logits, plain_logits):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_segmented_capture_ends_its_capture_when_the_forward_fails(tiny, tmp_path, monkeypatch):
    """A forward that fails inside the second segment's capture (a boundary forced before layer 1): the error
    reaches the caller, no stream is left capturing, the capture's hooks are gone, and the next generation's
    graphs replay the single graph's tokens."""
    model, tok, quantizer = _setup(tiny, tmp_path, monkeypatch)
    plain_tokens, *_ = static_greedy(model, tok, quantizer, device="cuda", graph=True)
    made = _segment_graphs_before_layer_1(monkeypatch)

    def fail_while_capturing(module, args, output):
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("layer 1 failed inside the capture")

    layer = model.model.layers[1]
    handle = layer.register_forward_hook(fail_while_capturing)
    try:
        with pytest.raises(RuntimeError, match="layer 1 failed inside the capture"):
            static_greedy(model, tok, quantizer, device="cuda", graph=True)
    finally:
        handle.remove()
    assert [str(s.device) for s in made[0].segments] == ["cuda:0", "cuda:0"] and not made[0].open
    assert not torch.cuda.is_current_stream_capturing()
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    assert not any(m._forward_pre_hooks for m in made[0].watched)
    assert torch.ones(4, device="cuda").sum().item() == 4.0                  # the GPU still takes work
    tokens, *_ = static_greedy(model, tok, quantizer, device="cuda", graph=True)
    assert len(made) == 2 and torch.equal(tokens, plain_tokens)


def test_compile_step_refusals(tiny):
    model = tiny("qwen3")[0]
    with pytest.raises(ValueError, match="found no module whose class name ends with RMSNorm or MLP"):
        DecodeStep(torch.nn.Linear(2, 2), None, None, compile_step=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("shutil.which", lambda name: None)
        with pytest.raises(ValueError, match="needs a C[+][+] compiler"):
            DecodeStep(model, None, None, compile_step=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
@pytest.mark.skipif(torch.cuda.is_available(), reason="asks a machine without CUDA")
def test_graph_decode_needs_cuda():
    from types import SimpleNamespace
    with pytest.raises(ValueError, match="CUDA"):
        DecodeStep(None, None, SimpleNamespace(mirrors={"cpu": ()}), graph=True)


def test_demotions_are_graphed_on_every_cuda_device_of_a_split_cache():
    """A cache split over GPUs gets graphed demotions (one graph per GPU); one on the CPU or with reference-path
    layers is refused in one sentence."""
    from types import SimpleNamespace
    from harness.demotion_graph import demotion_graph_refusal
    kernel_layer = SimpleNamespace(history_k=object(), use_kernels=True)
    assert demotion_graph_refusal(SimpleNamespace(mirrors={"cuda:0": (), "cuda:1": ()}, layers=[kernel_layer])) is None
    assert "CUDA" in demotion_graph_refusal(SimpleNamespace(mirrors={"cuda:0": (), "cpu": ()}, layers=[kernel_layer]))
    reference_layer = SimpleNamespace(history_k=object(), use_kernels=False)
    assert "kernels" in demotion_graph_refusal(SimpleNamespace(mirrors={"cuda:0": ()}, layers=[reference_layer]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_graph_replays_decode_like_eager_steps(tiny, tmp_path, monkeypatch):
    model, tok, quantizer = _setup(tiny, tmp_path, monkeypatch)
    eager_tokens, eager_logits, *_ = static_greedy(model, tok, quantizer, device="cuda")
    tokens, logits, *_ = static_greedy(model, tok, quantizer, device="cuda", graph=True)
    assert torch.equal(tokens, eager_tokens)
    for a, b in zip(logits, eager_logits):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def _assert_same_cache(cache, other, state) -> None:
    """Every layer's fp rows in use and each sequence's packed history bytes (up to its length) equal."""
    for layer, twin in zip(cache.layers, other.layers):
        assert layer.history_k.lengths == twin.history_k.lengths
        torch.testing.assert_close(layer.keys[..., :state.n_fp, :], twin.keys[..., :state.n_fp, :], rtol=0, atol=0)
        for history, twin_history in ((layer.history_k, twin.history_k), (layer.history_v, twin.history_v)):
            assert history.used == twin_history.used
            for key in ("codes", "scale", "zero"):
                for b, held in enumerate(history.lengths):             # rows past a sequence's length are unused
                    rows = held * history.used[key] // history.length
                    assert torch.equal(history.view(key)[b, :, :rows], twin_history.view(key)[b, :, :rows])


@pytest.mark.parametrize("name", ["oscar", "turboquant_k3v3"])
def test_demotion_at_device_lengths_equals_the_eager_demotion(name, tiny, tmp_path, monkeypatch):
    """A graphed demotion's device work (histories written at the device lengths, host lengths counted apart), run
    eagerly, leaves every byte of the eager demotion, with two sequences of different history lengths."""
    model, tok, quantizer = _setup(tiny, tmp_path, monkeypatch, name=name)
    eager_tokens, _, eager_cache, _ = static_greedy(model, tok, quantizer, demotions="eager")
    tokens, _, cache, state = static_greedy(model, tok, quantizer, demotions="uncaptured")
    assert torch.equal(tokens, eager_tokens) and len(state.demotions.seen) == 1
    lengths = cache.layers[0].history_k.lengths
    assert len(set(lengths)) == 2 and state.hist_len.tolist() == lengths
    _assert_same_cache(cache, eager_cache, state)


# Three prompts shorter than sink + recent window (the tiny models' character tokenizer: 16, 15 and 13 tokens; sink 4,
# recent 16, page 4), as a short task's prompts are: each fills its window at its own step, so their demotions come in
# three phases, each with its own layout. (A prefill demotes every longer prompt down to the window: one phase.)
PHASED_PROMPTS = ["One, two, three.", "A b c d e f g h", "Hello, world!"]


def _phased_layouts(state) -> list[tuple]:
    """The demotion layouts in which some sequences demoted and others did not."""
    return [layout for layout in state.demotions.seen if len({count for *_, count in layout[1]}) > 1]


@pytest.mark.parametrize("name", ["oscar", "naive_int2"])
def test_phased_demotions_at_device_lengths_equal_the_eager_demotion(name, tiny, tmp_path, monkeypatch):
    """Sequences that demote in different steps (their own recent windows, as alone) get one layout per phase: its
    device work (the rows gathered and the sinks moved through kept device indices, every sequence written at its
    device length) leaves every byte of the eager demotion."""
    model, tok, quantizer = _setup(tiny, tmp_path, monkeypatch, name=name)
    eager_tokens, _, eager_cache, _ = static_greedy(model, tok, quantizer, demotions="eager", prompts=PHASED_PROMPTS)
    tokens, _, cache, state = static_greedy(model, tok, quantizer, demotions="uncaptured", prompts=PHASED_PROMPTS)
    assert torch.equal(tokens, eager_tokens)
    assert len(_phased_layouts(state)) >= 2 and len(state.demotions.indices) == len(state.demotions.seen)
    _assert_same_cache(cache, eager_cache, state)


def test_phased_frozen_cache_decodes_like_the_dynamic_cache(tiny, tmp_path, monkeypatch):
    """Sequences demoting in different steps: the frozen cache decodes the dynamic cache's tokens, with each
    sequence's fp rows and codes."""
    import harness.static_cache as static_cache
    model, tok, quantizer = _setup(tiny, tmp_path, monkeypatch)
    demotions = []
    real = static_cache.demote_in_place
    monkeypatch.setattr(static_cache, "demote_in_place", lambda *a, **k: demotions.append(a[1]) or real(*a, **k))
    dyn_tokens, dyn_logits, dyn_cache = dynamic_greedy(model, tok, quantizer, prompts=PHASED_PROMPTS)
    tokens, logits, cache, state = static_greedy(model, tok, quantizer, prompts=PHASED_PROMPTS)
    assert torch.equal(tokens, dyn_tokens) and len({tuple(counts) for counts in demotions}) >= 3   # three phases
    for a, b in zip(logits, dyn_logits):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    dyn, frozen = dyn_cache.layers[0], cache.layers[0]
    sink, hist, recent = dyn.regions()
    assert frozen.regions() == (sink, hist, recent) and state.hist_len.tolist() == hist
    for b, (s, h, r) in enumerate(zip(sink, hist, recent)):
        rows = dyn.keys.shape[-2]
        torch.testing.assert_close(frozen.keys[b, :, state.n_fp - s - r:state.n_fp], dyn.keys[b, :, rows - s - r:])
        assert torch.equal(frozen.history_k.buffers["codes"][b, :, :h], dyn.history_k.view("codes")[b, :, :h])


def test_phased_sink_moves_equal_per_sequence_copies():
    """`_move_sinks` over sequences that differ moves each sink like its own copy: sinks of different lengths, a
    sequence that demotes nothing, one with no sink, overlapping moves."""
    from harness.cache import _move_sinks
    rows = torch.randn(4, 2, 12, 8)
    starts, sink, counts = [1, 0, 3, 2], [3, 2, 0, 4], [4, 0, 4, 2]
    expected = rows.clone()
    for b, (start, s, c) in enumerate(zip(starts, sink, counts)):
        if s and c:
            expected[b, :, start + c:start + c + s] = rows[b, :, start:start + s].clone()
    _move_sinks(rows, starts, sink, counts)
    assert torch.equal(rows, expected)


def test_steady_demotions_leave_the_sink_and_move_the_rest_like_the_full_shift(tiny, tmp_path, monkeypatch):
    """With every sink at row 0 a demotion moves only the rows after the page down (`sinks_at_row_zero`): the cache
    bytes equal those of the sink move and the shift of every fp row, which the first branch takes otherwise."""
    import harness.static_cache as static_cache
    model, tok, quantizer = _setup(tiny, tmp_path, monkeypatch)
    shortcuts = []
    real = static_cache.sinks_at_row_zero
    monkeypatch.setattr(static_cache, "sinks_at_row_zero", lambda *a: shortcuts.append(real(*a)) or shortcuts[-1])
    tokens, _, cache, state = static_greedy(model, tok, quantizer)
    assert shortcuts and all(sink == 4 for sink in shortcuts)
    monkeypatch.setattr(static_cache, "sinks_at_row_zero", lambda *a: None)
    full_tokens, _, full_cache, _ = static_greedy(model, tok, quantizer)
    assert torch.equal(tokens, full_tokens)
    _assert_same_cache(cache, full_cache, state)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_graphed_demotions_replay_like_eager_ones(tiny, tmp_path, monkeypatch):
    """With a CUDA-graph step the page demotions are captured once and replayed: tokens, logits and every cache
    byte as with eager demotions."""
    model, tok, quantizer = _setup(tiny, tmp_path, monkeypatch)
    eager_tokens, eager_logits, eager_cache, _ = static_greedy(model, tok, quantizer, graph=True, demotions="eager")
    tokens, logits, cache, state = static_greedy(model, tok, quantizer, graph=True)
    assert len(state.demotions.graphs) == 1 and torch.equal(tokens, eager_tokens)
    for a, b in zip(logits, eager_logits):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    _assert_same_cache(cache, eager_cache, state)


def test_every_shipped_quantizers_phases_fit_the_demotion_graphs():
    """A batch of prompts of mixed lengths demotes in up to page_tokens phases, one layout each: every shipped
    quantizer's page fits MAX_LAYOUTS, so no phase of a baseline demotes eagerly where OSCAR's (page 8) replay."""
    from omegaconf import OmegaConf
    from harness.demotion_graph import MAX_LAYOUTS
    from harness.quantizer import CONFIG_DIR, known_quantizers
    pages = {name: OmegaConf.load(CONFIG_DIR / f"{name}.yaml").get("page", 8) for name in known_quantizers()}
    assert pages["kivi2"] == 32 and max(pages.values()) <= MAX_LAYOUTS


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_phased_graphed_demotions_replay_like_eager_ones(tiny, tmp_path, monkeypatch):
    """Sequences demoting in different steps: each phase's layout is captured and replayed, with tokens, logits and
    every cache byte as with eager demotions."""
    model, tok, quantizer = _setup(tiny, tmp_path, monkeypatch)
    eager_tokens, eager_logits, eager_cache, _ = static_greedy(model, tok, quantizer, graph=True, demotions="eager",
                                                               prompts=PHASED_PROMPTS, steps=2 * STEPS)
    tokens, logits, cache, state = static_greedy(model, tok, quantizer, graph=True, prompts=PHASED_PROMPTS,
                                                 steps=2 * STEPS)
    assert torch.equal(tokens, eager_tokens)
    assert len([layout for layout in state.demotions.graphs if layout in _phased_layouts(state)]) >= 2
    for a, b in zip(logits, eager_logits):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    _assert_same_cache(cache, eager_cache, state)


def test_short_prompt_on_the_kernel_path(tiny, tmp_path, monkeypatch):
    """A prompt shorter than the recent window reaches the decode kernel with an empty history."""
    model, tok, quantizer = _setup(tiny, tmp_path, monkeypatch, name="naive_int2", recent=32, page=8)
    enc = tok(["hi there"], return_tensors="pt").to(DEVICE)
    outs = []
    for kernels in ("triton", "reference"):
        with install(model, quantizer, kernels=kernels) as seam, torch.inference_mode():
            outs.append(model.generate(**enc, max_new_tokens=6, do_sample=False, past_key_values=seam.new_cache(),
                                       pad_token_id=tok.pad_token_id))
    assert torch.equal(outs[0], outs[1])


def test_generate_outputs_static_decode_gives_generates_texts(tiny, tmp_path, monkeypatch):
    """The harness's generation: greedy through the frozen cache (+ graph on CUDA) writes generate()'s texts."""
    from harness.task import Example
    from harness.generate import generate_outputs
    model, tok, quantizer = _setup(tiny, tmp_path, monkeypatch)
    examples = [Example(str(i), p, [], max_new_tokens=STEPS) for i, p in enumerate(PROMPTS)]
    texts, paths = {}, {}
    with install(model, quantizer, kernels="triton") as seam:
        for mode in ("off", "on"):
            texts[mode] = generate_outputs(model, tok, examples, seam.new_cache, batch_size=2, stop=["\n\n"],
                                           static_decode=mode, paths=paths)
    assert texts["on"] == texts["off"] and any(texts["on"])
    clock = paths.pop("clock").as_row()
    assert paths == {"generate": 1, "static": 1}
    assert clock["prefills"] == 2 and 2 <= clock["decode_steps"] <= 2 * (STEPS - 2)   # one batch on each path
    assert clock["prefill_s"] > 0 and clock["first_step_s"] > 0 and clock["decode_ms_per_step"] > 0


def test_static_generate_keeps_the_graph_capture_out_of_the_decode_steps(monkeypatch):
    """With a CUDA graph the second call captures the step: it is timed with the first (setup), not among the
    decode steps (the capture made a 14-step QuaRot dry-run cell read 88.9 ms per step against ~18 ms); so is a step
    whose page demotion compiles its kernels or captures its graph (`next_demotion_sets_up`)."""
    import time
    import harness.static_cache as sc
    from harness.decode_clock import DecodeClock
    calls = []

    class FakeStep:                      # a graph step: two slow setup calls, fast replays, a slow first demotion
        setup_calls = 2

        def __init__(self, *args, **kwargs):
            pass

        @property
        def calls(self):
            return len(calls)

        def __call__(self, input_ids, position_ids):
            time.sleep(0.06 if len(calls) < self.setup_calls or len(calls) == 3 else 0.001)
            calls.append(input_ids)
            return torch.zeros(1, 1, 5)                   # logits [B, 1, V]

    class FakeState:
        def next_demotion_sets_up(self):
            return len(calls) == 3                        # the fourth call demotes a page for the first time
    monkeypatch.setattr(sc, "prefill", lambda model, enc, cache, chunk: torch.zeros(1, 5))
    monkeypatch.setattr(sc, "freeze", lambda cache, max_new, mask: FakeState())
    monkeypatch.setattr(sc, "DecodeStep", FakeStep)
    clock = DecodeClock()
    enc = {"input_ids": torch.ones(1, 3, dtype=torch.long), "attention_mask": torch.ones(1, 3, dtype=torch.long)}
    tokens = sc.static_generate(None, enc, None, 6, eos_ids=[], pad_id=0, graph=True, clock=clock)
    row = clock.as_row()
    assert tokens.shape == (1, 6) and len(calls) == 5
    assert row["setup_steps"] == 3 and row["demotion_setups"] == 1 and row["first_step_s"] >= 0.18
    assert row["decode_steps"] == 2 and row["decode_ms_per_step"] < 30      # 5 calls: 2 + 1 setup, 2 replays


def test_decode_clock_counts_one_prefill_and_a_step_per_later_call():
    """generate calls its logits processors once after the prefill and once after each decode forward; the first
    decode step (kernel compiles, graph capture) is counted apart."""
    import time
    from harness.decode_clock import ClockProcessor, DecodeClock
    clock = DecodeClock()
    timer = ClockProcessor(clock)
    scores = torch.zeros(1, 4)
    for _ in range(5):
        time.sleep(0.002)
        assert timer(None, scores) is scores
    timer.finish()
    row = clock.as_row()
    assert row["prefills"] == 1 and row["decode_steps"] == 3 and row["prefill_s"] >= 0.002
    assert row["first_step_s"] >= 0.002 and row["decode_ms_per_step"] >= 2.0
    assert DecodeClock().as_row()["decode_ms_per_step"] is None


def test_sampling_is_seeded_per_example_and_the_same_on_both_paths(tiny, tmp_path, monkeypatch):
    """Sampled text depends on (seed, example) only: not on the decode path, the batch, or the other examples."""
    from harness.task import Example
    from harness.generate import generate_outputs
    model, tok, quantizer = _setup(tiny, tmp_path, monkeypatch)
    examples = [Example(str(i), p, [], max_new_tokens=STEPS) for i, p in enumerate(PROMPTS)]
    sampling = {"do_sample": True, "temperature": 1.5, "top_p": 0.95, "top_k": 50}
    with install(model, quantizer, kernels="triton") as seam:
        def run(exs, seed, mode, batch_size=2):
            return generate_outputs(model, tok, exs, seam.new_cache, batch_size=batch_size, sampling=sampling,
                                    static_decode=mode, seed=seed)
        static, eager = run(examples, 0, "on"), run(examples, 0, "off")
        alone = run(examples[1:2], 0, "on", batch_size=1)
        other_seed = run(examples, 1, "on")
    assert static == eager and any(static)
    assert alone == static[1:2]
    assert other_seed != static


def test_static_decode_on_refuses_reference_caches(tiny, tmp_path, monkeypatch):
    from harness.task import Example
    from harness.generate import generate_outputs
    model, tok, quantizer = _setup(tiny, tmp_path, monkeypatch, name="naive_int2")
    examples = [Example("0", PROMPTS[0], [], max_new_tokens=4)]
    with install(model, quantizer, kernels="reference") as seam:
        with pytest.raises(ValueError, match="kernel path"):
            generate_outputs(model, tok, examples, seam.new_cache, static_decode="on")
        assert generate_outputs(model, tok, examples, seam.new_cache, static_decode="auto")   # falls back to generate
    with pytest.raises(ValueError, match="static_decode must be"):
        generate_outputs(model, tok, examples, None, static_decode="fast")


@pytest.mark.parametrize("name", ["naive_int2", "kivi2"])
def test_appends_with_room_store_the_kernel_parts_in_place_like_the_copying_path(name, monkeypatch):
    """PackedHistory.append at one held length into buffers that hold the rows (a frozen cache's demotion) has the
    write kernel store its parts straight into them; the bytes equal those of the copying path, and a ragged append
    still copies."""
    from harness.packed_history import PackedHistory
    from harness.quantizer import build_quantizer
    quantizer = build_quantizer(name)
    quantizer._resolve(64)
    gen = torch.Generator().manual_seed(0)
    rows = [torch.randn(2, 2, 32, 64, generator=gen).to(DEVICE) for _ in range(3)]   # [B, H_kv, n, D]
    histories = []
    for direct in (True, False):
        history = PackedHistory(quantizer, quantizer.key_spec, use_kernels=True)
        history.allocate(rows[0], 128)
        if not direct:
            monkeypatch.setattr(history, "_write_views", lambda *args: None)
        ops, calls = quantizer.kernel_ops(), []
        monkeypatch.setattr(ops, "quantize_pack", lambda r, spec, out=None, real=ops.quantize_pack:
                            calls.append(out is not None) or real(r, spec, out=out))
        for chunk in rows:
            history.append(chunk)
        monkeypatch.undo()
        assert calls == [direct] * 3 and history.lengths == [96, 96]
        histories.append(history)
    for key in ("codes", "scale", "zero"):
        assert torch.equal(histories[0].view(key), histories[1].view(key))
    assert histories[0]._write_views(rows[0], [32, 0]) is None                  # ragged: the copying path


@pytest.mark.parametrize("name", ["naive_int2", "kivi2", "turboquant_k3v3"])
def test_writes_at_device_lengths_equal_appends(name):
    """PackedHistory.write_at (offsets read on the device) + count_appended (the host's lengths) store the bytes,
    lengths and used rows of `append`, with batch rows of different held lengths."""
    from harness.packed_history import DeviceOffsets, PackedHistory
    quantizer = build_quantizer(name)
    quantizer._resolve(64)
    gen = torch.Generator().manual_seed(0)
    first = torch.randn(2, 2, 32, 64, generator=gen).to(DEVICE)                      # [B, H_kv, n, D]
    pages = [torch.randn(2, 2, 32, 64, generator=gen).to(DEVICE) for _ in range(2)]
    histories = []
    for at_device in (True, False):
        history = PackedHistory(quantizer, quantizer.key_spec, use_kernels=True)
        history.allocate(first, 128)
        history.append(first, [32, 0])                                               # held: 32 and 0
        for page in pages:
            if at_device:
                history.write_at(page, DeviceOffsets(torch.tensor(history.lengths, dtype=torch.int32, device=DEVICE)))
                history.count_appended([32, 32])
            else:
                history.append(page)
        histories.append(history)
    assert histories[0].lengths == histories[1].lengths == [96, 64]
    assert histories[0].used == histories[1].used
    for key in ("codes", "scale", "zero"):
        assert torch.equal(histories[0].view(key), histories[1].view(key))

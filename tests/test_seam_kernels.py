"""The seam with the Triton kernels (interpreter on CPU, compiled on a GPU) generates what the reference path does."""
import pytest
import torch

from harness.quantizer import build_quantizer
from harness.seam import install

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = 1e-3 if DEVICE == "cpu" else 2e-2  # fp32 in the interpreter; fp16 dot operands on the GPU
PROMPTS = ["The grass is green. The sky is blue. The sun is yellow. " * 3, "Here we go. There and back again."]


def greedy(model, tok, quantizer, kernels, steps=12):
    enc = tok(PROMPTS, return_tensors="pt", padding=True).to(DEVICE)
    with install(model, quantizer, kernels=kernels) as seam, torch.inference_mode():
        cache = seam.new_cache()
        out = model.generate(**enc, max_new_tokens=steps, min_new_tokens=steps, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, pad_token_id=tok.pad_token_id, past_key_values=cache)
    return out, cache


@pytest.mark.parametrize("name, overrides", [
    ("naive_int2", {}),
    ("kivi2", {"recent": 32, "page": 32}),
    ("oscar", {"sink": 8, "recent": 32}),
])
def test_kernel_path_matches_reference_path(tiny, tmp_path, monkeypatch, name, overrides):
    monkeypatch.setenv("OSCAR_CACHE", str(tmp_path))
    model, tok = tiny("qwen3")
    quantizer = build_quantizer(name, **overrides)
    quantizer.check(model.config)
    quantizer.prepare(model, tok)
    model.to(DEVICE)
    ref, ref_cache = greedy(model, tok, quantizer, "reference")
    ker, ker_cache = greedy(model, tok, quantizer, "triton")
    layer = ker_cache.layers[0]
    assert layer.use_kernels and layer.history_length > 0 and "mirror" not in layer.history_k.buffers
    assert torch.equal(ref.sequences, ker.sequences)
    ref_history, history = ref_cache.layers[0].history_k, layer.history_k
    assert ref_history.lengths == history.lengths
    for b, n in enumerate(history.lengths):                                          # each sequence's own rows
        assert torch.equal(ref_history.view("codes")[b, :, :n], history.view("codes")[b, :, :n])
    for a, b in zip(ref.logits, ker.logits):
        torch.testing.assert_close(a, b, rtol=TOL, atol=TOL)


def test_kernels_auto_means_reference_on_cpu(tiny):
    model, _ = tiny("llama")
    with install(model, build_quantizer("naive_int2"), kernels="auto") as seam:
        assert seam.use_kernels is False


def test_unknown_kernel_mode_is_refused(tiny):
    model, _ = tiny("llama")
    with pytest.raises(ValueError, match="kernel mode"):
        with install(model, build_quantizer("bf16"), kernels="fast"):
            pass


def test_decode_lengths_are_built_once_per_step_and_shared_by_layers():
    from harness.cache import ThreeRegionLayer
    quantizer = build_quantizer("naive_int2", recent=8, page=8)
    memo = {}
    layers = [ThreeRegionLayer(quantizer, i, step_memo=memo) for i in range(2)]
    rows = torch.randn(2, 2, 40, 128)                                                # [B, H_kv, T, D]
    for layer in layers:
        layer.update(rows, rows)
    mask = torch.ones(2, 1, 1, 41, dtype=torch.bool)
    mask[1, ..., :5] = False                                                         # second sequence left-padded
    first, second = (layer.decode_lengths(mask, rows.device) for layer in layers)
    assert all(a is b for a, b in zip(first, second))                                # built once, shared
    assert layers[1].pad == [0, 5] and layers[1].regions()[1] == [32, 27]            # per sequence: 40 and 35 tokens
    assert first[0].tolist() == [32, 27] and first[2].tolist() == [0, 0]
    assert first[1].tolist() == [8, 8] and first[3].tolist() == [0, 0]               # both recent windows: 8 rows
    one = rows[..., :1, :]
    for layer in layers:                                                             # next step: rebuilt once
        layer.update(one, one)
    mask = torch.cat([mask, mask[..., -1:]], dim=-1)
    third, fourth = (layer.decode_lengths(mask, rows.device) for layer in layers)
    assert third[1] is not first[1] and all(a is b for a, b in zip(third, fourth))
    assert third[1].tolist() == [9, 9]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_grouped_masked_prefill_matches_transformers_repeat_path_with_less_memory():
    """A masked GQA prefill on the GPU: the seam's grouped SDPA gives transformers' result (which repeats K/V per
    query head first) and holds less memory than it (results/bench/prefill_memory.md)."""
    from types import SimpleNamespace

    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from harness.seam import gqa_sdpa, grouped_masked_prefill
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, 8, 256, 64, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(2, 2, 2048, 64, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    mask = torch.ones(2, 1, 256, 2048, dtype=torch.bool, device="cuda").tril(2048 - 256)
    mask[1, :, :, :100] = False                                                    # the second row's left padding
    assert grouped_masked_prefill(q, k, v, mask) and not grouped_masked_prefill(q[:, :, :1], k, v, mask)
    module = SimpleNamespace(num_key_value_groups=4, is_causal=True, training=False)
    peaks = []
    for attend in (lambda: sdpa_attention_forward(module, q, k, v, mask, scaling=0.125)[0],
                   lambda: gqa_sdpa(q, k, v, mask, 0.125, 0.0)):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        outs = attend()
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - base)
        if len(peaks) == 1:
            reference = outs
    assert outs.shape == reference.shape == (2, 256, 8, 64)
    assert (outs.float() - reference.float()).abs().max().item() < 2e-2
    assert peaks[1] < peaks[0]


def _chunk_inputs(device, dtype, t_q=96, t_kv=320):
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(2, 8, t_q, 64, device=device, dtype=dtype, generator=gen)
    k, v = (torch.randn(2, 2, t_kv, 64, device=device, dtype=dtype, generator=gen) for _ in range(2))
    mask = torch.ones(t_q, t_kv, dtype=torch.bool, device=device).tril(t_kv - t_q)[None, None].expand(2, 1, -1, -1)
    return q, k, v, mask


def test_a_later_chunk_of_one_unpadded_sequence_needs_no_mask():
    """kvq_mask leaves out exactly the plain causal mask of a chunk whose queries end with its keys (on the GPU),
    and causal_chunk_sdpa attends like SDPA under that explicit mask."""
    from transformers.masking_utils import causal_mask_function, sliding_window_causal_mask_function

    from harness.seam import causal_chunk_sdpa, gqa_sdpa, kvq_mask, lower_right_causal
    plain = dict(mask_function=causal_mask_function, attention_mask=None, local_size=None)
    assert lower_right_causal(64, 192, 128, 0, **plain)                            # the third chunk of 64
    assert not lower_right_causal(64, 64, 0, 0, **plain)                           # the first: SDPA's causal flag
    assert not lower_right_causal(1, 192, 191, 0, **plain)                         # a decode step
    assert not lower_right_causal(64, 256, 128, 0, **plain)                        # keys beyond the queries (static)
    padded = torch.ones(2, 192, dtype=torch.long)
    assert lower_right_causal(64, 192, 128, 0, **(plain | {"attention_mask": padded}))
    padded[1, :5] = 0
    assert not lower_right_causal(64, 192, 128, 0, **(plain | {"attention_mask": padded}))
    assert not lower_right_causal(64, 192, 128, 0, **(plain | {"local_size": 32}))
    assert not lower_right_causal(64, 192, 128, 0, **(plain | {"mask_function": sliding_window_causal_mask_function(32)}))
    cpu_mask = kvq_mask(2, 64, 192, 128, 0, device="cpu")                          # the CPU keeps transformers' mask
    assert cpu_mask.shape == (2, 1, 64, 192) and cpu_mask[0, 0, 0].sum() == 129
    q, k, v, mask = _chunk_inputs("cpu", torch.float32)
    torch.testing.assert_close(causal_chunk_sdpa(q, k, v, 0.125, 0.0), gqa_sdpa(q, k, v, mask, 0.125, 0.0))


def _padded_chunk(device, dtype, pads, t_q=96, t_kv=320):
    """A chunk of a left-padded batch: q, k, v and transformers' causal + padding mask [B, 1, T_q, T_kv]."""
    q, k, v, mask = _chunk_inputs(device, dtype, t_q, t_kv)
    mask = mask.clone()
    for b, pad in enumerate(pads):
        mask[b, :, :, :pad] = False
    return q, k, v, mask


def test_a_padded_batch_attends_sequence_by_sequence_like_its_mask():
    """padded_causal_sdpa: each sequence's rows past its padding as SDPA under the batch's causal + padding mask;
    rows inside the padding (here the second sequence's first 40 rows of the chunk) get zeros."""
    from harness.seam import gqa_sdpa, padded_causal_sdpa, padded_causal_prefill
    q, k, v, mask = _padded_chunk("cpu", torch.float32, pads=[0, 264])
    out, masked = padded_causal_sdpa(q, k, v, [0, 264], 0.125, 0.0), gqa_sdpa(q, k, v, mask, 0.125, 0.0)
    torch.testing.assert_close(out[0], masked[0])
    torch.testing.assert_close(out[1, 40:], masked[1, 40:])
    assert out[1, :40].abs().max() == 0
    assert padded_causal_sdpa(q, k, v, [0, 320], 0.125, 0.0)[1].abs().max() == 0   # a chunk of padding only
    assert not padded_causal_prefill(q, mask, None, None)                            # the CPU keeps the mask
    assert not padded_causal_prefill(q, mask, 32, None) and not padded_causal_prefill(q, None, None, None)


def test_a_padded_prefill_over_the_seams_cache_gets_its_padding_rows_alone(tiny):
    """On the GPU, over the seam's own cache (registered while it is installed, the config left as it is), kvq_mask
    hands a padded prefill only its padding rows [B, 1, 1, T_kv], which expand to transformers' mask; a layer that
    cannot attend by its padding (here plain tensors) expands them itself and attends as under the full mask."""
    from types import SimpleNamespace

    from harness.seam import causal_with_padding, kvq_attention, kvq_mask, padding_rows
    from transformers.masking_utils import causal_mask_function
    padded = torch.ones(2, 192, dtype=torch.long)
    padded[1, :70] = 0
    model = tiny("qwen3")[0]
    config_json = model.config.to_json_string(use_diff=False)
    with install(model, build_quantizer("naive_int2")):
        assert model.config.to_json_string(use_diff=False) == config_json       # (OSCAR's artifact key hashes it)
        for q_length, q_offset in ((64, 128), (192, 0)):                           # a later chunk, the whole prompt
            args = (2, q_length, 192, q_offset, 0)
            full = kvq_mask(*args, attention_mask=padded, device="cpu")             # transformers' [2, 1, q, 192]
            rows = kvq_mask(*args, attention_mask=padded, device="cuda", config=model.config)
            assert rows.shape == (2, 1, 1, 192) and rows.dtype == torch.bool
            assert torch.equal(causal_with_padding(rows, q_length), full)
        unpadded = torch.ones(2, 192, dtype=torch.long)                          # no padding: SDPA's causal flag
        assert kvq_mask(2, 192, 192, 0, 0, attention_mask=unpadded, device="cuda", config=model.config) is None
    assert not padding_rows(64, 192, 128, 0, causal_mask_function, padded, None, model.config)   # uninstalled
    q, k, v, mask = _padded_chunk("cpu", torch.float32, pads=[0, 264])
    module = SimpleNamespace(num_key_value_groups=q.shape[1] // k.shape[1], is_causal=True, training=False)
    out, _ = kvq_attention(module, q, k, v, mask[:, :, -1:, :], scaling=0.125)  # the padding rows [B, 1, 1, T_kv]
    expected, _ = kvq_attention(module, q, k, v, mask, scaling=0.125)
    torch.testing.assert_close(out, expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_causal_chunk_sdpa_matches_the_masked_chunk_on_the_gpu_with_less_memory():
    """GPU: no [B, 1, T_q, T_kv] mask, the masked grouped SDPA's result; a padded batch sequence by sequence too."""
    from harness.seam import causal_chunk_sdpa, gqa_sdpa, padded_causal_prefill, padded_causal_sdpa
    q, k, v, mask = _chunk_inputs("cuda", torch.bfloat16, t_q=512, t_kv=4096)
    mask = mask.contiguous()
    out, masked = causal_chunk_sdpa(q, k, v, 0.125, 0.0), gqa_sdpa(q, k, v, mask, 0.125, 0.0)
    assert (out.float() - masked.float()).abs().max().item() < 2e-2
    peaks = []
    for attend in (lambda: gqa_sdpa(q, k, v, mask, 0.125, 0.0), lambda: causal_chunk_sdpa(q, k, v, 0.125, 0.0)):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        attend()
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - base)
    assert peaks[1] < peaks[0]
    q, k, v, mask = _padded_chunk("cuda", torch.bfloat16, pads=[0, 3700], t_q=512, t_kv=4096)
    assert padded_causal_prefill(q, mask, None, None)
    out, masked = padded_causal_sdpa(q, k, v, [0, 3700], 0.125, 0.0), gqa_sdpa(q, k, v, mask, 0.125, 0.0)
    assert (out[0].float() - masked[0].float()).abs().max().item() < 2e-2
    assert (out[1, 116:].float() - masked[1, 116:].float()).abs().max().item() < 2e-2

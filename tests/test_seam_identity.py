"""bf16 through the seam must reproduce the stock model: same greedy tokens, logits within fp32 tolerance."""
import pytest
import torch

from harness.cache import ThreeRegionLayer
from harness.quantizer import build_quantizer
from harness.seam import install

PROMPTS = ["The grass is green. The sky is blue. The magic number is 4213. Here we go again and again.",
           "A short one."]


def _generate(model, tok, cache=None, steps=36):
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    assert enc["attention_mask"][1, 0] == 0, "second prompt must be left-padded"
    kwargs = {} if cache is None else {"past_key_values": cache}
    with torch.inference_mode():
        return model.generate(**enc, max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                              output_logits=True, return_dict_in_generate=True, pad_token_id=tok.pad_token_id,
                              **kwargs)


@pytest.mark.parametrize("arch", ["qwen3", "llama", "gemma3"])
def test_bf16_reproduces_stock_generation(tiny, arch):
    model, tok = tiny(arch)
    stock = _generate(model, tok)
    with install(model, build_quantizer("bf16")) as seam:
        cache = seam.new_cache()
        ours = _generate(model, tok, cache)
        assert seam.patched_layers == model.config.num_hidden_layers
    assert torch.equal(stock.sequences, ours.sequences)
    assert len(ours.logits) == 36
    for a, b in zip(stock.logits, ours.logits):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    quantized_layers = [layer for layer in cache.layers if isinstance(layer, ThreeRegionLayer)]
    assert quantized_layers, "the seam's cache layers were not used"
    assert all(layer.get_seq_length() == stock.sequences.shape[1] - 1 for layer in quantized_layers)


def test_gemma3_keeps_stock_sliding_layers(tiny):
    model, tok = tiny("gemma3")
    with install(model, build_quantizer("bf16")) as seam:
        kinds = [type(layer).__name__ for layer in seam.new_cache().layers]
    assert kinds == ["DynamicSlidingWindowLayer", "ThreeRegionLayer"]


def test_uninstall_restores_attention_implementation(tiny):
    model, _ = tiny("qwen3")
    before = model.config._attn_implementation
    with install(model, build_quantizer("bf16")):
        assert model.config._attn_implementation == "kvq"
    assert model.config._attn_implementation == before


def test_unsupported_architecture_is_refused_by_name():
    from transformers import GPT2Config
    from harness.seam import check_architecture
    with pytest.raises(ValueError, match="'gpt2' is not supported"):
        check_architecture(GPT2Config())


def _teacher_forced_logits(model, ids, cache=None, prompt_len=12):
    """Last-position logits of a prefill of ids[:, :prompt_len], then of each later token fed one at a time."""
    kwargs = {} if cache is None else {"past_key_values": cache}
    with torch.inference_mode():
        out = model(input_ids=ids[:, :prompt_len], use_cache=True, **kwargs)
        logits, cache = [out.logits[:, -1].float()], out.past_key_values
        for t in range(prompt_len, ids.shape[1]):
            out = model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True)
            logits.append(out.logits[:, -1].float())
    return torch.stack(logits)                                                    # [steps, B, vocab]


@pytest.mark.parametrize("rotation_dtype", ["float32", "model"])
def test_rotations_alone_keep_stock_logits_in_bf16(tiny, rotation_dtype):
    """A rotation on q/k and folded into v, nothing quantized (all tokens stay in the recent window): the bf16
    model's logits stay the stock ones up to bf16 rounding, with the runtime rotations in fp32 or in bf16."""
    model, tok = tiny("qwen3")
    model = model.to(torch.bfloat16)
    ids = tok(PROMPTS[:1], return_tensors="pt")["input_ids"][:, :24]
    stock = _teacher_forced_logits(model, ids)
    quantizer = build_quantizer("quarot_int2", recent=4096, rotation_dtype=rotation_dtype)
    quantizer.check(model.config)
    head_dim = quantizer._rotation.shape[0]      # a dense random basis: unlike a Hadamard, not exact in bf16
    quantizer._rotation = torch.linalg.qr(torch.randn(head_dim, head_dim, generator=torch.Generator().manual_seed(0),
                                                      dtype=torch.float64))[0].float()
    expected = torch.bfloat16 if rotation_dtype == "model" else torch.float32
    with install(model, quantizer) as seam:
        cache = seam.new_cache()
        ours = _teacher_forced_logits(model, ids, cache)
        layer = cache.layers[0]
        assert layer.history_length == 0 and layer.key_rotation.dtype == expected
        assert seam.modules[0]._kvq_output_rotation.dtype == expected
    rel = ((ours - stock).norm(dim=-1) / stock.norm(dim=-1)).max().item()
    assert rel < 0.05, f"logits moved by {rel:.3f} relative"


def test_unknown_rotation_dtype_is_refused():
    with pytest.raises(ValueError, match="rotation_dtype must be one of"):
        build_quantizer("oscar", rotation_dtype="float16")


def test_windowed_prefill_equals_full_masked_sdpa():
    """Chunked sliding-window SDPA == one masked SDPA, with earlier keys (T_kv > T_q), GQA and left padding."""
    from types import SimpleNamespace
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from harness.seam import windowed_sdpa
    gen = torch.Generator().manual_seed(0)
    batch, window, t_q, t_kv = 2, 8, 37, 45
    query = torch.randn(batch, 4, t_q, 16, generator=gen)                         # [B, H_q, T_q, D]
    key, value = (torch.randn(batch, 2, t_kv, 16, generator=gen) for _ in range(2))   # [B, H_kv, T_kv, D]
    q_pos = torch.arange(t_kv - t_q, t_kv)[:, None]
    k_pos = torch.arange(t_kv)[None, :]
    mask = ((k_pos <= q_pos) & (k_pos > q_pos - window)).expand(batch, 1, t_q, t_kv).clone()
    mask[1, ..., :11] = False                                                      # left padding of sequence 1
    module = SimpleNamespace(num_key_value_groups=2, is_causal=True, training=False)
    full, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.25)
    chunked = windowed_sdpa(module, query, key, value, mask, window, scaling=0.25)
    visible = mask[:, 0].any(-1)                                                    # rows with at least one key
    torch.testing.assert_close(chunked[visible], full[visible], rtol=1e-5, atol=1e-5)


def test_long_prompt_through_windowed_prefill_reproduces_stock_gemma3(tiny, monkeypatch):
    import harness.seam as seam_module
    model, tok = tiny("gemma3")                                                    # sliding_window 16
    calls = []
    original = seam_module.windowed_sdpa
    monkeypatch.setattr(seam_module, "windowed_sdpa", lambda *a, **k: calls.append(1) or original(*a, **k))
    long_prompts = [PROMPTS[0] * 4, PROMPTS[1] * 3]
    enc = tok(long_prompts, return_tensors="pt", padding=True)
    assert enc["input_ids"].shape[1] > 2 * model.config.sliding_window and enc["attention_mask"][1, 0] == 0
    kwargs = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, output_logits=True,
                  return_dict_in_generate=True, pad_token_id=tok.pad_token_id)
    with torch.inference_mode():
        stock = model.generate(**enc, **kwargs)
        with install(model, build_quantizer("bf16")) as seam:
            ours = model.generate(**enc, past_key_values=seam.new_cache(), **kwargs)
    assert calls, "the windowed prefill did not run"
    assert torch.equal(stock.sequences, ours.sequences)
    for a, b in zip(stock.logits, ours.logits):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)

"""bf16 through the seam must reproduce the stock model: same greedy tokens, logits within fp32 tolerance."""
import pytest
import torch

from oscar.cache import ThreeRegionLayer
from oscar.quantizer import build_quantizer
from oscar.seam import install

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
    from oscar.seam import check_architecture
    with pytest.raises(ValueError, match="'gpt2' is not supported"):
        check_architecture(GPT2Config())

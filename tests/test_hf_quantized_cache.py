"""The "what users already have" row: transformers' QuantizedCache behind the same seam."""
import pytest
import torch

from harness.quantizer import build_quantizer
from harness.seam import install


def test_hf_quantized_cache_generates_and_differs_from_bf16(tiny):
    model, tok = tiny("llama")
    quantizer = build_quantizer("hf_quantized_cache", residual_length=8, q_group_size=32)
    quantizer.check(model.config)
    enc = tok(["The grass is green. The sky is blue. " * 4], return_tensors="pt")
    with torch.inference_mode():
        stock = model.generate(**enc, max_new_tokens=6, do_sample=False, output_logits=True,
                               return_dict_in_generate=True, pad_token_id=0)
        with install(model, quantizer) as seam:
            cache = seam.new_cache()
            ours = model.generate(**enc, max_new_tokens=6, do_sample=False, output_logits=True,
                                  return_dict_in_generate=True, pad_token_id=0, past_key_values=cache)
    assert type(cache).__name__ == "QuantizedCache"
    torch.testing.assert_close(stock.logits[0], ours.logits[0])          # prefill is full precision
    assert (stock.logits[-1] - ours.logits[-1]).abs().max() > 1e-4       # decode reads the 2-bit cache


def test_hf_quantized_cache_refuses_sliding_window_models(tiny):
    model, _ = tiny("gemma3")
    with pytest.raises(ValueError, match="sliding-window"):
        build_quantizer("hf_quantized_cache").check(model.config)


def test_hf_quantized_cache_bits_per_element():
    assert build_quantizer("hf_quantized_cache").bits_per_element(131072) == pytest.approx(2.5 + 128 * 13.5 / 131072)

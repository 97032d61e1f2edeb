"""transformers' cache contract on the three-region cache: beam search reorders every region, crop is
refused in one sentence, and a quantizer's own quantize/dequantize hooks are never skipped silently."""
import pytest
import torch

from harness.cache import ThreeRegionLayer
from harness.quantizer import build_quantizer
from harness.seam import install, kernels_enabled
from kernels.dispatch import interpreter_forced

PROMPTS = ["The grass is green. The sky is blue. The magic number is 4213. Here we go again and again and on.",
           "A short one.", "Another prompt of a middling length, with words."]


def _prefilled(model, tok, quantizer):
    """A cache after one prefill of PROMPTS (left-padded), and its quantized layers."""
    quantizer.check(model.config)
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    with install(model, quantizer) as seam, torch.inference_mode():
        cache = seam.new_cache()
        model(**enc, past_key_values=cache, use_cache=True)
    return cache, [layer for layer in cache.layers if isinstance(layer, ThreeRegionLayer)]


@pytest.mark.parametrize("name", ["naive_int2", "kivi2", "oscar"])
def test_reorder_moves_every_region_with_its_batch_row(tiny, name, tmp_path, monkeypatch):
    monkeypatch.setenv("OSCAR_CACHE", str(tmp_path))
    model, tok = tiny("qwen3")
    overrides = {"sink": 4, "recent": 8} if name == "oscar" else {"recent": 32} if name == "kivi2" else {}
    quantizer = build_quantizer(name, **overrides)
    quantizer.check(model.config)
    quantizer.prepare(model, tok)     # OSCAR calibrates on the offline essays
    _, layers = _prefilled(model, tok, quantizer)
    index = torch.tensor([2, 0, 0])
    for layer in layers:
        assert layer.history_length > 0, "the prompt must reach the quantized history"
        keys, values = layer.materialize()
        layer.reorder_cache(index)
        new_keys, new_values = layer.materialize()
        assert torch.equal(new_keys, keys[index]) and torch.equal(new_values, values[index])


def test_beam_search_through_the_identity_cache_equals_stock(tiny):
    model, tok = tiny("llama")
    enc = tok(PROMPTS[:2], return_tensors="pt", padding=True)
    kwargs = dict(max_new_tokens=12, num_beams=2, do_sample=False, pad_token_id=tok.pad_token_id)
    with torch.inference_mode():
        stock = model.generate(**enc, **kwargs)
        with install(model, build_quantizer("bf16")) as seam:
            ours = model.generate(**enc, past_key_values=seam.new_cache(), **kwargs)
    assert torch.equal(stock, ours)


def test_beam_search_with_a_quantized_cache_runs(tiny):
    model, tok = tiny("qwen3")
    enc = tok(PROMPTS[:2], return_tensors="pt", padding=True)
    quantizer = build_quantizer("naive_int2")
    quantizer.check(model.config)
    with install(model, quantizer) as seam, torch.inference_mode():
        out = model.generate(**enc, past_key_values=seam.new_cache(), max_new_tokens=6, num_beams=2,
                             do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape == (2, enc["input_ids"].shape[1] + 6)


def test_crop_is_refused_in_one_sentence(tiny):
    model, tok = tiny("qwen3")
    _, layers = _prefilled(model, tok, build_quantizer("naive_int2"))
    with pytest.raises(NotImplementedError, match="cannot be cropped") as err:
        layers[0].crop(3)
    assert str(err.value).count(". ") == 0 and "\n" not in str(err.value)


class ZeroValues(type(build_quantizer("naive_int2"))):
    """A quantizer with its own dequantize hook (every value reconstructed as zero)."""

    def dequantize(self, qt):
        return torch.zeros_like(super().dequantize(qt))


def test_own_hooks_run_on_the_reference_path_and_the_kernels_refuse_them(tiny):
    model, tok = tiny("qwen3")
    options = {"key": {"bits": 2, "group": 128, "axis": "token"}, "value": {"bits": 2, "group": 128, "axis": "token"}}
    custom = ZeroValues(name="zero_values", **options)
    _, layers = _prefilled(model, tok, custom)
    _, hist, _ = layers[0].regions()
    history = layers[0].history_v
    assert max(hist) > 0
    for b, h in enumerate(hist):
        values = torch.ones(history.buffers["codes"].shape[1], h, history.head_dim)   # [H_kv, h, D]
        history.decode_into(values, b)
        assert torch.count_nonzero(values) == 0, "the reference path must call the quantizer's hook"
    assert not kernels_enabled(torch.device("cuda"), "auto", custom)
    with pytest.raises(ValueError, match="overrides quantize/dequantize"):
        kernels_enabled(torch.device("cpu"), "triton", custom)
    assert kernels_enabled(torch.device("cuda"), "auto", build_quantizer("naive_int2"))


@pytest.mark.parametrize("head_dim, built", [(64, True), (128, True), (256, True), (80, False), (96, False)])
def test_a_head_dim_without_kernels_takes_the_reference_path_or_is_refused(head_dim, built):
    quantizer = build_quantizer("naive_int2")
    assert kernels_enabled(torch.device("cuda"), "auto", quantizer, head_dim) is built
    assert kernels_enabled(torch.device("cuda"), "reference", quantizer, head_dim) is False
    if built and interpreter_forced():                                     # the CPU runs kernels only interpreted
        assert kernels_enabled(torch.device("cpu"), "triton", quantizer, head_dim) is True
    elif built:                                                            # a GPU box (TRITON_INTERPRET=0)
        with pytest.raises(ValueError, match="needs a CUDA device or TRITON_INTERPRET=1"):
            kernels_enabled(torch.device("cpu"), "triton", quantizer, head_dim)
    else:
        with pytest.raises(ValueError, match=f"take head_dim 64, 128, 256; this model's is {head_dim}"):
            kernels_enabled(torch.device("cuda"), "triton", quantizer, head_dim)

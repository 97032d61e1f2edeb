"""`quantizer.prefill_attends_quantized`: a prefill chunk attends to its own K/V in full precision (default: serving
semantics, OSCAR's protocol) or to every row as the cache stores it (QuaRot / RotateKV's fake-quant protocol:
BASELINES_AND_TASKS.md, "Prefill semantics differ by reference")."""
import pytest
import torch

from harness.cache import ThreeRegionLayer
from harness.quantizer import build_quantizer
from harness.seam import install, prefill_operands
from harness.simulated import quantize_dequantize, simulated_quantization

SINK, RECENT, HEADS, DIM, TOKENS = 4, 32, 2, 128, 100


def _prefill_view(attends_quantized: bool):
    """A 100-token prefill chunk through a naive-INT2 layer, padding learned as the seam learns it."""
    quantizer = build_quantizer("naive_int2", sink=SINK, recent=RECENT, page=8,
                                prefill_attends_quantized=attends_quantized)
    layer = ThreeRegionLayer(quantizer, layer_idx=0)
    gen = torch.Generator().manual_seed(0)
    keys, values = (torch.randn(1, HEADS, TOKENS, DIM, generator=gen) for _ in range(2))   # [B, H_kv, T, D]
    view, _ = layer.update(keys, values)
    assert view.as_stored == attends_quantized
    if attends_quantized:                    # the chunk's own rows: the layer is read once, as stored, by the seam
        assert view.keys is keys and view.values is values
    layer.observe_padding(None)
    return quantizer, (keys, values), prefill_operands(view)


def test_by_default_a_prefill_chunk_attends_to_itself_in_full_precision():
    _, (keys, values), (seen_k, seen_v) = _prefill_view(False)
    assert torch.equal(seen_k, keys) and torch.equal(seen_v, values)


def test_with_the_switch_it_attends_to_the_rows_as_stored():
    quantizer, (keys, values), (seen_k, seen_v) = _prefill_view(True)
    history = slice(SINK, TOKENS - RECENT)
    for seen, rows, spec in ((seen_k, keys, quantizer.key_spec), (seen_v, values, quantizer.value_spec)):
        assert torch.equal(seen[..., :SINK, :], rows[..., :SINK, :])                       # the sink
        assert torch.equal(seen[..., TOKENS - RECENT:, :], rows[..., TOKENS - RECENT:, :])  # the recent window
        expected = quantize_dequantize(quantizer, rows[..., history, :], spec)             # the quantizer's read-back
        torch.testing.assert_close(seen[..., history, :], expected, rtol=0, atol=1e-6)
        assert not torch.allclose(seen[..., history, :], rows[..., history, :], atol=1e-2)


@pytest.mark.parametrize("name", ["naive_int2", "quarot_int2"])
def test_a_prefill_without_windows_is_the_simulated_fake_quant_forward(full_attention_qwen3, name):
    """With no full-precision windows every row a prefill attends to is quantized: the logits of a prefill through
    the cache are those of `simulated_quantization` over every layer (independent code: it quantizes K/V inside the
    attention function, no cache), and differ from the default prefill's."""
    model, _ = full_attention_qwen3(2)
    ids = torch.arange(3, 67)[None]                                                         # [1, T]
    quantizers = {flag: build_quantizer(name, sink=0, recent=0, prefill_attends_quantized=flag)
                  for flag in (False, True)}
    out = {}
    for flag, quantizer in quantizers.items():
        quantizer.check(model.config)
        with install(model, quantizer) as seam, torch.no_grad():
            out[flag] = model(ids, past_key_values=seam.new_cache()).logits                 # [1, T, vocab]
            if flag:
                with simulated_quantization(model, {0: quantizer, 1: quantizer}):
                    simulated = model(ids, use_cache=False).logits
    torch.testing.assert_close(out[True], simulated, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(out[True], out[False], atol=1e-3)


def test_bf16_is_the_same_either_way(full_attention_qwen3):
    model, _ = full_attention_qwen3(2)
    ids = torch.arange(3, 40)[None]
    out = []
    for flag in (False, True):
        with install(model, build_quantizer("bf16", prefill_attends_quantized=flag)) as seam, torch.no_grad():
            out.append(model(ids, past_key_values=seam.new_cache()).logits)
    assert torch.equal(*out)


def test_combinations_the_cache_cannot_honour_are_refused_in_one_sentence():
    """A non-final chunk under chunk_keeps_recent=false does not know its stored rows yet; transformers'
    QuantizedCache prefills through its own cache."""
    with pytest.raises(ValueError, match="needs chunk_keeps_recent=true"):
        build_quantizer("oscar", prefill_attends_quantized=True, chunk_keeps_recent=False).validate()
    with pytest.raises(ValueError, match="own cache"):
        build_quantizer("hf_quantized_cache", prefill_attends_quantized=True).validate()
    with pytest.raises(ValueError, match="must be true or false, got 'yes'"):
        build_quantizer("oscar", prefill_attends_quantized="yes")


def test_decode_steps_are_the_same_either_way():
    """The switch is about prefills: a decode step on the PyTorch path reads the view `update` made, no second
    materialization, and attends to the same rows as without it."""
    seen = []
    for flag in (False, True):
        quantizer = build_quantizer("naive_int2", sink=SINK, recent=RECENT, page=8, prefill_attends_quantized=flag)
        layer = ThreeRegionLayer(quantizer, layer_idx=0)
        gen = torch.Generator().manual_seed(0)
        keys, values = (torch.randn(1, HEADS, TOKENS, DIM, generator=gen) for _ in range(2))
        layer.update(keys, values)
        layer.observe_padding(None)
        step, _ = layer.update(keys[..., :1, :], values[..., :1, :])               # one decode token
        assert not step.as_stored
        seen.append(prefill_operands(step))
    assert all(torch.equal(a, b) for a, b in zip(*seen))


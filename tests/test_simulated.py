"""harness/simulated.py: a forward pass whose attention reads quantize-dequantized K/V of every token."""
import pytest
import torch

from harness.quantizer import build_quantizer
from harness.seam import install
from harness.simulated import SIMULATED_ATTN, quantize_dequantize, simulated_quantization, stored_layers


def test_channel_groups_quantize_whole_groups_and_leave_the_tail():
    quantizer = build_quantizer("kivi2")                                  # keys per channel in groups of 32 tokens
    spec = quantizer.key_spec
    assert spec.axis == "channel"
    x = torch.randn(1, 2, 40, 64, generator=torch.Generator().manual_seed(0))   # [B, H_kv, T, D]
    out = quantize_dequantize(quantizer, x, spec)
    assert not torch.equal(out[..., :32, :], x[..., :32, :])
    assert torch.equal(out[..., 32:, :], x[..., 32:, :])                  # 8 tokens fill no group
    assert torch.equal(quantize_dequantize(quantizer, x[..., :8, :], spec), x[..., :8, :])


def logits(model, ids, seam=None):
    with torch.no_grad():
        if seam is None:
            return model(ids, use_cache=False).logits
        with simulated_quantization(seam):
            return model(ids, use_cache=False).logits


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_the_identity_changes_nothing_and_int2_changes_the_output(tiny, arch):
    model, _ = tiny(arch)
    ids = torch.arange(3, 67)[None]                                        # [1, T]
    for name, changes in (("bf16", False), ("naive_int2", True)):
        quantizer = build_quantizer(name)
        quantizer.check(model.config)
        with install(model, quantizer) as seam:
            reference, simulated = logits(model, ids), logits(model, ids, seam)
            assert model.config._attn_implementation != SIMULATED_ATTN    # restored on leaving
        assert torch.equal(reference, simulated) != changes


def test_only_the_layers_the_cache_quantizes_are_simulated(tiny):
    """Gemma 3's sliding layer stays full precision, as in the three-region cache."""
    model, _ = tiny("gemma3")
    quantizer = build_quantizer("naive_int2")
    quantizer.check(model.config)
    with install(model, quantizer) as seam:
        assert sorted(stored_layers(seam)) == [1]
    bf16 = build_quantizer("bf16")
    with install(model, bf16) as seam:
        assert stored_layers(seam) == {}

"""harness/simulated.py: a forward pass whose attention reads quantize-dequantized K/V of every token."""
import pytest
import torch

from harness.quantizer import build_quantizer
from harness.seam import install
from harness.simulated import SIMULATED_ATTN, Simulation, quantize_dequantize, simulated_quantization


def test_channel_groups_quantize_whole_groups_and_leave_the_tail():
    quantizer = build_quantizer("kivi2")                                  # keys per channel in groups of 32 tokens
    spec = quantizer.key_spec
    assert spec.axis == "channel"
    x = torch.randn(1, 2, 40, 64, generator=torch.Generator().manual_seed(0))   # [B, H_kv, T, D]
    out = quantize_dequantize(quantizer, x, spec)
    assert not torch.equal(out[..., :32, :], x[..., :32, :])
    assert torch.equal(out[..., 32:, :], x[..., 32:, :])                  # 8 tokens fill no group
    assert torch.equal(quantize_dequantize(quantizer, x[..., :8, :], spec), x[..., :8, :])


def logits(model, ids, layers=None):
    """The model's logits [1, T, vocab] without a cache, with `layers` (id -> quantizer) simulated if given."""
    with torch.no_grad():
        if layers is None:
            return model(ids, use_cache=False).logits
        with simulated_quantization(model, layers):
            return model(ids, use_cache=False).logits


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_the_identity_changes_nothing_and_int2_changes_the_output(tiny, arch):
    model, _ = tiny(arch)
    ids = torch.arange(3, 67)[None]                                        # [1, T]
    full_attention = [1] if arch == "gemma3" else [0, 1]                   # Gemma's layer 0 is a sliding layer
    for name, changes in (("bf16", False), ("naive_int2", True)):
        quantizer = build_quantizer(name)
        quantizer.check(model.config)
        with install(model, quantizer):
            reference, simulated = logits(model, ids), logits(model, ids, dict.fromkeys(full_attention, quantizer))
            assert model.config._attn_implementation != SIMULATED_ATTN and Simulation.active is None   # restored
        assert torch.equal(reference, simulated) != changes

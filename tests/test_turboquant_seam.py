"""TurboQuant K3V3 through the seam on the Triton kernel path (kernels/turbo, interpreter on CPU): the reference
path's tokens, logits and stored bytes; static decode; the full-precision boundary layers of skip_boundary_layers."""
import pytest
import torch

from harness.generate import generate_outputs
from harness.quantizer import build_quantizer
from harness.seam import install
from harness.static_cache import static_decode_refusal, static_generate
from harness.task import Example

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = 1e-3 if DEVICE == "cpu" else 2e-2  # fp32 in the interpreter; fp16 dot operands on the GPU
PROMPTS = ["The grass is green. The sky is blue. The sun is yellow. " * 2, "Here we go. There and back again."]
STEPS = 8
WINDOWS = {"sink": 4, "recent": 8, "page": 4}      # sink, history and recent all reached, pages demoted


def _quantizer(model, **overrides):
    quantizer = build_quantizer("turboquant_k3v3", **overrides)
    quantizer.check(model.config)
    return quantizer


def greedy(model, tok, quantizer, kernels):
    """(generate's output with logits, the cache) over PROMPTS (left-padded) through the seam."""
    enc = tok(PROMPTS, return_tensors="pt", padding=True).to(DEVICE)
    with install(model, quantizer, kernels=kernels) as seam, torch.inference_mode():
        cache = seam.new_cache()
        out = model.generate(**enc, max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, pad_token_id=tok.pad_token_id, past_key_values=cache)
    return out, cache


def _assert_same_history(ref_layer, layer):
    """Each sequence's stored rows (codes, norms / scales, zeros) are the same bytes on both paths."""
    assert ref_layer.history_k.lengths == layer.history_k.lengths and max(layer.history_k.lengths) > 0
    for ref, ours in ((ref_layer.history_k, layer.history_k), (ref_layer.history_v, layer.history_v)):
        for part in ("codes", "scale", "zero"):
            for b, n in enumerate(ours.lengths):
                assert torch.equal(ref.view(part)[b, :, :n], ours.view(part)[b, :, :n]), part


@pytest.mark.parametrize("overrides", [{}, WINDOWS], ids=["no-windows", "sink4-recent8-page4"])
def test_kernel_path_generates_what_the_reference_path_does(tiny, overrides):
    model, tok = tiny("qwen3")
    model.to(DEVICE)
    quantizer = _quantizer(model, **overrides)
    ref, ref_cache = greedy(model, tok, quantizer, "reference")
    ours, cache = greedy(model, tok, quantizer, "triton")
    layer = cache.layers[0]
    assert layer.use_kernels and "mirror" not in layer.history_k.buffers
    assert torch.equal(ref.sequences, ours.sequences)
    for a, b in zip(ref.logits, ours.logits):
        torch.testing.assert_close(a, b, rtol=TOL, atol=TOL)
    _assert_same_history(ref_cache.layers[0], layer)


def test_static_decode_takes_turboquant_and_decodes_like_generate(tiny):
    model, tok = tiny("qwen3")
    model.to(DEVICE)
    quantizer = _quantizer(model, **WINDOWS)
    dynamic, _ = greedy(model, tok, quantizer, "triton")
    enc = tok(PROMPTS, return_tensors="pt", padding=True).to(DEVICE)
    with install(model, quantizer, kernels="triton") as seam:
        cache = seam.new_cache()
        assert static_decode_refusal(cache, enc["input_ids"].shape[1]) is None
        tokens = static_generate(model, dict(enc), cache, STEPS, [], tok.pad_token_id, graph=DEVICE == "cuda")
    assert torch.equal(tokens, dynamic.sequences[:, enc["input_ids"].shape[1]:])
    assert cache.layers[0].static is not None and max(cache.layers[0].history_k.lengths) > 0


def test_skipped_boundary_layers_stay_full_precision_on_the_kernel_path(full_attention_qwen3):
    """skip_boundary_layers=1 of 4: layers 0 and 3 keep full precision (the identity, whose kernel reads fp rows
    only), 1 and 2 store TurboQuant codes;
    static decode refuses the mix in one sentence and generate serves it."""
    model, tok = full_attention_qwen3(4)
    model.to(DEVICE)
    quantizer = _quantizer(model, skip_boundary_layers=1)
    ref, _ = greedy(model, tok, quantizer, "reference")
    ours, cache = greedy(model, tok, quantizer, "triton")
    assert all(layer.use_kernels for layer in cache.layers)            # the boundary layers read their fp rows
    assert [layer.quantizer.stores_codes for layer in cache.layers] == [False, True, True, False]
    assert cache.layers[0].history_k is None and cache.layers[1].history_length > 0
    assert torch.equal(ref.sequences, ours.sequences)
    examples = [Example("0", PROMPTS[1], [], max_new_tokens=4)]
    with install(model, quantizer, kernels="triton") as seam:
        assert "skip_boundary_layers" in static_decode_refusal(seam.new_cache(), 40)
        paths = {}
        assert generate_outputs(model, tok, examples, seam.new_cache, static_decode="auto", paths=paths)
    assert paths.pop("clock").as_row()["prefills"] == 1 and paths == {"generate": 1}

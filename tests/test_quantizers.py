"""Quantizer library: rotation-only exactness through the seam, the BPE table, error orderings."""
import pytest
import torch

from oscar.covariance import query_second_moment
from kernels.format import QuantSpec, dequantize, quantize
from harness.quantizer import build_quantizer, known_quantizers
from harness.hadamard import hadamard
from oscar.rotation import compose_rotation, eigen_basis
from harness.seam import install

PROMPTS = ["The grass is green. The sky is blue. " * 6, "Here we go. There and back again."]


def greedy(model, tok, cache=None, steps=32):
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    extra = {} if cache is None else {"past_key_values": cache}
    with torch.inference_mode():
        return model.generate(**enc, max_new_tokens=steps, min_new_tokens=steps, do_sample=False, output_logits=True,
                              return_dict_in_generate=True, pad_token_id=tok.pad_token_id, **extra)


def rotation_only(name, model, tok):
    quantizer = build_quantizer(name)
    quantizer.check(model.config)
    quantizer.prepare(model, tok)
    quantizer.key_spec = quantizer.value_spec = None      # keep the rotations, drop the quantization
    return quantizer


@pytest.mark.parametrize("name", ["quarot_int2", "saw_int4", "oscar"])
@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_rotation_only_reproduces_the_model(tiny, tmp_path, monkeypatch, name, arch):
    monkeypatch.setenv("OSCAR_CACHE", str(tmp_path))
    model, tok = tiny(arch)
    stock = greedy(model, tok)
    quantizer = rotation_only(name, model, tok)
    weights = [p.clone() for p in model.parameters()]
    with install(model, quantizer) as seam:
        ours = greedy(model, tok, seam.new_cache())
    assert torch.equal(stock.sequences, ours.sequences)
    for a, b in zip(stock.logits, ours.logits):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters())), "folding was not undone"


def test_quantized_decode_reads_the_history(tiny):
    model, tok = tiny("qwen3")
    stock = greedy(model, tok, steps=8)
    quantizer = build_quantizer("naive_int2")
    quantizer.check(model.config)
    with install(model, quantizer) as seam:
        cache = seam.new_cache()
        ours = greedy(model, tok, cache, steps=8)
    torch.testing.assert_close(stock.logits[0], ours.logits[0])        # prefill attends in full precision
    assert (stock.logits[-1] - ours.logits[-1]).abs().max() > 1e-3     # decode reads INT2 history
    assert cache.layers[0].history_length == cache.layers[0].get_seq_length() - 1   # the last token is pending


@pytest.mark.parametrize("name, ctx, expected", [
    ("naive_int2", 131072, 2.25), ("quarot_int2", 131072, 2.25), ("quarot_int2", 32768, 2.25),
    ("oscar", 131072, 2.28), ("oscar", 32768, 2.38), ("int4", 131072, 4.25), ("saw_int4", 131072, 4.25),
    ("quarot_int4", 131072, 4.25), ("bf16", 131072, 16.0),
    ("turboquant_k3v3", 131072, 3.19),           # vLLM's layout (K 3.125, V 3.25); the paper rounds it to 3.25
])
def test_bits_per_element_reproduces_the_paper(name, ctx, expected):
    assert round(build_quantizer(name).bits_per_element(ctx), 2) == expected


def test_bits_per_element_reports_fp32_metadata_honestly():
    fp32 = {"bits": 2, "group": 128, "scale_dtype": "float32"}
    quantizer = build_quantizer("oscar", key={**fp32, "clip_ratio": 0.96}, value={**fp32, "clip_ratio": 0.92})
    assert round(quantizer.bits_per_element(131072), 2) == 2.53


def test_every_registered_quantizer_builds():
    for name in known_quantizers():
        assert build_quantizer(name).name == name


def test_unknown_quantizer_is_one_sentence():
    with pytest.raises(ValueError, match="Unknown quantizer 'nope'"):
        build_quantizer("nope")


def _planted(seed=0, n=2048, d=128):
    """Queries and keys sharing three dominant (non axis-aligned) directions, as real q/k outlier dims do."""
    gen = torch.Generator().manual_seed(seed)
    basis, _ = torch.linalg.qr(torch.randn(d, d, generator=gen))
    scales = torch.ones(d)
    scales[:3] = 20.0
    q = (torch.randn(n, d, generator=gen) * scales) @ basis.T
    k = (torch.randn(n, d, generator=gen) * scales) @ basis.T
    return q, k


def _errors(q, k, group):
    """Attention-logit MSE of INT2 keys per rotation mode; rotations from C_Q as OSCAR builds them."""
    eigenvalues, basis = eigen_basis(query_second_moment(q[:, None, :].double()))
    spec = QuantSpec(bits=2, group=group)
    out = {}
    for mode in ("none", "h", "u", "u_h", "r_h_pbr"):
        rotation = compose_rotation(basis, eigenvalues, mode).float()
        x = k @ rotation
        err = x - dequantize(quantize(x[None], spec))[0]
        out[mode] = ((q @ rotation) @ err.T).pow(2).mean().item()
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_error_orderings_on_planted_outliers(seed):
    """Within OSCAR, H after U and P_br (G < D) each lower the logit error.

    Hadamard-only is NOT asserted to lose to OSCAR: on these synthetic keys it does not (see the
    closing note of the quantizer issue); the real-model comparison is the fidelity table.
    """
    q, k = _planted(seed)
    g128, g64 = _errors(q, k, 128), _errors(q, k, 64)
    assert g128["u_h"] < g128["u"] and g64["u_h"] < g64["u"]
    assert g64["r_h_pbr"] < g64["u_h"]
    assert g128["r_h_pbr"] == pytest.approx(g128["u_h"], rel=1e-4)   # P_br is a no-op when G = D


def test_hadamard_int2_beats_naive_int2_on_outlier_channels():
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(1024, 128, generator=gen)
    k[:, [3, 50, 97]] *= 20.0                       # axis-aligned outlier channels
    spec = QuantSpec(bits=2, group=128)

    def sqnr(rotation):
        x = k @ rotation
        err = x - dequantize(quantize(x[None], spec))[0]
        return (x.pow(2).sum() / err.pow(2).sum()).item()
    assert sqnr(hadamard(128).float()) > 2 * sqnr(torch.eye(128))

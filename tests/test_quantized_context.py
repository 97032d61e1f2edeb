"""Quantized-context scoring (harness/quantized_context.py): chunked == token-by-token, and it sees the quantizer."""
import pytest
import torch

from harness.quantized_context import chunk_sizes, quantized_context_logits
from harness.quantizer import build_quantizer
from harness.seam import install

WINDOWS = {"oscar": {"sink": 4, "recent": 8, "page": 4}, "kivi2": {"recent": 32, "page": 32},
           "naive_int2": {}, "int4": {"sink": 4, "recent": 8, "page": 8}}


def test_chunks_fill_the_windows_then_step_by_a_divisor_of_the_page():
    assert chunk_sizes(build_quantizer("oscar"), 340) == [320, 8, 8, 4]          # sink 64 + recent 256, page 8
    assert chunk_sizes(build_quantizer("kivi2"), 200) == [128, 16, 16, 16, 16, 8]  # page 32: 16 per call at most
    assert chunk_sizes(build_quantizer("naive_int2"), 3) == [1, 1, 1]            # no windows, page 1
    assert chunk_sizes(build_quantizer("oscar"), 100) == [100]                   # all inside the windows
    assert chunk_sizes(build_quantizer("bf16"), 50) == [50]                      # the identity: one forward


def _prepared(tiny, name, tmp_path, monkeypatch):
    monkeypatch.setenv("OSCAR_CACHE", str(tmp_path))
    model, tok = tiny("qwen3")
    quantizer = build_quantizer(name, **WINDOWS.get(name, {}))
    quantizer.check(model.config)
    quantizer.prepare(model, tok)
    ids = torch.randint(5, model.config.vocab_size, (2, 83), generator=torch.Generator().manual_seed(0))
    return model, quantizer, ids


def _token_by_token(model, seam, ids):
    cache = seam.new_cache()
    return torch.cat([model(input_ids=ids[:, t:t + 1], past_key_values=cache).logits for t in range(ids.shape[1])], 1)


@pytest.mark.parametrize("name", sorted(WINDOWS))
def test_chunked_scoring_equals_token_by_token_decode(tiny, tmp_path, monkeypatch, name):
    model, quantizer, ids = _prepared(tiny, name, tmp_path, monkeypatch)
    with install(model, quantizer, kernels="reference") as seam, torch.no_grad():
        chunked = quantized_context_logits(model, ids, seam.new_cache, quantizer)      # [B, T, V]
        stepped = _token_by_token(model, seam, ids)
        full = model(input_ids=ids).logits
    torch.testing.assert_close(chunked, stepped, rtol=1e-4, atol=1e-4)
    assert (chunked - full).abs().max() > 1e-2, "scoring did not read the quantized history back"


def test_a_row_scores_the_same_alone_and_beside_a_right_padded_longer_row(tiny, tmp_path, monkeypatch):
    model, quantizer, ids = _prepared(tiny, "oscar", tmp_path, monkeypatch)
    with install(model, quantizer, kernels="reference") as seam:
        both = quantized_context_logits(model, ids, seam.new_cache, quantizer)
        alone = quantized_context_logits(model, ids[:1, :50], seam.new_cache, quantizer)
    torch.testing.assert_close(both[:1, :50], alone, rtol=1e-4, atol=1e-4)

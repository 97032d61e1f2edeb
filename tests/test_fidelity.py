"""task=fidelity: zero error for the identity, positive and layered rows for INT2."""
import os

import pytest
from hydra import compose, initialize_config_dir

from harness.pipeline import run_cell
from report.store import ResultsStore

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "configs")


def fidelity_rows(quantizer, tmp_path):
    with initialize_config_dir(config_dir=os.path.abspath(CONFIGS), version_base="1.3"):
        cfg = compose("config", ["model=tiny_gemma3", f"quantizer={quantizer}", "task=fidelity",
                                 f"results_dir={tmp_path}", "task.tokens=512", "task.seq_len=256"])
        return {r["metric"]: r["value"] for r in run_cell(cfg, ResultsStore(tmp_path))}


def test_identity_has_zero_error_and_int2_does_not(tmp_path, monkeypatch):
    monkeypatch.setenv("OSCAR_CACHE", str(tmp_path / "cache"))
    bf16 = fidelity_rows("bf16", tmp_path)
    naive = fidelity_rows("naive_int2", tmp_path)
    metrics = ("k_mse", "v_mse", "logit_mse", "attn_kl", "attn_output_rel_err")
    assert all(bf16[m] == 0.0 for m in metrics)
    assert all(naive[m] > 0.0 for m in metrics)
    assert set(naive) >= {f"{m}/layer_1" for m in metrics}          # the one full-attention layer
    assert not any(key.endswith("/layer_0") for key in naive)       # the sliding layer is not quantized
    assert naive["k_mse"] == pytest.approx(naive["k_mse/layer_1"])


def test_keys_are_quantized_around_the_key_offset():
    """A planted per-channel key offset: quantizing around it cuts the key error; logits stay comparable."""
    import torch
    from types import SimpleNamespace

    from eval.fidelity import layer_errors
    from harness.quantizer import build_quantizer

    gen = torch.Generator().manual_seed(0)
    tokens, heads, dim = 64, 2, 128
    offset = 6.0 * torch.randn(heads, dim, generator=gen)                               # [H_kv, D]
    cap = SimpleNamespace(q=torch.randn(tokens, heads, dim, generator=gen),
                          k=torch.randn(tokens, heads, dim, generator=gen) + offset,       # [T, H_kv, D]
                          v=torch.randn(tokens, heads, dim, generator=gen), seq_lens=[tokens], scaling=dim ** -0.5)
    module = SimpleNamespace(o_proj=torch.nn.Linear(heads * dim, 16))

    def errors(key_offset):
        quantizer = build_quantizer("naive_int2")
        quantizer.key_offset = lambda layer_idx: key_offset
        return layer_errors(module, quantizer, 0, cap)
    plain, centred = errors(None), errors(offset)
    assert centred["k_mse"] < 0.2 * plain["k_mse"]
    assert centred["logit_mse"] < 0.2 * plain["logit_mse"]
    assert centred["v_mse"] == pytest.approx(plain["v_mse"])


def test_capture_with_folded_values_sees_the_stock_activations(tiny, tmp_path, monkeypatch):
    """task=fidelity captures with the seam installed: layer 1's keys must not depend on layer 0's folded R_V."""
    import torch

    from harness.capture import capture_activations
    from harness.quantizer import build_quantizer
    from harness.seam import install

    monkeypatch.setenv("OSCAR_CACHE", str(tmp_path))
    model, tok = tiny("qwen3")
    text = "The grass is green and the sky is blue. " * 20
    stock = capture_activations(model, tok, text, budget=128, seq_len=64)
    quantizer = build_quantizer("quarot_int2")
    quantizer.check(model.config)
    with install(model, quantizer):
        folded = capture_activations(model, tok, text, budget=128, seq_len=64)
    last = max(stock)
    assert last >= 1
    torch.testing.assert_close(torch.cat(folded[last].k), torch.cat(stock[last].k), rtol=1e-4, atol=1e-4)


def test_fidelity_bpe_is_that_of_what_it_quantized(tmp_path, monkeypatch):
    """Fidelity quantizes every token, so its BPE excludes the full-precision windows the cache would keep."""
    from harness.quantizer import build_quantizer
    monkeypatch.setenv("OSCAR_CACHE", str(tmp_path / "cache"))
    kivi = fidelity_rows("kivi2", tmp_path)
    quantizer = build_quantizer("kivi2")
    quantizer.check(type("Config", (), {"head_dim": 64, "hidden_size": 64, "num_attention_heads": 4})())
    assert kivi["bits_per_element"] == pytest.approx(quantizer.quantized_bits())
    assert kivi["bits_per_element"] < quantizer.bits_per_element(4096)     # the windowed (cache) BPE is larger
    assert fidelity_rows("bf16", tmp_path)["bits_per_element"] == 16.0

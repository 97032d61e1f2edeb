"""task=fidelity: zero error for the identity, positive and layered rows for INT2."""
import os

import pytest
import torch
from hydra import compose, initialize_config_dir

from harness.pipeline import run_cell
from report.store import ResultsStore

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "configs")


def fidelity_rows(quantizer, tmp_path, *overrides):
    with initialize_config_dir(config_dir=os.path.abspath(CONFIGS), version_base="1.3"):
        cfg = compose("config", ["model=tiny_gemma3", f"quantizer={quantizer}", "task=fidelity",
                                 f"results_dir={tmp_path}", "task.tokens=512", "task.seq_len=256", *overrides])
        return {r["metric"]: r["value"] for r in run_cell(cfg, ResultsStore(tmp_path))}


def test_identity_has_zero_error_and_int2_does_not(tmp_path, monkeypatch):
    monkeypatch.setenv("OSCAR_CACHE", str(tmp_path / "cache"))
    bf16 = fidelity_rows("bf16", tmp_path)
    naive = fidelity_rows("naive_int2", tmp_path)
    metrics = ("k_mse", "v_mse", "logit_mse", "attn_kl", "attn_output_rel_err", "attn_output_mse",
               "propagated_hidden_mse")
    assert all(bf16[m] == 0.0 and bf16[f"{m}/layer_1"] == 0.0 for m in metrics)
    assert all(naive[m] > 0.0 for m in metrics)
    assert set(naive) >= {f"{m}/layer_1" for m in metrics}          # the one full-attention layer
    assert not any(key.endswith("/layer_0") for key in naive)       # the sliding layer is not quantized
    assert naive["k_mse"] == pytest.approx(naive["k_mse/layer_1"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_fidelity_on_the_gpu_measures_what_the_cpu_does(tmp_path, monkeypatch):
    """The capture stays on the host and each layer is measured where its o_proj and rotations live (the first
    H100 dry run of the paper's decomposition failed: host activations times a GPU rotation)."""
    monkeypatch.setenv("OSCAR_CACHE", str(tmp_path / "cache"))
    cpu = fidelity_rows("oscar", tmp_path / "cpu", "device=cpu")
    gpu = fidelity_rows("oscar", tmp_path / "gpu", "device=cuda")
    for metric in ("k_mse", "v_mse", "attn_kl", "attn_output_mse", "propagated_hidden_mse"):
        assert gpu[metric] > 0 and gpu[metric] == pytest.approx(cpu[metric], rel=0.25)


def test_keys_are_quantized_around_the_key_offset():
    """A planted per-channel key offset: quantizing around it cuts the key error; logits stay comparable."""
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


def test_the_propagated_error_of_a_layer_is_the_hidden_state_after_it(tiny):
    """Qwen3's two full-attention layers: quantizing layer 1 alone leaves the state after layer 0 exact; quantizing
    layer 0 alone gives the state after layer 0 the error of quantizing every layer, and layer 1 inherits it."""
    from eval.fidelity import measured_sequences, propagated_hidden_mse
    from harness.capture import calibration_text
    from harness.quantizer import build_quantizer
    from harness.seam import install
    model, tok = tiny("qwen3")
    naive = build_quantizer("naive_int2")
    naive.check(model.config)
    sequences = measured_sequences(tok, calibration_text(split="heldout"), tokens=192, seq_len=96)
    with install(model, naive):
        every, first, last = (propagated_hidden_mse(model, sequences, [0, 1], dict.fromkeys(quantized, naive))
                              for quantized in ([0, 1], [0], [1]))
    assert last[0] == 0.0 and last[1] > 0.0
    assert every[0] > 0.0 and first[0] == every[0]
    assert first[1] > 0.0 and every[1] > first[1]


def test_the_propagated_run_quantizes_as_the_single_layer_metrics(tiny, tmp_path, monkeypatch):
    """Layer 0 sees the same input in both propagated runs, so its o_proj output error there is the block-output
    error that attn_output_mse measures on the captured activations: the same rotations, key offset and tokens."""
    import torch

    from eval.fidelity import _as_captured, layer_errors
    from harness.capture import calibration_text, capture_activations, token_sequences
    from harness.quantizer import build_quantizer
    from harness.seam import install
    from harness.simulated import simulated_quantization
    monkeypatch.setenv("OSCAR_CACHE", str(tmp_path))
    model, tok = tiny("qwen3")
    quantizer = build_quantizer("oscar", center_keys=True, calibration={"budget": 256, "seq_len": 128})
    quantizer.check(model.config)
    quantizer.prepare(model, tok)
    text = calibration_text(split="heldout")
    ids = token_sequences(tok, text, seq_len=128, budget=128)[0][None]                  # [1, T]
    o_proj = model.model.layers[0].self_attn.o_proj
    outputs = []
    handle = o_proj.register_forward_hook(lambda module, args, output: outputs.append(output))
    with install(model, quantizer) as seam, torch.no_grad():
        captured = capture_activations(model, tok, text, budget=128, seq_len=128)
        single = layer_errors(seam.modules[0], quantizer, 0, _as_captured(captured[0]))["attn_output_mse"]
        outputs.clear()
        model(ids, use_cache=False)
        with simulated_quantization(model, {0: quantizer, 1: quantizer}):
            model(ids, use_cache=False)
    handle.remove()
    reference, quantized = outputs                                                         # [1, T, hidden] each
    assert single > 0.0
    assert (quantized - reference).pow(2).mean().item() == pytest.approx(single, rel=1e-3)

"""task=fidelity: zero error for the identity, positive and layered rows for INT2."""
import os

import pytest
from hydra import compose, initialize_config_dir

from oscar.pipeline import run_cell

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "configs")


def fidelity_rows(quantizer, tmp_path):
    with initialize_config_dir(config_dir=os.path.abspath(CONFIGS), version_base="1.3"):
        cfg = compose("config", ["model=tiny_gemma3", f"quantizer={quantizer}", "task=fidelity",
                                 f"results_dir={tmp_path}", "task.tokens=512", "task.seq_len=256"])
        return {r["metric"]: r["value"] for r in run_cell(cfg)}


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

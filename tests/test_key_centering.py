"""`center_keys`: subtracting a per-channel key offset is exact for attention and helps INT2 keys."""
from pathlib import Path

import pytest
import torch

from harness.cache import ThreeRegionLayer
from harness.capture import calibration_text, capture_activations
from harness.quantizer import build_quantizer
from oscar.rotation import load_key_means, save_key_means
from harness.seam import install
from tests.test_quantizers import greedy


def calibrated_oscar(model, tok, **options):
    quantizer = build_quantizer("oscar", center_keys=True, calibration={"budget": 256, "seq_len": 128}, **options)
    quantizer.check(model.config)
    quantizer.prepare(model, tok)
    return quantizer


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_any_key_offset_leaves_attention_unchanged(tiny, tmp_path, monkeypatch, arch):
    monkeypatch.setenv("OSCAR_CACHE", str(tmp_path))
    model, tok = tiny(arch)
    stock = greedy(model, tok)
    quantizer = calibrated_oscar(model, tok)
    quantizer.key_spec = quantizer.value_spec = None          # rotations and offsets only, no quantization
    gen = torch.Generator().manual_seed(0)
    quantizer.key_means = {l: 5.0 * torch.randn(m.shape, generator=gen) for l, m in quantizer.key_means.items()}
    with install(model, quantizer) as seam:
        cache = seam.new_cache()
        ours = greedy(model, tok, cache)
    offset_layers = [layer for layer in cache.layers if getattr(layer, "key_offset", None) is not None]
    assert offset_layers, "no cache layer received a key offset"
    assert torch.equal(stock.sequences, ours.sequences)
    for a, b in zip(stock.logits, ours.logits):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_calibrated_offset_is_the_mean_rotated_key(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("OSCAR_CACHE", str(tmp_path))
    model, tok = tiny("qwen3")
    quantizer = calibrated_oscar(model, tok)
    captured = capture_activations(model, tok, calibration_text(), budget=256, seq_len=128)
    for layer_idx, cap in captured.items():
        _, k, _ = cap.stacked()                                               # [T, H_kv, D]
        expected = (k.mean(dim=0) @ quantizer.key_rotation(layer_idx).double()).float()
        torch.testing.assert_close(quantizer.key_offset(layer_idx), expected, rtol=1e-4, atol=1e-5)
    assert build_quantizer("oscar").key_offset(0) is None                    # off by default


def test_offset_frees_int2_levels_for_offset_keys():
    """Keys with a large per-channel constant: the cache stores k - m, and reconstructs far better."""
    gen = torch.Generator().manual_seed(0)
    heads, dim = 2, 128
    offset = 8.0 * torch.randn(heads, dim, generator=gen)                       # [H_kv, D]
    keys = torch.randn(1, heads, 96, dim, generator=gen) + offset[None, :, None, :]   # [B, H_kv, T, D]
    values = torch.randn(1, heads, 96, dim, generator=gen)

    def stored_key_error(key_offset):
        quantizer = build_quantizer("naive_int2")
        quantizer.key_offset = lambda layer_idx: key_offset
        layer = ThreeRegionLayer(quantizer, 0)
        layer.update(keys, values)
        stored, _ = layer.materialize()
        shift = 0 if key_offset is None else key_offset[None, :, None, :]
        return (stored + shift - keys).pow(2).mean().item()
    assert stored_key_error(offset) < 0.2 * stored_key_error(None)


def test_key_mean_file_round_trip_and_bad_files(tmp_path):
    means = {0: torch.randn(2, 8), 3: torch.randn(2, 8)}
    save_key_means(tmp_path / "m.pt", means)
    loaded = load_key_means(tmp_path / "m.pt")
    assert set(loaded) == {0, 3} and all(torch.equal(loaded[l], means[l]) for l in means)
    torch.save({"format_version": 1, "layers": {0: {"rotation": torch.eye(8)}}}, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="key_mean"):
        load_key_means(tmp_path / "bad.pt")


def test_center_keys_with_rotation_dir_needs_the_mean_file(tmp_path):
    with pytest.raises(ValueError, match="center_keys needs key_mean_qqt_r_h_pbr.pt"):
        build_quantizer("oscar", center_keys=True, rotation_dir=str(tmp_path))
    save_key_means(tmp_path / "key_mean_qqt_r_h_pbr.pt", {0: torch.zeros(2, 8)})
    assert build_quantizer("oscar", center_keys=True, rotation_dir=str(tmp_path)).center_keys


def test_center_keys_reuses_the_calibrated_folder(tiny, tmp_path, monkeypatch):
    """Toggling center_keys must not recalibrate identical rotations; a folder without the mean file is refilled."""
    monkeypatch.setenv("OSCAR_CACHE", str(tmp_path))
    model, tok = tiny("qwen3")
    plain = build_quantizer("oscar", calibration={"budget": 256, "seq_len": 128})
    plain.check(model.config)
    plain.prepare(model, tok)
    centred = build_quantizer("oscar", center_keys=True, calibration={"budget": 256, "seq_len": 128})
    centred.check(model.config)
    with monkeypatch.context() as patch:
        patch.setattr(type(centred), "calibrate", lambda *args: pytest.fail("calibrated the same rotations twice"))
        centred.prepare(model, tok)
    assert centred.artifact_dir == plain.artifact_dir and centred.key_means
    mean_file = next(Path(centred.artifact_dir).glob("key_mean_*.pt"))
    mean_file.unlink()
    centred.prepare(model, tok)
    assert mean_file.is_file()

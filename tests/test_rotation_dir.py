"""quantizer.rotation_dir: rotation files written as the official release writes them (METHOD_OSCAR.md §4.6: a
torch.save'd dict, string layer keys, eigenvalues beside each rotation) give exactly the cache codes and logits
of the calibration whose rotations they hold."""
from pathlib import Path

import torch

from harness.quantizer import build_quantizer
from harness.seam import install

PROMPT = "The grass is green and the sky is blue. The magic number is 4213. Remember it well, " * 3
WINDOWS = {"sink": 4, "recent": 8, "page": 4}


def _prepared(model, tok, **options):
    quantizer = build_quantizer("oscar", **WINDOWS, **options)
    quantizer.check(model.config)
    quantizer.prepare(model, tok)
    return quantizer


def _prefill(model, tok, quantizer):
    """(logits [1, T, V], layer 0's packed K and V codes) after one prefill through the seam."""
    enc = tok([PROMPT], return_tensors="pt")
    with install(model, quantizer, kernels="reference") as seam, torch.inference_mode():
        cache = seam.new_cache()
        logits = model(**enc, past_key_values=cache).logits
    layer = cache.layers[0]
    return logits, layer.history_k.view("codes"), layer.history_v.view("codes")


def _write_release_layout(folder, rotations: dict, objective: str, name: str) -> None:
    layers = {str(layer): {"layer_id": layer, "rotation": rot.clone(), "eigenvalues": torch.ones(rot.shape[0])}
              for layer, rot in rotations.items()}
    torch.save({"format_version": 1, "objective": objective, "source_grouping": "layer", "layers": layers},
               folder / name)


def _release_folder(folder, quantizer, rotations_k: dict, rotations_v: dict) -> str:
    """A rotation_dir holding these rotations in the release's layout, under `quantizer`'s file names."""
    folder.mkdir()
    (k_objective, v_objective), (k_name, v_name, _) = quantizer._objectives(), quantizer._file_names()
    _write_release_layout(folder, rotations_k, k_objective, k_name)
    _write_release_layout(folder, rotations_v, v_objective, v_name)
    return str(folder)


def test_release_layout_rotation_files_give_the_calibrated_codes(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("OSCAR_CACHE", str(tmp_path / "cache"))
    model, tok = tiny("qwen3")
    calibrated = _prepared(model, tok)
    release = _release_folder(tmp_path / "release", calibrated, calibrated.rotations_k, calibrated.rotations_v)
    assert sorted(p.name for p in Path(release).iterdir()) == ["k_rotation_qqt_r_h_pbr.pt", "v_rotation_sst_r_h_pbr.pt"]
    loaded = _prepared(model, tok, rotation_dir=release)
    assert loaded.calibration_digest is None and loaded.artifact_dir == release
    logits, k_codes, v_codes = _prefill(model, tok, calibrated)
    loaded_logits, loaded_k, loaded_v = _prefill(model, tok, loaded)
    assert k_codes.numel() > 0
    assert torch.equal(k_codes, loaded_k) and torch.equal(v_codes, loaded_v)
    assert torch.equal(logits, loaded_logits)


def test_other_rotations_give_other_codes(tiny, tmp_path, monkeypatch):
    """Guards the test above: the codes do depend on the files' rotations."""
    monkeypatch.setenv("OSCAR_CACHE", str(tmp_path / "cache"))
    model, tok = tiny("qwen3")
    calibrated = _prepared(model, tok)
    eye = {layer: torch.eye(rot.shape[0]) for layer, rot in calibrated.rotations_k.items()}
    other = _release_folder(tmp_path / "other", calibrated, eye, calibrated.rotations_v)
    _, k_codes, _ = _prefill(model, tok, calibrated)
    _, other_k, _ = _prefill(model, tok, _prepared(model, tok, rotation_dir=other))
    assert not torch.equal(k_codes, other_k)

"""OSCAR's calibration never yields an ok row without rotations: the rotation cache follows the calibration
text's content, and a text too short to capture anything is refused instead of giving no rotation."""
from pathlib import Path

import pytest

from harness.quantizer import build_quantizer

CALIBRATION = {"source": "file", "budget": 128, "seq_len": 64}


def prepared(model, tok, path: Path):
    quantizer = build_quantizer("oscar", calibration={**CALIBRATION, "path": str(path)})
    quantizer.validate()
    quantizer.check(model.config)
    quantizer.prepare(model, tok)
    return quantizer


def test_editing_the_calibration_file_recalibrates(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("OSCAR_CACHE", str(tmp_path / "cache"))
    model, tok = tiny("qwen3")
    text = tmp_path / "calibration.txt"
    text.write_text("The grass is green and the sky is blue. " * 8)
    first = prepared(model, tok, text)
    assert sorted(first.rotations_k) == [0, 1]
    text.write_text("Entirely different words about tides, salt and harbours. " * 8)
    second = prepared(model, tok, text)
    assert second.artifact_dir != first.artifact_dir          # same path, new content: not the old rotations
    assert second.artifacts()["calibration_text"] != first.artifacts()["calibration_text"]
    assert not all((a == b).all() for a, b in zip(first.rotations_k.values(), second.rotations_k.values()))


def test_a_text_too_short_to_capture_is_refused_not_run_unrotated(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("OSCAR_CACHE", str(tmp_path / "cache"))
    model, tok = tiny("qwen3")
    text = tmp_path / "calibration.txt"
    text.write_text("a")
    with pytest.raises(ValueError, match="too short to capture"):
        prepared(model, tok, text)
    assert not list((tmp_path / "cache").rglob("*.pt")), "an empty rotation file was cached"

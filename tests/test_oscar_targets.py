"""OSCAR's covariance targets: `key_target: query | tensor` and `value_target: surrogate | softmax | tensor` pick the
matrix whose eigenbasis is U (the tensor targets are the paper's tensor-reconstruction ablation, K^T K / V^T V)."""
from pathlib import Path

import pytest
import torch

from harness.capture import calibration_text, capture_activations
from harness.quantizer import build_quantizer
from oscar.covariance import ktk_target, query_second_moment, vtv_target
from oscar.method import key_target_matrix, value_target_matrix
from oscar.rotation import eigen_basis

CALIBRATION = {"budget": 256, "seq_len": 128}


def aligned(C: torch.Tensor, direction: torch.Tensor) -> bool:
    """Whether the eigenvector of the largest eigenvalue of C [D, D] (eigen_basis sorts ascending) is +-direction."""
    return abs(float(eigen_basis(C)[1][:, -1] @ direction)) > 0.99


def planted(direction: torch.Tensor, rows: int, heads: int, gen: torch.Generator) -> torch.Tensor:
    """[rows, heads, D] noise plus a large component along `direction` [D]."""
    noise = torch.randn(rows, heads, direction.shape[0], generator=gen, dtype=torch.float64)
    return noise + 10.0 * torch.randn(rows, heads, 1, generator=gen, dtype=torch.float64) * direction


def test_tensor_targets_follow_the_keys_and_values_and_attention_targets_the_queries():
    """Queries, keys and values each carry their own dominant direction: the tensor targets' top eigenvector is
    that of K (V), the attention-aware key target's is that of Q."""
    gen = torch.Generator().manual_seed(0)
    dim = 16
    q_dir, k_dir, v_dir = torch.eye(dim, dtype=torch.float64)[:3]                  # three orthogonal directions [D]
    q, k, v = planted(q_dir, 64, 4, gen), planted(k_dir, 64, 2, gen), planted(v_dir, 64, 2, gen)
    assert aligned(key_target_matrix("tensor", q, k), k_dir)
    assert aligned(key_target_matrix("query", q, k), q_dir)
    assert aligned(value_target_matrix("tensor", q, k, v, dim ** -0.5, [64]), v_dir)
    assert torch.equal(key_target_matrix("tensor", q, k), ktk_target(k))
    assert torch.equal(value_target_matrix("tensor", q, k, v, dim ** -0.5, [64]), vtv_target(v))


def calibrated(model, tok, **options):
    quantizer = build_quantizer("oscar", compose="u", calibration=CALIBRATION, **options)   # R = U: the eigenbasis
    quantizer.check(model.config)
    quantizer.prepare(model, tok)
    return quantizer


def test_calibrated_tensor_target_rotations_are_the_eigenbases_of_ktk_and_vtv(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("OSCAR_CACHE", str(tmp_path))
    model, tok = tiny("qwen3")
    tensor = calibrated(model, tok, key_target="tensor", value_target="tensor")
    attention = calibrated(model, tok)
    captured = capture_activations(model, tok, calibration_text(), **CALIBRATION)
    assert sorted(captured) == [0, 1]
    for layer_idx, cap in captured.items():
        q, k, v = cap.stacked()                                          # [T, H_q, D], [T, H_kv, D], [T, H_kv, D]
        torch.testing.assert_close(tensor.key_rotation(layer_idx), eigen_basis(ktk_target(k))[1].float())
        torch.testing.assert_close(tensor.value_rotation(layer_idx), eigen_basis(vtv_target(v))[1].float())
        torch.testing.assert_close(attention.key_rotation(layer_idx), eigen_basis(query_second_moment(q))[1].float())
        assert (tensor.key_rotation(layer_idx) - attention.key_rotation(layer_idx)).abs().max() > 0.1
        assert (tensor.value_rotation(layer_idx) - attention.value_rotation(layer_idx)).abs().max() > 0.1
    assert tensor.artifact_dir != attention.artifact_dir                  # the target is part of the cache key
    assert set(tensor.artifacts()) == {"k_rotation_ktk_u.pt", "v_rotation_vtv_u.pt", "calibration_text"}
    assert set(attention.artifacts()) == {"k_rotation_qqt_u.pt", "v_rotation_sst_u.pt", "calibration_text"}


def test_the_key_target_alone_changes_the_cache_key_and_the_key_file(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("OSCAR_CACHE", str(tmp_path))
    model, tok = tiny("qwen3")
    keys_only = calibrated(model, tok, key_target="tensor")
    attention = calibrated(model, tok)
    assert keys_only.artifact_dir != attention.artifact_dir
    assert sorted(p.name for p in Path(keys_only.artifact_dir).glob("*_rotation_*.pt")) == \
        ["k_rotation_ktk_u.pt", "v_rotation_sst_u.pt"]
    torch.testing.assert_close(keys_only.value_rotation(0), attention.value_rotation(0))   # same value target


def test_rotation_dir_needs_the_files_of_the_chosen_targets(tmp_path):
    """A folder of attention-target rotations is not read as tensor-target ones."""
    for name in ("k_rotation_qqt_r_h_pbr.pt", "v_rotation_sst_r_h_pbr.pt"):
        (tmp_path / name).write_bytes(b"")
    quantizer = build_quantizer("oscar", key_target="tensor", value_target="tensor", rotation_dir=str(tmp_path))
    with pytest.raises(ValueError, match="lacks k_rotation_ktk_r_h_pbr.pt and v_rotation_vtv_r_h_pbr.pt"):
        quantizer.validate()


@pytest.mark.parametrize("option, value, needle", [
    ("key_target", "keys", "key_target must be one of ('query', 'tensor'), got 'keys'."),
    ("value_target", "vtv", "value_target must be one of ('surrogate', 'softmax', 'tensor'), got 'vtv'."),
])
def test_unknown_targets_are_one_sentence(option, value, needle):
    with pytest.raises(ValueError) as err:
        build_quantizer("oscar", **{option: value})
    assert str(err.value) == needle

"""Tests for oscar.rotation: Hadamard, bit reversal, P_br, composition, eigh, RotationZoo IO, and the
quantization payoff of rotating keys with planted outlier channels."""
import math

import pytest
import torch

from kernels.format import QuantSpec, dequantize, quantize
from harness.hadamard import block_hadamard, hadamard
from oscar.rotation import (COMPOSE_MODES, bit_reversal, bit_reversal_permutation, compose_rotation, eigen_basis,
                            load_rotations, save_rotations)


def random_spd(d, seed=0):
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(d, d, generator=generator, dtype=torch.float64)
    return a @ a.T / d + 1e-3 * torch.eye(d, dtype=torch.float64)


def orthogonality_error(R):
    return (R @ R.T - torch.eye(R.shape[0], dtype=R.dtype)).abs().max().item()


# ------------------------------------------------------------------------------- Hadamard
@pytest.mark.parametrize("d", [1, 2, 8, 128])
def test_hadamard_is_symmetric_and_orthogonal(d):
    H = hadamard(d)
    assert H.dtype == torch.float64
    assert torch.equal(H, H.T)
    assert orthogonality_error(H) < 1e-12


def test_hadamard_entries_follow_popcount_rule():
    H = hadamard(8)
    for i in range(8):
        for j in range(8):
            assert H[i, j].item() == pytest.approx((-1) ** bin(i & j).count("1") / math.sqrt(8))


def test_block_hadamard_is_block_diagonal():
    B = block_hadamard(64, 16, dtype=torch.float32)
    assert orthogonality_error(B.double()) < 1e-6
    for block in range(4):
        rows = slice(16 * block, 16 * block + 16)
        assert torch.equal(B[rows, rows], hadamard(16, torch.float32))
    assert B[:16, 16:].abs().sum() == 0


@pytest.mark.parametrize("call", [lambda: hadamard(96), lambda: block_hadamard(128, 12),
                                  lambda: block_hadamard(40, 16), lambda: bit_reversal(100)])
def test_non_power_of_two_sizes_are_rejected(call):
    with pytest.raises(ValueError, match="power of two|does not divide"):
        call()


# ------------------------------------------------------------------------------- bit reversal
def test_bit_reversal_order():
    br = bit_reversal(128)
    assert br.dtype == torch.long
    assert br[:4].tolist() == [0, 64, 32, 96]
    assert torch.equal(br[br], torch.arange(128))  # an involution, hence a permutation


def test_p_br_is_data_independent_for_ascending_eigenvalues():
    d = 128
    P = bit_reversal_permutation(torch.linspace(0.1, 5.0, d, dtype=torch.float64))
    expected_perm = d - 1 - bit_reversal(d)
    assert torch.equal(P, torch.eye(d, dtype=torch.float64)[:, expected_perm])


def test_p_br_sends_top_eigen_directions_to_spread_positions():
    d = 16
    eigenvalues = torch.randperm(d, generator=torch.Generator().manual_seed(1)).double()
    X = torch.arange(d, dtype=torch.float64)[None, :]  # column index as value
    moved = (X @ bit_reversal_permutation(eigenvalues))[0]
    ranked = torch.argsort(eigenvalues, descending=True)
    assert [moved[p].item() for p in (0, 8, 4, 12)] == ranked[:4].double().tolist()


# ------------------------------------------------------------------------------- eigh and composition
def test_eigen_basis_ascending_and_reconstructs():
    C = random_spd(32)
    C_skewed = C + 1e-9 * torch.triu(torch.ones_like(C), diagonal=1)
    eigenvalues, U = eigen_basis(C_skewed.float())
    assert torch.all(eigenvalues[1:] >= eigenvalues[:-1])
    assert torch.allclose(U @ torch.diag(eigenvalues) @ U.T, C, atol=1e-5)


@pytest.mark.parametrize("mode", COMPOSE_MODES)
def test_every_mode_is_orthogonal(mode):
    eigenvalues, U = eigen_basis(random_spd(64, seed=3))
    assert orthogonality_error(compose_rotation(U, eigenvalues, mode)) < 1e-5


def test_modes_compose_as_documented():
    eigenvalues, U = eigen_basis(random_spd(16, seed=4))
    H, P = hadamard(16), bit_reversal_permutation(eigenvalues)
    assert torch.equal(compose_rotation(U, eigenvalues), U @ H @ P)
    assert torch.equal(compose_rotation(U, eigenvalues, "u_h"), U @ H)
    assert torch.equal(compose_rotation(U, eigenvalues, "u"), U)
    assert torch.equal(compose_rotation(U, eigenvalues, "h"), H)
    assert torch.equal(compose_rotation(U, eigenvalues, "none"), torch.eye(16, dtype=torch.float64))


def test_compose_rejects_unknown_mode():
    eigenvalues, U = eigen_basis(random_spd(8))
    with pytest.raises(ValueError, match="rotation mode"):
        compose_rotation(U, eigenvalues, "h_r_pbr")


# ------------------------------------------------------------------------------- RotationZoo IO
def test_save_load_round_trip(tmp_path):
    path = tmp_path / "zoo" / "k_rotation_qqt_r_h_pbr.pt"
    rotations, eigenvalues = {}, {}
    for layer in (0, 3):
        eigenvalues[layer], U = eigen_basis(random_spd(16, seed=layer))
        rotations[layer] = compose_rotation(U, eigenvalues[layer])
    save_rotations(path, rotations, eigenvalues, "qqt_r_h_pbr")
    payload = torch.load(path, weights_only=True)
    assert (payload["format_version"], payload["objective"], payload["source_grouping"]) == (1, "qqt_r_h_pbr", "layer")
    assert payload["layers"][3]["layer_id"] == 3 and payload["layers"][3]["eigenvalues"].dtype == torch.float32
    loaded = load_rotations(path)
    assert sorted(loaded) == [0, 3]
    assert all(torch.equal(loaded[layer], rotations[layer].float()) for layer in loaded)


def test_load_accepts_string_layer_keys(tmp_path):
    path = tmp_path / "str_keys.pt"
    layers = {"5": {"layer_id": 5, "rotation": hadamard(8, torch.float32), "eigenvalues": torch.ones(8)}}
    torch.save({"format_version": 1, "objective": "hadamard", "source_grouping": "layer", "layers": layers}, path)
    assert list(load_rotations(path)) == [5]


def test_load_missing_file(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_rotations(tmp_path / "absent.pt")


@pytest.mark.parametrize("payload,message", [
    (b"not a torch file", "could not be read"),
    ([torch.eye(4)], "not a RotationZoo dict"),
    ({"format_version": 1, "layers": {0: {"rotation": 2 * torch.eye(4)}}}, "not orthogonal"),
    ({"format_version": 1, "layers": {0: {"rotation": torch.ones(4, 3)}}}, "square"),
])
def test_load_rejects_bad_files(tmp_path, payload, message):
    path = tmp_path / "bad.pt"
    if isinstance(payload, bytes):
        path.write_bytes(payload)
    else:
        torch.save(payload, path)
    with pytest.raises(ValueError, match=message):
        load_rotations(path)


# ------------------------------------------------------------------------------- quantization payoff
def sqnr_db(x, x_hat):
    return 10 * math.log10(x.pow(2).sum().item() / (x - x_hat).pow(2).sum().item())


def keys_with_outlier_channels():
    keys = torch.randn(256, 128, generator=torch.Generator().manual_seed(0))  # [T, D]
    keys[:, [3, 50, 77]] *= 20.0
    return keys


def test_hadamard_beats_naive_int2_on_outlier_channels():
    keys, spec, H = keys_with_outlier_channels(), QuantSpec(bits=2), hadamard(128, torch.float32)
    naive = dequantize(quantize(keys, spec))
    rotated = dequantize(quantize(keys @ H, spec)) @ H.T
    assert sqnr_db(keys, rotated) > sqnr_db(keys, naive) + 6.0


def test_quarot_int2_recipe_beats_naive_int2_recipe():
    """BASELINES §2.1 vs §2.2: symmetric ternary INT2 vs Hadamard + asymmetric INT2."""
    keys, H = keys_with_outlier_channels(), hadamard(128, torch.float32)
    naive = dequantize(quantize(keys, QuantSpec(bits=2, symmetric=True)))
    quarot = dequantize(quantize(keys @ H, QuantSpec(bits=2))) @ H.T
    assert sqnr_db(keys, quarot) > sqnr_db(keys, naive)

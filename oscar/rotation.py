"""OSCAR rotation construction (eigenbasis, bit-reversal permutation, U*H*P_br) and RotationZoo file IO.

Row-vector convention throughout: a rotation R [D, D] acts as `x -> x @ R` on the last dim
(METHOD_OSCAR §0, §4). The default OSCAR rotation is `R = U @ H @ P_br`:

    from oscar.rotation import eigen_basis, compose_rotation, save_rotations
    eigenvalues, U = eigen_basis(C_Q)                       # ascending eigenvalues, columns of U
    R_K = compose_rotation(U, eigenvalues, "r_h_pbr")       # [D, D] float64
    save_rotations("k_rotation_qqt_r_h_pbr.pt", {0: R_K}, {0: eigenvalues}, "qqt_r_h_pbr")

`load_rotations` reads the same format back (layer id -> fp32 rotation) and refuses files that are
missing, malformed or hold a non-orthogonal matrix.
"""
from __future__ import annotations

from pathlib import Path

import torch

from harness.hadamard import hadamard, log2_exact

COMPOSE_MODES = ("r_h_pbr", "u", "h", "u_h", "none")
FORMAT_VERSION = 1
ORTHOGONALITY_TOLERANCE = 1e-3


def bit_reversal(d: int) -> torch.Tensor:
    """LongTensor br with br[i] = i with its log2(d) bits reversed (d=128: 0, 64, 32, 96, ...)."""
    n_bits = log2_exact(d, "bit-reversal size")
    index = torch.arange(d)
    reversed_index = torch.zeros_like(index)
    for bit in range(n_bits):
        reversed_index |= ((index >> bit) & 1) << (n_bits - 1 - bit)
    return reversed_index


def bit_reversal_permutation(eigenvalues: torch.Tensor) -> torch.Tensor:
    """P_br [d, d] (§4.3): perm[br(i)] = argsort_desc(eigenvalues)[i], P = I[:, perm]."""
    if eigenvalues.dim() != 1:
        raise ValueError(f"eigenvalues must be a 1-D tensor, got shape {tuple(eigenvalues.shape)}.")
    d = eigenvalues.shape[0]
    by_importance = torch.argsort(eigenvalues, descending=True, stable=True)  # [d]
    perm = torch.empty_like(by_importance)
    perm[bit_reversal(d)] = by_importance
    return torch.eye(d, dtype=torch.float64)[:, perm]


def compose_rotation(U: torch.Tensor, eigenvalues: torch.Tensor, mode: str = "r_h_pbr") -> torch.Tensor:
    """Compose the applied rotation [d, d] (float64) from an eigenbasis U (columns) and its eigenvalues.

    modes: "r_h_pbr" U @ H @ P_br (OSCAR default), "u" U, "h" H, "u_h" U @ H, "none" identity.
    """
    if mode not in COMPOSE_MODES:
        raise ValueError(f"rotation mode must be one of {COMPOSE_MODES}, got {mode!r}.")
    if U.dim() != 2 or U.shape[0] != U.shape[1] or eigenvalues.shape != U.shape[:1]:
        raise ValueError(f"U must be square [d, d] with d eigenvalues, got {tuple(U.shape)} "
                         f"and {tuple(eigenvalues.shape)}.")
    d = U.shape[0]
    U = U.to(torch.float64)
    if mode == "none":
        return torch.eye(d, dtype=torch.float64)
    if mode == "u":
        return U.clone()
    if mode == "h":
        return hadamard(d)
    if mode == "u_h":
        return U @ hadamard(d)
    return U @ hadamard(d) @ bit_reversal_permutation(eigenvalues)


def eigen_basis(C: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(eigenvalues ascending [d], U [d, d] eigenvectors as columns) of the symmetrised float64 C."""
    if C.dim() != 2 or C.shape[0] != C.shape[1]:
        raise ValueError(f"covariance target must be a square matrix, got shape {tuple(C.shape)}.")
    C = C.to(torch.float64)
    return torch.linalg.eigh((C + C.T) / 2)


# ---------------------------------------------------------------------------------------- RotationZoo IO
def _orthogonality_error(rotation: torch.Tensor) -> float:
    R = rotation.to(torch.float64)
    return (R @ R.T - torch.eye(R.shape[0], dtype=torch.float64)).abs().max().item()


def _check_rotation(rotation, layer_id, source) -> torch.Tensor:
    if not isinstance(rotation, torch.Tensor) or rotation.dim() != 2 or rotation.shape[0] != rotation.shape[1]:
        raise ValueError(f"Layer {layer_id} of {source} does not hold a square rotation matrix.")
    error = _orthogonality_error(rotation)
    if not error <= ORTHOGONALITY_TOLERANCE:
        raise ValueError(f"Layer {layer_id} of {source} is not orthogonal (max |R R^T - I| = {error:.3g}).")
    return rotation


def save_rotations(path, rotations: dict[int, torch.Tensor], eigenvalues: dict[int, torch.Tensor],
                   objective: str) -> None:
    """Write a RotationZoo file (§4.6): per layer an fp32 rotation [d, d] and fp32 eigenvalues [d]."""
    if set(rotations) != set(eigenvalues):
        raise ValueError("rotations and eigenvalues must cover the same layer ids.")
    layers = {}
    for layer_id in sorted(rotations):
        rotation = _check_rotation(rotations[layer_id], layer_id, "the rotations to save")
        layers[int(layer_id)] = {
            "layer_id": int(layer_id),
            "rotation": rotation.detach().to("cpu", torch.float32).contiguous(),
            "eigenvalues": eigenvalues[layer_id].detach().to("cpu", torch.float32).contiguous(),
        }
    payload = {"format_version": FORMAT_VERSION, "objective": objective, "source_grouping": "layer", "layers": layers}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, path)


def _read_payload(path: Path) -> dict:
    if not path.is_file():
        raise ValueError(f"Rotation file {path} does not exist.")
    try:
        payload = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as error:
        raise ValueError(f"Rotation file {path} could not be read as a torch file ({type(error).__name__}).") from error
    if not (isinstance(payload, dict) and payload.get("format_version") == FORMAT_VERSION
            and isinstance(payload.get("layers"), dict)):
        raise ValueError(f"Rotation file {path} is not a RotationZoo dict "
                         f"(format_version {FORMAT_VERSION} with 'layers').")
    return payload


def _layer_id(key, path: Path) -> int:
    if isinstance(key, int) or (isinstance(key, str) and key.isdigit()):
        return int(key)
    raise ValueError(f"Rotation file {path} has a layer key {key!r} that is not an integer layer id.")


def load_rotations(path) -> dict[int, torch.Tensor]:
    """Read a RotationZoo file: {layer_id (int): fp32 rotation [d, d]}; int or str layer keys accepted."""
    path = Path(path)
    rotations = {}
    for key, entry in _read_payload(path)["layers"].items():
        if not isinstance(entry, dict) or "rotation" not in entry:
            raise ValueError(f"Layer {key} of {path} has no 'rotation' entry.")
        rotations[_layer_id(key, path)] = _check_rotation(entry["rotation"], key, path).to(torch.float32)
    return rotations


def save_key_means(path, key_means: dict[int, torch.Tensor]) -> None:
    """Write per-layer key offsets [H_kv, D] (the mean rotated key, `center_keys`) in the RotationZoo layout."""
    layers = {int(l): {"layer_id": int(l), "key_mean": m.detach().to("cpu", torch.float32).contiguous()}
              for l, m in sorted(key_means.items())}
    payload = {"format_version": FORMAT_VERSION, "objective": "key_mean", "source_grouping": "layer", "layers": layers}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, path)


def load_key_means(path) -> dict[int, torch.Tensor]:
    """Read a file written by `save_key_means`: {layer_id: fp32 [H_kv, D]} (weights_only load)."""
    path = Path(path)
    means = {}
    for key, entry in _read_payload(path)["layers"].items():
        mean = entry.get("key_mean") if isinstance(entry, dict) else None
        if not (isinstance(mean, torch.Tensor) and mean.dim() == 2 and torch.isfinite(mean).all()):
            raise ValueError(f"Layer {key} of {path} has no finite 2-D 'key_mean' entry.")
        means[_layer_id(key, path)] = mean.to(torch.float32)
    return means

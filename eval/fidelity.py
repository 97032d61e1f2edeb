"""task=fidelity: per-layer reconstruction, attention and hidden-state error of a quantizer on held-out text.

For every quantized (full-attention) layer, q/k/v are captured on held-out essays (not the
calibration split), every token is quantized (the history regime: windows are not applied), and
we report against full precision:
  k_mse, v_mse            mean squared reconstruction error (rotated basis; rotations are orthogonal;
                          keys are quantized around the quantizer's key offset, if it has one)
  logit_mse               mean squared error of the causal attention logits (q k^T * scaling)
  attn_kl                 mean KL(p_bf16 || p_quant) over attention rows
  attn_output_rel_err     ||o_proj(o_quant) - o_proj(o)|| / ||o_proj(o)||
  attn_output_mse         mean squared error of the same attention-block output after o_proj (the paper's
                          block-output MSE; the relative error above normalises it per sequence)
  propagated_hidden_mse   mean squared error of the residual-stream hidden state after the layer (the
                          decoder layer's output), every quantized layer's K/V quantized at once
The first six quantize that layer alone, on the full-precision activations captured at its input. The
propagated error runs the whole model twice on the same held-out sequences, in full precision and with
every quantized layer attending over quantize-dequantized K/V of every token (harness/simulated.py; the same
history regime), so each layer also sees the error that earlier layers pass on. Every full-attention layer is
quantized with the cell's quantizer (sliding-window layers stay full precision, as in the cache; a per-layer
exception such as TurboQuant's skip_boundary_layers is not applied, in any metric).
Rows: `<metric>/layer_<l>` per quantized layer and `<metric>` = the mean over those layers.
"""
from __future__ import annotations

from pathlib import Path

import torch

from harness.checks import integer_option
from harness.capture import calibration_text, capture_activations, token_sequences
from harness.simulated import quantize_dequantize, simulated_quantization
from harness.task import Task

LAYER_METRICS = ("k_mse", "v_mse", "logit_mse", "attn_kl", "attn_output_rel_err", "attn_output_mse")
METRICS = (*LAYER_METRICS, "propagated_hidden_mse")


def quantize_captured(quantizer, x: torch.Tensor, spec) -> torch.Tensor:
    """Quantize-dequantize x [T, H, D] (tokens first, as captured) with the quantizer's spec."""
    return quantize_dequantize(quantizer, x.transpose(0, 1), spec).transpose(0, 1)    # via [H, T, D]


def _attention(q, k, v, scaling):
    """Causal attention per query head with GQA. q [T, H_q, D], k/v [T, H_kv, D] -> logits, probs, out."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    logits = torch.einsum("thd,shd->hts", q, k) * scaling             # [H_q, T, T]
    future = torch.ones(q.shape[0], q.shape[0], dtype=torch.bool, device=q.device).triu(1)
    logits = logits.masked_fill(future, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    out = torch.einsum("hts,shd->thd", probs, v)                       # [T, H_q, D]
    return logits, probs, out


def layer_errors(module, quantizer, layer_idx, cap) -> dict[str, float]:
    """The LAYER_METRICS of one layer, that layer alone quantized, over its captured sequences (held on the host;
    each sequence is measured on the layer's device, where its o_proj and rotations live)."""
    device = module.o_proj.weight.device
    r_k, r_v = quantizer.key_rotation(layer_idx), getattr(module, "_kvq_value_rotation", None)  # v: folded v_proj
    r_k, r_v = (None if r is None else r.float().to(device) for r in (r_k, r_v))
    offset = quantizer.key_offset(layer_idx)                          # [H_kv, D] quantized around, or None
    shift = 0.0 if offset is None else offset.float().to(device)
    sums = dict.fromkeys(LAYER_METRICS, 0.0)
    start = 0
    for n in cap.seq_lens:
        q, k, v_rot = (t[start:start + n].to(device, torch.float32) for t in (cap.q, cap.k, cap.v))  # [n, H, D]
        start += n
        v = v_rot @ r_v.T if r_v is not None else v_rot
        q_r, k_r = (q @ r_k, k @ r_k) if r_k is not None else (q, k)
        k_hat = quantize_captured(quantizer, k_r - shift, quantizer.key_spec) + shift
        v_hat = quantize_captured(quantizer, v_rot, quantizer.value_spec)
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
        sums["attn_output_mse"] += (o_q - o_ref).pow(2).mean().item() * n
    total = sum(cap.seq_lens)
    return {m: s / total for m, s in sums.items()}


def _as_captured(cap):
    q, k, v = cap.stacked()
    cap.q, cap.k, cap.v = q, k, v
    return cap


def measured_sequences(tokenizer, text: str, tokens: int, seq_len: int) -> list[torch.Tensor]:
    """The token sequences [T] that `capture_activations(..., tokens, seq_len)` records, the last one cut where
    the budget of `tokens` ends (causal: its first tokens are what the capture kept of it)."""
    sequences, room = [], tokens
    for seq in token_sequences(tokenizer, text, seq_len, tokens):
        if room <= 0:
            break
        sequences.append(seq[:room])
        room -= len(sequences[-1])
    return sequences


def decoder_layers(model) -> dict[int, torch.nn.Module]:
    """Layer id -> decoder layer (the module whose `self_attn` has that layer_idx; its output is the residual
    stream after the layer)."""
    return {m.self_attn.layer_idx: m for m in model.modules() if hasattr(getattr(m, "self_attn", None), "layer_idx")}


def residual_stream(model, ids: torch.Tensor, layers: dict[int, torch.nn.Module]) -> dict[int, torch.Tensor]:
    """Layer id -> the hidden state [1, T, hidden] after each of `layers` in one forward pass of ids [1, T]."""
    outputs: dict[int, torch.Tensor] = {}

    def recorder(idx: int):
        def record(module, args, output):
            outputs[idx] = output[0] if isinstance(output, tuple) else output      # [1, T, hidden]
        return record
    handles = [layer.register_forward_hook(recorder(idx)) for idx, layer in layers.items()]
    try:
        model(ids, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return outputs


def propagated_hidden_mse(model, sequences: list[torch.Tensor], layer_ids: list[int],
                          quantized_layers: dict) -> dict[int, float]:
    """Layer id (of `layer_ids`) -> MSE between the hidden states after that layer with the K/V of
    `quantized_layers` (layer id -> quantizer) quantize-dequantized and in full precision, pooled over the tokens
    of `sequences` (each [T]); `model` has the seam installed."""
    layers = {idx: layer for idx, layer in decoder_layers(model).items() if idx in layer_ids}
    device = next(model.parameters()).device
    sums, total = dict.fromkeys(layer_ids, 0.0), 0
    for seq in sequences:
        ids = seq[None].to(device)                                                   # [1, T]
        reference = residual_stream(model, ids, layers)
        with simulated_quantization(model, quantized_layers):
            quantized = residual_stream(model, ids, layers)
        for idx in layer_ids:
            sums[idx] += (quantized[idx].float() - reference[idx].float()).pow(2).mean().item() * len(seq)
        total += len(seq)
    return {idx: value / total for idx, value in sums.items()}


def metric_rows(records: list[dict]) -> dict[str, float]:
    """`<metric>/layer_<l>` of every per-layer record and `<metric>` = the mean over the records' layers."""
    metrics = {f"{m}/layer_{r['layer']}": r[m] for r in records for m in METRICS}
    for m in METRICS:
        metrics[m] = sum(r[m] for r in records) / max(len(records), 1)
    return metrics


@torch.inference_mode()
def evaluate(loaded, seam, task_cfg, ctx: int, seed: int):
    """The Fidelity task's evaluation; returns (metrics, per-layer records)."""
    text = calibration_text(task_cfg.get("source", "essays"), task_cfg.get("path"), split="heldout")
    tokens, seq_len = int(task_cfg.get("tokens", 4096)), int(task_cfg.get("seq_len", 1024))
    captured = capture_activations(loaded.model, loaded.tokenizer, text, tokens, seq_len)
    kinds = seam.layer_types()
    records = [{"layer": module.layer_idx,
                **layer_errors(module, seam.quantizer, module.layer_idx, _as_captured(captured[module.layer_idx]))}
               for module in seam.modules
               if kinds[module.layer_idx] != "sliding_attention" and module.layer_idx in captured]
    sequences = measured_sequences(loaded.tokenizer, text, tokens, seq_len)
    layer_ids = [r["layer"] for r in records]
    propagated = propagated_hidden_mse(loaded.model, sequences, layer_ids, dict.fromkeys(layer_ids, seam.quantizer))
    for record in records:
        record["propagated_hidden_mse"] = propagated[record["layer"]]
    return metric_rows(records), records


class Fidelity(Task):
    """Per-layer K/V, attention and hidden-state error: configs/task/fidelity.yaml's `_target_`."""

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

    def run(self, loaded, seam, ctx, seed, static_decode="off", paths=None, compile_step=False):
        return evaluate(loaded, seam, self.cfg, ctx, seed)

    def bits_per_element(self, quantizer, ctx):
        """Fidelity quantizes every captured token (no full-precision windows): the history's own bits."""
        return quantizer.quantized_bits() if quantizer.stores_codes else 16.0

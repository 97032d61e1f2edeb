"""How much of each layer's key energy is a per-channel offset, and what centring does to INT2 keys.

    python scripts/dev/key_offset_stats.py quantizer=oscar           # Gemma 3 270M, OSCAR basis, held-out essays
    python scripts/dev/key_offset_stats.py model=smollm2_135m quantizer=naive_int2

Keys are captured post-RoPE on the held-out essays (as task=fidelity does) and taken into the
quantizer's key basis. Per quantized layer it prints the fraction of key energy in
  global_mean  a per-channel mean over all tokens (what `center_keys` removes; exact for attention):
               for oscar the calibrated one (from the other 70 % of the essays), else these tokens' own
  block_mean   per-channel means over 128-token blocks of positions (an offset that drifts with position)
and the INT2 key MSE with no centring, centred on the calibrated mean (`center_keys`), and centred on
the block means (an oracle: not exact for attention, shown for scale).
"""
import sys
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from eval.fidelity import quantize_captured  # noqa: E402
from harness.capture import calibration_text, capture_activations  # noqa: E402
from harness.models import load_model  # noqa: E402
from harness.pipeline import resolve_device  # noqa: E402
from harness.quantizer import build_quantizer  # noqa: E402

BLOCK = 128


def block_means(keys: torch.Tensor, seq_lens: list[int]) -> torch.Tensor:
    """Per-channel means over BLOCK-token position blocks of each sequence, broadcast back: [T, H, D]."""
    out, start = torch.empty_like(keys), 0
    for n in seq_lens:
        for lo in range(start, start + n, BLOCK):
            hi = min(lo + BLOCK, start + n)
            out[lo:hi] = keys[lo:hi].mean(dim=0, keepdim=True)
        start += n
    return out


def int2_key_mse(quantizer, keys: torch.Tensor, offset) -> float:
    """MSE of quantize(keys - offset) + offset against keys [T, H, D] (as task=fidelity quantizes them)."""
    restored = quantize_captured(quantizer, keys - offset, quantizer.key_spec) + offset
    return (restored - keys).pow(2).mean().item()


def layer_stats(quantizer, layer_idx: int, cap) -> dict[str, float]:
    keys = torch.cat(cap.k).float()                                    # [T, H_kv, D] post-RoPE
    if quantizer.key_rotation(layer_idx) is not None:
        keys = keys @ quantizer.key_rotation(layer_idx)
    calibrated = quantizer.key_offset(layer_idx)
    global_mean = keys.mean(dim=0, keepdim=True) if calibrated is None else calibrated[None]
    blocks = block_means(keys, cap.seq_lens)
    energy = keys.pow(2).sum().item()
    return {"global_mean": global_mean.expand_as(keys).pow(2).sum().item() / energy,
            "block_mean": blocks.pow(2).sum().item() / energy,
            "mse_plain": int2_key_mse(quantizer, keys, 0.0),
            "mse_centred": int2_key_mse(quantizer, keys, global_mean),
            "mse_block_oracle": int2_key_mse(quantizer, keys, blocks)}


@hydra.main(version_base="1.3", config_path="../configs", config_name="config")
def main(cfg: DictConfig) -> None:
    options = OmegaConf.to_container(cfg.quantizer, resolve=True)
    name = options.pop("name")
    if name == "oscar":
        options["center_keys"] = True                   # calibrates (or loads) the mean rotated key too
    quantizer = build_quantizer(name, **options)
    if quantizer.key_spec is None:
        print(f"error: quantizer '{name}' keeps keys in full precision; pass one that quantizes them, "
              f"e.g. quantizer=oscar.", file=sys.stderr)
        sys.exit(2)
    loaded = load_model(cfg.model, device=resolve_device(cfg.device))
    model, tokenizer = loaded.model, loaded.tokenizer
    quantizer.check(model.config)
    quantizer.prepare(model, tokenizer)
    kinds = getattr(model.config, "layer_types", None) or ["full_attention"] * model.config.num_hidden_layers
    captured = capture_activations(model, tokenizer, calibration_text(split="heldout"), 4096, 1024)
    print(f"{cfg.model.name} / {name}: key energy fractions and INT2 key MSE (held-out essays, {BLOCK}-token blocks)")
    print(f"{'layer':>5} {'global_mean':>11} {'block_mean':>10} {'mse_plain':>9} {'mse_centred':>11} "
          f"{'mse_block_oracle':>16}")
    for layer_idx in sorted(i for i in captured if kinds[i] == "full_attention"):
        s = layer_stats(quantizer, layer_idx, captured[layer_idx])
        print(f"{layer_idx:>5} {s['global_mean']:>11.3f} {s['block_mean']:>10.3f} {s['mse_plain']:>9.3f} "
              f"{s['mse_centred']:>11.3f} {s['mse_block_oracle']:>16.3f}")


if __name__ == "__main__":
    main()

"""How much a prompt's greedy decode changes when it shares a left-padded batch with a longer prompt.

    python scripts/dev/batch_invariance.py                          # Gemma 3 270M, every quantizer, CPU
    python scripts/dev/batch_invariance.py model=smollm2_135m +quantizers=[oscar,kivi2] +steps=8

A prompt of about 1,000 tokens (held-out essays) decodes alone and then as row 0 of a batch beside a
prompt 300 tokens longer. Printed per quantizer: the largest logit difference over the greedy steps and
the first step at which the tokens differ ("-" when none). Regions counted per sequence make both zero
up to floating-point noise of the padded batch's attention.
"""
import sys
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from eval.ruler_data import essay_text, essay_words  # noqa: E402
from harness.models import load_model  # noqa: E402
from harness.pipeline import resolve_device  # noqa: E402
from harness.quantizer import build_quantizer, known_quantizers  # noqa: E402
from harness.seam import install  # noqa: E402

NOT_OURS = ("hf_quantized_cache",)


def prompts(tokenizer, alone_tokens: int = 1000, extra_tokens: int = 300) -> tuple[str, str]:
    """(a prompt of about `alone_tokens` tokens, one `extra_tokens` longer), both from the held-out essays."""
    words = essay_words(split="heldout")
    text = essay_text(words, alone_tokens)
    while len(tokenizer(text).input_ids) > alone_tokens:
        text = text[: int(len(text) * 0.95)]
    return text, essay_text(words[5000:], extra_tokens) + " " + text


def greedy(model, tokenizer, quantizer, texts, steps: int):
    """(tokens [B, steps], logits [B, steps, V]) through the seam."""
    enc = tokenizer(texts, return_tensors="pt", padding=True).to(model.device)
    with install(model, quantizer) as seam, torch.inference_mode():
        out = model.generate(**enc, max_new_tokens=steps, min_new_tokens=steps, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, pad_token_id=tokenizer.pad_token_id,
                             past_key_values=seam.new_cache())
    return out.sequences[:, enc.input_ids.shape[1]:], torch.stack(out.logits, dim=1).float()


@hydra.main(version_base="1.3", config_path="../../configs", config_name="config")
def main(cfg: DictConfig) -> None:
    loaded = load_model(cfg.model, device=resolve_device(cfg.device))
    model, tokenizer = loaded.model, loaded.tokenizer
    alone, longer = prompts(tokenizer)
    steps = int(cfg.get("steps", 16))
    names = list(cfg.get("quantizers", [n for n in known_quantizers() if n not in NOT_OURS]))
    print(f"{cfg.model.name}: {len(tokenizer(alone).input_ids)}-token prompt alone vs beside a "
          f"{len(tokenizer(longer).input_ids)}-token one, {steps} greedy steps")
    print(f"{'quantizer':<12} {'max |dlogit|':>12} {'first differing step':>20}")
    for name in names:
        quantizer = build_quantizer(name)
        quantizer.check(model.config)
        quantizer.prepare(model, tokenizer)
        tokens, logits = greedy(model, tokenizer, quantizer, [alone], steps)
        b_tokens, b_logits = greedy(model, tokenizer, quantizer, [alone, longer], steps)
        differ = (tokens[0] != b_tokens[0]).nonzero()
        first = str(int(differ[0])) if len(differ) else "-"
        print(f"{name:<12} {(logits[0] - b_logits[0]).abs().max().item():>12.4g} {first:>20}")


if __name__ == "__main__":
    main()

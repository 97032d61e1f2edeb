"""Choosing the next token: greedy, or temperature / top-k / top-p sampling with one random stream per example.

The same chooser serves both decode paths (the frozen cache + CUDA graph of harness/static_cache.py and
transformers' generate, through `ChooserProcessor`), so a seed gives the same text on either path. Each
example draws from its own generator, seeded from (run seed, example id), by the exponential race
(argmax of p / E with E ~ Exp(1), the same distribution as a multinomial draw): an example samples the
same tokens alone as inside any batch, and two seeds give independent samples.

    chooser = TokenChooser({"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20},
                           seeds=example_seeds(seed, ids), device=device)
    next_tokens = chooser(logits)                         # logits [B, V] -> [B]
"""
from __future__ import annotations

import hashlib

import torch
from transformers import LogitsProcessor

SAMPLING_KEYS = ("do_sample", "temperature", "top_p", "top_k")


def example_seeds(seed: int, example_ids: list[str]) -> list[int]:
    """One 63-bit seed per example from the run seed and the example's id (independent of batch and order)."""
    return [int.from_bytes(hashlib.sha256(f"{seed}/{eid}".encode()).digest()[:8], "big") >> 1 for eid in example_ids]


def check_sampling(sampling: dict | None) -> None:
    """Refuse unknown keys and impossible values in one sentence."""
    sampling = sampling or {}
    unknown = sorted(set(sampling) - set(SAMPLING_KEYS))
    if unknown:
        raise ValueError(f"sampling takes {', '.join(SAMPLING_KEYS)}; unknown: {', '.join(unknown)}.")
    if float(sampling.get("temperature", 1.0)) <= 0:
        raise ValueError(f"sampling.temperature must be > 0, got {sampling['temperature']}.")
    if not 0 < float(sampling.get("top_p", 1.0)) <= 1:
        raise ValueError(f"sampling.top_p must be in (0, 1], got {sampling['top_p']}.")
    if int(sampling.get("top_k", 0)) < 0:
        raise ValueError(f"sampling.top_k must be >= 0 (0 = off), got {sampling['top_k']}.")


class TokenChooser:
    """logits [B, V] -> next token ids [B]: argmax, or a sample from the filtered distribution of each row."""

    def __init__(self, sampling: dict | None, seeds: list[int], device):
        check_sampling(sampling)
        sampling = sampling or {}
        self.sample = bool(sampling.get("do_sample", False))
        self.temperature = float(sampling.get("temperature", 1.0))
        self.top_p, self.top_k = float(sampling.get("top_p", 1.0)), int(sampling.get("top_k", 0))
        self.generators = [torch.Generator(device=device).manual_seed(s) for s in seeds] if self.sample else []

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.sample:
            return logits.argmax(-1)
        probs = filtered_probs(logits.float() / self.temperature, self.top_k, self.top_p)     # [B, V]
        race = torch.stack([torch.empty_like(probs[0]).exponential_(generator=g) for g in self.generators])
        return (probs / race).argmax(-1)


def filtered_probs(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Softmax of logits [B, V] restricted to the top_k tokens, then to the smallest set reaching top_p."""
    if 0 < top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]                          # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(-1, descending=True)
        before = sorted_probs.cumsum(-1) - sorted_probs                          # mass of the tokens ranked above
        sorted_probs = sorted_probs.masked_fill(before >= top_p, 0.0)           # the top token always stays
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


class ChooserProcessor(LogitsProcessor):
    """A transformers logits processor that lets `TokenChooser` pick: every other token's score becomes -inf,
    so generate's greedy argmax takes the chooser's token (generate must run with do_sample=False)."""

    def __init__(self, chooser: TokenChooser):
        self.chooser = chooser

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        chosen = self.chooser(scores)                                                # [B]
        out = torch.full_like(scores, float("-inf"))
        return out.scatter(-1, chosen[:, None], 0.0)

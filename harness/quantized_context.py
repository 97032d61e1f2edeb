"""Quantized-context scoring: every token attends to the quantized history of the tokens before it.

A plain forward pass attends to its whole context in full precision, so loglikelihood and perplexity
numbers would not see the KV quantizer at all. Here the sequence is fed through a fresh quantized cache
in chunks, so each token's logits are exactly those of a token-by-token (teacher-forced) decode through
the same cache: the sink and recent windows stay full precision, everything older is read back from its
codes (as KIVI and KVQuant measure perplexity).

Chunks that keep that exact: a first chunk of sink + recent tokens (nothing is demoted before it is full),
then chunks of `d` tokens, `d` the largest divisor of the demotion page that the decode path takes in one
call. A decode step demotes whole pages before it appends, and with such chunks every page boundary falls
on a chunk boundary, so no token-by-token step would have demoted anything in the middle of a chunk
(tests/test_quantized_context.py checks the equality). A cache the harness does not lay out (transformers'
QuantizedCache) is fed one token at a time.

    logits = quantized_context_logits(model, input_ids, seam.new_cache, seam.quantizer)   # [B, T, V]
"""
from __future__ import annotations

import torch

from harness.cache import KERNEL_MAX_QUERY_TOKENS
from harness.quantizer import has_own_cache


def quantizes_cache(quantizer) -> bool:
    """Whether `quantizer` changes what the cache reads back (the identity does not)."""
    return quantizer.stores_codes or has_own_cache(quantizer)


def chunk_sizes(quantizer, total: int) -> list[int]:
    """Query chunk lengths that reproduce token-by-token decode through `quantizer`'s cache, summing to `total`."""
    if not quantizes_cache(quantizer):
        return [total] if total else []
    if has_own_cache(quantizer):
        first, step = 0, 1
    else:
        first = min(total, (quantizer.sink_tokens or 0) + quantizer.recent_tokens)
        step = max(d for d in range(1, KERNEL_MAX_QUERY_TOKENS + 1) if quantizer.page_tokens % d == 0)
    rest = total - first
    return ([first] if first else []) + [step] * (rest // step) + ([rest % step] if rest % step else [])


@torch.no_grad()
def quantized_context_logits(model, input_ids: torch.Tensor, new_cache, quantizer) -> torch.Tensor:
    """Logits [B, T, V] of `input_ids` [B, T] (right-padded or unpadded) read through a fresh quantized cache.

    Right padding is harmless: a padded position only follows the real tokens, so it never enters their
    context; each row's windows count from its first token.
    """
    cache, start, logits = new_cache(), 0, []
    for size in chunk_sizes(quantizer, input_ids.shape[1]):
        chunk = input_ids[:, start:start + size]                                   # [B, size]
        out = model(input_ids=chunk, past_key_values=cache, use_cache=True)
        logits.append(out.logits)                                                  # [B, size, V]
        start += size
    return torch.cat(logits, dim=1)

"""Qwen3-style attentions' q and k norms inside the compiled step's RoPE call (harness.deferred_norms) against the
stock attention."""
import functools
import sys

import pytest
import torch

from harness.deferred_norms import deferred_norms, normed_rope_for, qk_norm_attentions, rope_taking_norms


def test_only_attentions_that_norm_q_and_k_before_rope_are_taken(tiny):
    """Qwen3's attentions norm q and k right before RoPE; Llama's have no such norms and Gemma 3's norm elsewhere in
    their forward; a norm with a forward of its own instance is left alone."""
    model = tiny("qwen3")[0]
    assert qk_norm_attentions(model) == [layer.self_attn for layer in model.model.layers]
    assert qk_norm_attentions(tiny("llama")[0]) == [] and qk_norm_attentions(tiny("gemma3")[0]) == []
    model.model.layers[0].self_attn.k_norm.forward = lambda x: x
    assert qk_norm_attentions(model) == [model.model.layers[1].self_attn]


def _swapped_rope(model, pending):
    """The modeling module's RoPE function as compiled_parts sets it (uncompiled here): (namespace, stock)."""
    space = sys.modules[type(model.model.layers[0].self_attn).__module__]
    stock = space.apply_rotary_pos_emb
    space.apply_rotary_pos_emb = functools.partial(rope_taking_norms, pending=pending, rope=stock,
                                                   normed=normed_rope_for(stock))
    return space, stock


def test_deferred_norms_give_the_stock_logits(tiny):
    """Each attention's norms record themselves and RoPE applies them: the same operations, the same logits; after
    the block the stock forwards are back and nothing is pending."""
    model = tiny("qwen3")[0]
    ids = torch.randint(0, model.config.vocab_size, (2, 6))
    expected = model(input_ids=ids).logits
    pending, applied = {}, []
    space, stock = _swapped_rope(model, pending)
    normed = space.apply_rotary_pos_emb.keywords["normed"]
    space.apply_rotary_pos_emb.keywords["normed"] = lambda *a: applied.append(a[:2]) or normed(*a)
    try:
        with deferred_norms(qk_norm_attentions(model), pending):
            got = model(input_ids=ids).logits
    finally:
        space.apply_rotary_pos_emb = stock
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    assert applied == [(layer.self_attn.q_norm, layer.self_attn.k_norm) for layer in model.model.layers]
    assert not pending and not any("forward" in vars(m) for m in model.modules())


def test_a_rope_call_with_one_norm_pending_fails(tiny):
    model = tiny("qwen3")[0]
    attention = model.model.layers[0].self_attn
    pending = {"q": attention.q_norm}
    q, k = torch.randn(1, 4, 1, 16), torch.randn(1, 2, 1, 16)
    with pytest.raises(RuntimeError, match="deferred q/k norms out of order"):
        rope_taking_norms(q, k, None, None, pending=pending, rope=None, normed=None)

"""A compiled decode step's q and k RMSNorms (Qwen3-style attentions) run inside the compiled RoPE call.

    attentions = qk_norm_attentions(model)            # attentions whose forward norms q and k right before RoPE
    pending = {}
    with deferred_norms(attentions, pending):         # harness.compiled_step.compiled_parts does this, with
        ...                                           # each RoPE namespace's function set to `rope_taking_norms`

A Qwen3 attention norms q and k (one compiled RMSNorm call each) and then rotates both by RoPE (one compiled call):
at a batch-1 decode step four small kernels (1.0-1.3 us each on the H100, results/bench/step_kernels.md) plus their
launch gaps. Inside the block the q and k norms of such an attention only record themselves (`pending`) and hand
their input on; the RoPE function that comes next applies both norms and the rotation in one compiled call
(`normed_rope_for`: the norms' own class forwards, then the modeling module's own `apply_rotary_pos_emb`), the same
operations in the same order, which inductor fuses into two kernels (q's norm and rotation, k's) where four ran: two
launches fewer per layer (results/bench/bench_throughput_qk_norms.md).

An attention is taken only where its class forward contains `QK_NORM_BLOCK` (its norms' outputs reach RoPE and
nothing else; comments and whitespace removed) and its q and k norms have no forward of their own instance.
"""
from __future__ import annotations

import functools
from contextlib import contextmanager

import torch

from harness.fused_projections import bare_source

QK_NORM_BLOCK = (  # transformers' Qwen3 attention from its projections to RoPE, whitespace removed
    "query_states=self.q_norm(self.q_proj(hidden_states).view(hidden_shape)).transpose(1,2)"
    "key_states=self.k_norm(self.k_proj(hidden_states).view(hidden_shape)).transpose(1,2)"
    "value_states=self.v_proj(hidden_states).view(hidden_shape).transpose(1,2)"
    "cos,sin=position_embeddingsquery_states,key_states=apply_rotary_pos_emb(query_states,key_states,cos,sin)")


def qk_norm_attention(module: torch.nn.Module) -> bool:
    """An attention whose forward norms q and k and hands both to RoPE and nothing else, with stock norm modules."""
    norms = [getattr(module, name, None) for name in ("q_norm", "k_norm")]
    return (all(isinstance(n, torch.nn.Module) and "forward" not in vars(n) for n in norms)
            and QK_NORM_BLOCK in bare_source(type(module).forward))


def qk_norm_attentions(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if qk_norm_attention(m)]


@functools.cache
def normed_rope_for(rope):
    """The function compiled for a RoPE namespace's deferred norms: rope(q_norm(q), k_norm(k), cos, sin) with the
    norms' class forwards; q [B, H_q, T, D], k [B, H_kv, T, D]."""
    def normed_rope(q_norm, k_norm, q, k, cos, sin):
        return rope(type(q_norm).forward(q_norm, q), type(k_norm).forward(k_norm, k), cos, sin)
    return normed_rope


def rope_taking_norms(q, k, cos, sin, *args, pending: dict, rope, normed, **kwargs):
    """A RoPE namespace's function inside the block: `normed` (compiled `normed_rope_for(rope)`) where an attention left its q
    and k norms in `pending`, else `rope` (compiled stock RoPE)."""
    if not pending:
        return rope(q, k, cos, sin, *args, **kwargs)
    if set(pending) != {"q", "k"} or args or kwargs:
        raise RuntimeError(f"deferred q/k norms out of order: {sorted(pending)} pending at a RoPE call.")
    q_norm, k_norm = pending.pop("q"), pending.pop("k")
    return normed(q_norm, k_norm, q, k, cos, sin)


def _record(norm: torch.nn.Module, role: str, pending: dict, x: torch.Tensor) -> torch.Tensor:
    pending[role] = norm
    return x


@contextmanager
def deferred_norms(attentions: list[torch.nn.Module], pending: dict):
    """Inside: the q and k norms of `attentions` record themselves in `pending` and return their input (the RoPE
    function applies them, `rope_taking_norms`); their stock forwards again after, and `pending` emptied."""
    for attention in attentions:
        for role in ("q", "k"):
            norm = getattr(attention, f"{role}_norm")
            norm.forward = functools.partial(_record, norm, role, pending)
    try:
        yield
    finally:
        pending.clear()
        for attention in attentions:
            del attention.q_norm.forward, attention.k_norm.forward

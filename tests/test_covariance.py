"""Tests for oscar.covariance against brute-force loops and an explicit dense softmax computation."""
import math

import pytest
import torch

from oscar.covariance import (ktk_target, query_second_moment, value_target_softmax, value_target_surrogate,
                              vtv_target)

N, H_Q, H_KV, D = 7, 4, 2, 8
GROUP = H_Q // H_KV


@pytest.fixture
def qkv():
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(N, H_Q, D, generator=generator)
    k = torch.randn(N, H_KV, D, generator=generator)
    k[2] *= 5.0  # a large-norm "sink" key so the surrogate weights are far from uniform
    v = torch.randn(N, H_KV, D, generator=generator)
    return q, k, v


def outer_mean(vectors):
    return sum(torch.outer(x, x) for x in vectors) / len(vectors)


def test_query_second_moment_equals_loop(qkv):
    q = qkv[0].double()
    expected = outer_mean([q[n, h] for n in range(N) for h in range(H_Q)])
    C_Q = query_second_moment(qkv[0])
    assert C_Q.dtype == torch.float64 and torch.equal(C_Q, C_Q.T)
    assert torch.allclose(C_Q, expected, atol=1e-12)


def test_raw_reconstruction_targets_equal_loops(qkv):
    _, k, v = (x.double() for x in qkv)
    assert torch.allclose(ktk_target(qkv[1]), outer_mean([k[n, h] for n in range(N) for h in range(H_KV)]), atol=1e-12)
    assert torch.allclose(vtv_target(qkv[2]), outer_mean([v[n, h] for n in range(N) for h in range(H_KV)]), atol=1e-12)


def surrogate_by_loops(q, k, v):
    per_head = []
    for h in range(H_KV):
        A = outer_mean([q[n, h * GROUP + j] for n in range(N) for j in range(GROUP)])
        w = [k[t, h] @ A @ k[t, h] for t in range(N)]
        total = max(sum(w), 1e-12)
        per_head.append(sum((N * w[t] / total) * torch.outer(v[t, h], v[t, h]) for t in range(N)) / N)
    return sum(per_head) / H_KV


def test_surrogate_equals_per_token_loop(qkv):
    C_S = value_target_surrogate(*qkv)
    assert torch.equal(C_S, C_S.T)
    assert torch.allclose(C_S, surrogate_by_loops(*(x.double() for x in qkv)), atol=1e-12)


def test_surrogate_ignores_query_scale(qkv):
    q, k, v = qkv
    assert torch.allclose(value_target_surrogate(3.0 * q, k, v), value_target_surrogate(q, k, v), atol=1e-12)


def dense_softmax_target(q, k, v, scaling, seq_lens):
    """C_S = mean over query heads of (1/N) V^T S^T S V with a block-diagonal causal N x N softmax S."""
    allowed = torch.zeros(N, N, dtype=torch.bool)
    start = 0
    for length in seq_lens:
        for i in range(length):
            allowed[start + i, start:start + i + 1] = True
        start += length
    total = torch.zeros(D, D, dtype=torch.float64)
    for head in range(H_Q):
        kv_head = head // GROUP
        logits = (q[:, head] @ k[:, kv_head].T * scaling).masked_fill(~allowed, -math.inf)
        S = torch.softmax(logits, dim=-1)  # [N, N]
        total += v[:, kv_head].T @ S.T @ S @ v[:, kv_head] / N
    return total / H_Q


@pytest.mark.parametrize("seq_lens", [[7], [3, 4], [1, 2, 4]])
def test_softmax_target_equals_dense_computation(qkv, seq_lens):
    scaling = 1 / math.sqrt(D)
    C_S = value_target_softmax(*qkv, scaling, seq_lens)
    expected = dense_softmax_target(*(x.double() for x in qkv), scaling, seq_lens)
    assert torch.equal(C_S, C_S.T)
    assert torch.allclose(C_S, expected, atol=1e-12)


def test_softmax_target_defaults_to_one_sequence(qkv):
    assert torch.equal(value_target_softmax(*qkv, 0.5), value_target_softmax(*qkv, 0.5, [N]))


def test_bad_shapes_are_rejected(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match="seq_lens"):
        value_target_softmax(q, k, v, 0.5, [3, 3])
    with pytest.raises(ValueError, match="does not divide"):
        value_target_surrogate(q[:, :3], k, v)
    with pytest.raises(ValueError, match=r"\[N, H_q, D\]"):
        value_target_surrogate(q, k, v[:, :1])

"""A decode step's K and V rows into a frozen cache's buffers (`kernels.step_rows`) against its reference, bit for bit;
and the decode kernel's output held token-major (no copy for the output projection).

Runs under TRITON_INTERPRET=1 on CPU (set below when CUDA is unavailable).
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from kernels.step_rows import write_step_rows, write_step_rows_reference  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _buffers(batch, heads, capacity, head_dim, dtype):
    gen = torch.Generator().manual_seed(3)
    return [torch.randn(batch, heads, capacity, head_dim, generator=gen).to(DEVICE, dtype) for _ in range(2)]


@pytest.mark.parametrize("rows_dtype,buffer_dtype,head_dim", [
    (torch.bfloat16, torch.bfloat16, 64),
    (torch.float32, torch.bfloat16, 128),      # rotated keys in fp32 (rotation_dtype=float32), cast on the way in
    (torch.float16, torch.float32, 80),        # a head_dim that is not a power of two
])
def test_step_rows_match_two_index_copies(rows_dtype, buffer_dtype, head_dim):
    batch, heads, capacity = 3, 2, 9
    gen = torch.Generator().manual_seed(5)
    keys = (torch.randn(batch, 1, heads, head_dim, generator=gen) * 7).to(DEVICE, rows_dtype).transpose(1, 2)
    values = torch.randn(batch, heads, 1, head_dim, generator=gen).to(DEVICE, rows_dtype)
    write_pos = torch.tensor([6], device=DEVICE)
    got, want = _buffers(batch, heads, capacity, head_dim, buffer_dtype), _buffers(batch, heads, capacity, head_dim,
                                                                                   buffer_dtype)
    write_step_rows(*got, keys, values, write_pos)
    write_step_rows_reference(*want, keys, values, write_pos)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert not torch.equal(got[0][:, :, 6], _buffers(batch, heads, capacity, head_dim, buffer_dtype)[0][:, :, 6])


def test_step_rows_refuse_mismatched_rows_in_one_sentence():
    key_buffer, value_buffer = _buffers(1, 2, 4, 64, torch.float32)
    rows = torch.zeros(1, 2, 2, 64, device=DEVICE)
    with pytest.raises(ValueError, match=r"^keys must be \[B, H_kv, 1, D\] rows"):
        write_step_rows(key_buffer, value_buffer, rows, rows, torch.tensor([0], device=DEVICE))
    one = torch.zeros(1, 2, 1, 64, device=DEVICE)
    with pytest.raises(ValueError, match=r"^write_pos must be one int64"):
        write_step_rows(key_buffer, value_buffer, one, one, torch.tensor([0], dtype=torch.int32, device=DEVICE))


def test_decode_output_is_token_major():
    """The seam hands `out.transpose(1, 2)` to the output projection; held [B, T_q, H_q, D] it needs no copy (with
    one query token either layout is contiguous: two here)."""
    from kernels.decode import decode_attention
    from kernels.format import QuantSpec
    from kernels.reference import quantize_pack_reference
    spec = QuantSpec(bits=2, group=64)
    gen = torch.Generator().manual_seed(0)
    batch, kv_heads, q_heads, tokens, head_dim = 2, 2, 4, 32, 64
    q = torch.randn(batch, q_heads, 2, head_dim, generator=gen).to(DEVICE)
    k, v = (torch.randn(batch, kv_heads, tokens, head_dim, generator=gen).to(DEVICE) for _ in range(2))
    fp = torch.randn(batch, kv_heads, 4, head_dim, generator=gen).to(DEVICE)
    lengths = [torch.full((batch,), n, dtype=torch.int32, device=DEVICE) for n in (tokens, 4, 0, 0)]
    out = decode_attention(q, *quantize_pack_reference(k, spec), *quantize_pack_reference(v, spec), fp, fp,
                           *lengths, sm_scale=head_dim ** -0.5, k_spec=spec, v_spec=spec)
    assert out.shape == (batch, q_heads, 2, head_dim)
    assert out.transpose(1, 2).is_contiguous()

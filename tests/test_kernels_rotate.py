"""fp32 rotations of head rows in one launch (`kernels.rotate`) against float64 and against the torch expression they
replace, their independence from the rows launched with them, and the cache's dispatch to them (`harness.cache.rotate`).

Runs under TRITON_INTERPRET=1 on CPU (set below when CUDA is unavailable).
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from harness.cache import rotate  # noqa: E402
from kernels.rotate import rotate_rows, rotate_rows_reference  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _orthogonal(head_dim: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.linalg.qr(torch.randn(head_dim, head_dim, generator=gen, dtype=torch.float64))[0]   # [D, D]


def _rows(batch, heads, tokens, head_dim, dtype, seed=0) -> torch.Tensor:
    """[B, H, T, D] rows held token-major (the transposed query layout the seam gets)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, tokens, heads, head_dim, generator=gen) * 3
    return x.to(DEVICE, dtype).transpose(1, 2)


def _bf16_steps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many bf16 values apart a and b are (same sign assumed where they differ)."""
    return (a.view(torch.int16).int() - b.view(torch.int16).int()).abs()


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("with_offset", [False, True])
def test_rotation_is_fp32_exact_and_rounds_like_the_torch_path(head_dim, with_offset):
    heads = 3
    rotation64 = _orthogonal(head_dim, head_dim)
    rotation = rotation64.float().contiguous().to(DEVICE)
    x = _rows(2, heads, 5, head_dim, torch.bfloat16)
    gen = torch.Generator().manual_seed(1)
    offset = torch.randn(heads, head_dim, generator=gen).to(DEVICE) if with_offset else None
    exact = x.double() @ rotation.double()                                             # [B, H, T, D]
    if offset is not None:
        exact = exact - offset.double()[None, :, None, :]
    wide = rotate_rows(x, rotation, offset, out_dtype=torch.float32)
    bound = 1e-6 * (x.double().abs() @ rotation.double().abs()).max().item() + 1e-6
    assert wide.dtype == torch.float32 and (wide.double() - exact).abs().max().item() < bound
    got, want = rotate_rows(x, rotation, offset), rotate_rows_reference(x, rotation, offset)
    assert got.dtype == torch.bfloat16 and got.shape == x.shape and got.is_contiguous()
    steps = _bf16_steps(got.cpu(), want.cpu())
    assert steps.max().item() <= 1 and (steps > 0).float().mean().item() < 0.01     # fp32 sums in another order
    assert not torch.equal(got, x.contiguous())


def test_a_rows_result_does_not_depend_on_the_rows_launched_with_it():
    rotation = _orthogonal(128, 7).float().contiguous().to(DEVICE)
    x = _rows(4, 8, 40, 128, torch.bfloat16, seed=2)                                   # 1,280 rows
    together = rotate_rows(x, rotation, out_dtype=torch.float32)
    for b, t in ((0, slice(0, 1)), (3, slice(17, 18)), (2, slice(5, 21))):
        alone = rotate_rows(x[b:b + 1, :, t], rotation, out_dtype=torch.float32)
        assert torch.equal(alone, together[b:b + 1, :, t])


def test_the_cache_takes_the_kernel_for_fp32_rotations_on_the_kernel_path(monkeypatch):
    import harness.cache
    calls = []
    monkeypatch.setattr(harness.cache, "rotate_rows", lambda *a: calls.append(a) or rotate_rows(*a))
    rotation = _orthogonal(64, 3).float().contiguous().to(DEVICE)
    x = _rows(1, 2, 3, 64, torch.bfloat16)
    assert torch.equal(rotate(x, rotation, use_kernel=True), rotate_rows(x, rotation)) and len(calls) == 1
    assert torch.equal(rotate(x, rotation), rotate_rows_reference(x, rotation)) and len(calls) == 1
    in_model_dtype = rotation.to(torch.bfloat16)                                       # rotation_dtype=model
    assert torch.equal(rotate(x, in_model_dtype, use_kernel=True), rotate_rows_reference(x, in_model_dtype))
    assert len(calls) == 1


def test_operands_that_do_not_fit_get_one_sentence():
    x = _rows(1, 2, 3, 64, torch.bfloat16)
    with pytest.raises(ValueError, match=r"^rotate_rows needs a contiguous fp32 \[64, 64\] rotation"):
        rotate_rows(x, torch.eye(64, dtype=torch.bfloat16, device=DEVICE))
    with pytest.raises(ValueError, match=r"^rotate_rows needs a contiguous fp32 offset \[2, 64\]"):
        rotate_rows(x, torch.eye(64, device=DEVICE), torch.zeros(3, 64, device=DEVICE))
    with pytest.raises(ValueError, match=r"^rotate_rows takes \[B, H, T, D\] rows with D in"):
        rotate_rows(torch.zeros(1, 2, 3, 80, device=DEVICE), torch.eye(80, device=DEVICE))

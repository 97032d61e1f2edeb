"""The single-row GEMM kernel (`kernels.gemv`) against its fp32 reference, its torch operator, and where the compiled
decode step routes projections to it (`harness.fused_projections.single_row_linear`, CUDA only).

Runs under TRITON_INTERPRET=1 on CPU (set below when CUDA is unavailable).
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from kernels.gemv import MAX_ROWS, GemvConfig, gemv, gemv_op, gemv_reference, rms_norm  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="the routing applies to CUDA inputs")


def _operands(rows, n, k, dtype=torch.float16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen).to(DEVICE, dtype)
    w = (torch.randn(n, k, generator=gen) * 0.05).to(DEVICE, dtype)
    return x, w


@pytest.mark.parametrize("rows,n,k,config", [
    (1, 37, 300, GemvConfig(2, 128, 1, 1)),        # N and K not multiples of the blocks
    (3, 64, 512, GemvConfig(4, 256, 2, 2)),
    (MAX_ROWS, 16, 1024, None),                    # the default launch
])
def test_gemv_matches_the_fp32_reference(rows, n, k, config):
    x, w = _operands(rows, n, k)
    bias = torch.randn(n).to(DEVICE, x.dtype) if rows == 3 else None
    got, want = gemv(x, w, bias, config=config), gemv_reference(x, w, bias)
    assert got.shape == (rows, n) and got.dtype == x.dtype
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("rows,bias", [(1, False), (3, True)])
def test_gemv_adds_a_residual_before_its_one_rounding(rows, bias):
    """y = x @ W^T (+ bias) + residual: the residual (here large against the product, the decoder's stream) joins the
    fp32 sum, so the result is the reference's single rounding, not round(round(x @ W^T) + residual)."""
    x, w = _operands(rows, 48, 256, seed=1)
    b = torch.randn(48).to(DEVICE, x.dtype) if bias else None
    residual = (torch.randn(rows, 64) * 30).to(DEVICE, x.dtype)[:, :48]       # rows strided by 64, as a slice
    got, want = gemv(x, w, b, residual), gemv_reference(x, w, b, residual)
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-3, atol=2e-3)
    assert not torch.allclose(got.float(), gemv(x, w, b).float(), rtol=0.1, atol=0.1)   # the residual is there


@pytest.mark.parametrize("rows,norm_block", [(1, 0), (3, 0), (1, 4096)])
def test_gemv_folds_an_rms_norm_in_front(rows, norm_block):
    """norm = (g, eps): the kernel's input is `rms_norm(x, g, eps)`, which is the stock RMSNorm class's result in
    fp32 (Qwen3's), and the product matches the reference's within fp32 rounding, whether the sum of squares runs in
    the 128-wide slices of the product or, for one row, (norm_block, capped at 512 for K = 300) in one masked slice."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm
    x, w = _operands(rows, 40, 300, seed=2)
    x = x * 3
    g = (torch.randn(300) * 0.3 + 1).to(DEVICE, x.dtype)
    config = GemvConfig(2, 128, 1, 1, norm_block)
    got, want = gemv(x, w, norm=(g, 1e-6), config=config), gemv_reference(x, w, norm=(g, 1e-6))
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-3, atol=2e-3)
    assert not torch.allclose(got.float(), gemv(x, w).float(), rtol=0.1, atol=0.1)          # the norm is there
    stock = Qwen3RMSNorm(300, eps=1e-6).to(DEVICE)
    stock.weight.data = g.float()
    torch.testing.assert_close(rms_norm(x.float(), g.float(), 1e-6), stock(x.float()), rtol=0, atol=0)


@pytest.mark.parametrize("rows,norm", [(1, False), (3, True)])
def test_gated_gemv_stores_silu_of_gate_times_up(rows, norm):
    """gated: W = [gate; up], each program streams matching gate and up rows and stores silu(gate) * up [M, N / 2],
    the reference's (both halves rounded, the product in fp32 rounded once), with or without a folded norm."""
    x, w = _operands(rows, 2 * 37, 300, seed=3)
    g = (torch.rand(300) + 0.5).to(DEVICE, x.dtype)
    kw = dict(norm=(g, 1e-6) if norm else None, gated=True)
    got, want = gemv(x, w, config=GemvConfig(2, 128, 1, 1), **kw), gemv_reference(x, w, **kw)
    assert got.shape == (rows, 37)
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-3, atol=2e-3)
    gate, up = gemv_reference(x, w, norm=kw["norm"]).float().chunk(2, dim=-1)
    torch.testing.assert_close(got.float(), F.silu(gate) * up, rtol=1e-2, atol=1e-2)
    with pytest.raises(ValueError, match=r"^gemv gated needs \[gate; up\] weights of an even row count"):
        gemv(x, w[:-1], gated=True)


def test_gemv_operator_passes_torch_checks():
    """Schema, fake (meta) shapes for torch.compile, and the eager result of `gemv_op`."""
    x, w = _operands(1, 24, 256)
    torch.library.opcheck(gemv_op, (x, w, None), test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(gemv_op, (x, w, None, torch.ones(x.shape[0], w.shape[0], dtype=x.dtype, device=DEVICE)),
                          test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(gemv_op, (x, w, None, None, torch.ones(x.shape[1], dtype=x.dtype, device=DEVICE), 1e-6),
                          test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(gemv_op, (x, w, None, None, None, 0.0, True), test_utils=("test_schema", "test_faketensor"))
    torch.testing.assert_close(gemv_op(x, w).float(), gemv_reference(x, w).float(), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("x_shape,w_shape,dtype,message", [
    ((2, 64), (8, 32), torch.float16, r"^gemv needs x \[M, K\] and weight \[N, K\]"),
    ((MAX_ROWS + 1, 64), (8, 64), torch.float16, r"^gemv takes 1 to 8 rows"),
])
def test_gemv_refuses_bad_operands_in_one_sentence(x_shape, w_shape, dtype, message):
    with pytest.raises(ValueError, match=message):
        gemv(torch.zeros(x_shape, dtype=dtype, device=DEVICE), torch.zeros(w_shape, dtype=dtype, device=DEVICE))
    with pytest.raises(ValueError, match=r"^gemv needs x and weight of one dtype"):
        gemv(torch.zeros(1, 64, dtype=torch.float16, device=DEVICE),
             torch.zeros(8, 64, dtype=torch.bfloat16, device=DEVICE))
    with pytest.raises(ValueError, match=r"^gemv needs a residual \[1, 8\] of x's dtype"):
        gemv(torch.zeros(1, 64, dtype=torch.float16, device=DEVICE), torch.zeros(8, 64, dtype=torch.float16,
             device=DEVICE), residual=torch.zeros(1, 4, dtype=torch.float16, device=DEVICE))


@GPU
def test_single_rows_route_to_the_gemv_kernel_and_others_to_cublas(monkeypatch):
    import harness.fused_projections as fp
    calls = []
    monkeypatch.setattr(fp, "gemv_op", lambda x, w, b, *rest: calls.append(x.shape) or gemv_op(x, w, b, *rest))
    x, w = _operands(1, 96, 512, torch.bfloat16)
    one = fp.single_row_linear(x.view(1, 1, 512), w)                          # a batch-1 decode step's input
    torch.testing.assert_close(one.view(1, 96).float(), F.linear(x, w).float(), rtol=1e-2, atol=1e-2)
    assert one.shape == (1, 1, 96) and calls == [(1, 512)]
    gated = fp.single_row_linear(x.view(1, 1, 512), w, gated=True)           # w as [gate; up]: silu(gate) * up
    gate, up = F.linear(x, w).float().chunk(2, dim=-1)
    torch.testing.assert_close(gated.view(1, 48).float(), F.silu(gate) * up, rtol=1e-2, atol=1e-2)
    assert gated.shape == (1, 1, 48) and calls == [(1, 512)] * 2
    residual = torch.randn(1, 1, 96, device=DEVICE).to(torch.bfloat16)       # a decoder layer's stream
    added = fp.single_row_linear(x.view(1, 1, 512), w, None, residual)        # on the kernel, in its epilogue
    torch.testing.assert_close(added.float(), (F.linear(x, w).float() + residual.float()), rtol=1e-2, atol=1e-2)
    assert len(calls) == 3
    g = torch.rand(512, device=DEVICE).to(torch.bfloat16) + 0.5
    normed = fp.single_row_linear(x.view(1, 1, 512), w, norm=(g, 1e-6))         # the norm inside the kernel
    torch.testing.assert_close(normed.view(1, 96).float(), F.linear(rms_norm(x, g, 1e-6), w).float(), rtol=1e-2,
                               atol=1e-2)
    assert len(calls) == 4
    fp.single_row_linear(x.repeat(2, 1), w)                                    # two rows: cuBLAS
    fp.single_row_linear(x.float(), w.float())                                 # fp32: cuBLAS
    fp.single_row_linear(x.repeat(2, 1), w, norm=(g, 1e-6))                    # two rows: rms_norm, then cuBLAS
    assert len(calls) == 4


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks inductor's CPU code; the GPU test of the fold is in "
                    "tests/test_fused_residuals.py")
def test_rms_norm_is_what_the_compiled_stock_norm_computes():
    """`rms_norm` rounds once, after the weight's product, as torch.compile's code of the stock RMSNorm does (the
    eager class rounds x * rsqrt(...) to bf16 first and differs in about a quarter of the elements)."""
    from harness.compiled_step import cpu_compiler_refusal
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm
    if cpu_compiler_refusal():
        pytest.skip(cpu_compiler_refusal())
    gen = torch.Generator().manual_seed(0)
    norm = Qwen3RMSNorm(256, eps=1e-6)
    norm.weight.data = torch.randn(256, generator=gen) * 0.3 + 1
    norm = norm.bfloat16()
    x = (torch.randn(4, 256, generator=gen) * 3).bfloat16()
    compiled = torch.compile(type(norm).forward)(norm, x)
    assert torch.equal(compiled, rms_norm(x, norm.weight, 1e-6))
    assert not torch.equal(norm(x), compiled)

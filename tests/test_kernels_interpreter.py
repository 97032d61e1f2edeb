"""kernels/interpreter.py: under TRITON_INTERPRET=1 a nested @triton.jit call reuses its launch's patch of
triton.language; the results are the unpatched interpreter's, and each launch still restores the language."""
import pytest
import torch
import triton
import triton.language as tl

from kernels.dispatch import interpreter_forced

pytestmark = pytest.mark.skipif(not interpreter_forced(), reason="the interpreter's patching (TRITON_INTERPRET=1)")


@triton.jit
def _scaled_sum(x, scale):
    return tl.sum(x * scale, axis=0)


@triton.jit
def _row_sums_kernel(x_ptr, out_ptr, scale, N: tl.constexpr):
    row = tl.program_id(0)
    x = tl.load(x_ptr + row * N + tl.arange(0, N))                    # [N]
    tl.store(out_ptr + row, _scaled_sum(x, scale) + _scaled_sum(x, 1.0))


def _row_sums(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape[0], dtype=x.dtype)                       # [R]
    _row_sums_kernel[(x.shape[0],)](x, out, 0.5, N=x.shape[1])
    return out


def test_nested_calls_reuse_the_launch_patch_and_give_the_unpatched_results(monkeypatch):
    from triton.runtime import interpreter
    from kernels.interpreter import skip_nested_lang_patches
    assert skip_nested_lang_patches() and interpreter._patch_lang.skips_nested
    original = interpreter._patch_lang.original
    calls = []

    def counted(fn):
        calls.append(fn.__name__)
        return original(fn)
    monkeypatch.setattr(interpreter._patch_lang, "original", counted, raising=False)
    x = torch.randn(3, 16)                                               # [R, N]
    skipped = _row_sums(x)
    assert calls.count("_row_sums_kernel") == 1 and "_scaled_sum" not in calls     # the launch's patch, reused
    monkeypatch.setattr(interpreter, "_patch_lang", counted)
    full = _row_sums(x)
    assert torch.equal(skipped, full)
    torch.testing.assert_close(full, 1.5 * x.sum(dim=1))
    assert calls.count("_row_sums_kernel") == 2 and calls.count("_scaled_sum") == 3 * 2   # 2 calls per program
    assert tl.core.is_builtin(tl.load)                                    # the launch restored the language


def test_the_skip_is_installed_once_and_only_on_the_pinned_triton(monkeypatch):
    from triton.runtime import interpreter
    from kernels import interpreter as skip
    installed = interpreter._patch_lang
    assert skip.skip_nested_lang_patches() and interpreter._patch_lang is installed
    monkeypatch.setattr(interpreter, "_patch_lang", installed.original)
    monkeypatch.setattr(triton, "__version__", "3.7.0")
    assert not skip.skip_nested_lang_patches() and interpreter._patch_lang is installed.original

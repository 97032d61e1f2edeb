"""TurboQuant's Triton kernels (kernels/turbo) against its reference format (baselines/turboquant_format.py).

The write kernel stores the reference's bytes bit for bit; the decode kernel matches fp32 attention over the
reference's dequantized history. Runs under TRITON_INTERPRET=1 on CPU (set below when CUDA is unavailable),
where the decode kernel computes in fp32; on a GPU its dot operands are fp16.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from baselines.turboquant import TurboQuant  # noqa: E402
from baselines.turboquant_format import (TurboSpec, dequantize_keys, dequantize_values, quantize_keys,  # noqa: E402
                                         quantize_values)
from kernels.decode.launch import DecodeConfig  # noqa: E402
from kernels.decode.reference import attention_reference  # noqa: E402
from kernels.format import QuantizedTensor  # noqa: E402
from kernels.turbo.decode import decode_attention_turbo  # noqa: E402
from kernels.turbo.ops import TurboKernels  # noqa: E402
from kernels.turbo.write import quantize_pack_turbo  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = 1e-4 if DEVICE == "cpu" else 2e-2  # fp32 in the interpreter; fp16 dot operands on the GPU


def _quantizer(head_dim: int, **options) -> TurboQuant:
    quantizer = TurboQuant(**options)
    quantizer._resolve(head_dim)
    return quantizer


def _reference_parts(x: torch.Tensor, spec, quantizer: TurboQuant) -> QuantizedTensor:
    return quantize_keys(x, spec, quantizer.boundaries) if spec.kind == "key" else quantize_values(x, spec)


def _history(x: torch.Tensor, spec, quantizer: TurboQuant) -> QuantizedTensor:
    """The reference's parts of x [B, H_kv, N, D]; for N = 0 the write kernel's empty parts (the reference's
    reshapes cannot infer a size from an empty tensor)."""
    if x.shape[2]:
        return _reference_parts(x, spec, quantizer)
    return QuantizedTensor(*quantize_pack_turbo(x, spec, quantizer.boundaries), spec, x.shape[-1])


# ---------------------------------------------------------------------------------------- write
WRITE_CASES = {  # name: (B, H_kv, T, D, key bits, value bits)
    "d128-t37-b2": (2, 3, 37, 128, 3, 3),
    "d64-t1": (1, 2, 1, 64, 3, 3),
    "d64-t19-b3-k2v4": (3, 1, 19, 64, 2, 4),       # the other tight widths (vLLM's k3v4 preset stores 4-bit values)
    "d256-t9-k4v2": (1, 1, 9, 256, 4, 2),
}


@pytest.mark.parametrize("name", WRITE_CASES)
def test_write_kernel_stores_the_reference_bytes(name):
    batch, heads, tokens, head_dim, key_bits, value_bits = WRITE_CASES[name]
    quantizer = _quantizer(head_dim, key_bits=key_bits, value_bits=value_bits)
    x = torch.randn(batch, heads, tokens, head_dim, generator=torch.Generator().manual_seed(tokens)) * 3
    x[0, 0, 0] = 0.0                                        # a zero key: zero norm, codes of the zero vector
    if tokens > 1:
        x[0, -1, 1] *= 1e4                                  # a norm beyond fp16's range (saturates)
    kernels = TurboKernels(quantizer.centroids, quantizer.boundaries)
    for spec in (quantizer.key_spec, quantizer.value_spec):
        got = kernels.quantize_pack(x.to(DEVICE), spec)
        ref = _reference_parts(x, spec, quantizer)
        for part, a, b in zip(("codes", "scale", "zero"), got, (ref.codes, ref.scale, ref.zero)):
            assert a.dtype == b.dtype and a.shape == b.shape, (spec.kind, part)
            assert torch.equal(a.cpu(), b), f"{spec.kind} {part} differs in {(a.cpu() != b).sum()} places"


def test_write_kernel_reads_bf16_rows_and_strided_views():
    """The cache hands bf16 rows (upcast after the load), sometimes a slice of a wider buffer."""
    quantizer = _quantizer(128)
    wide = torch.randn(2, 2, 24, 128, generator=torch.Generator().manual_seed(5)).bfloat16()
    rows = wide[:, :, 3:20]                                                       # [B, H_kv, 17, D], strided
    for spec in (quantizer.key_spec, quantizer.value_spec):
        got = quantize_pack_turbo(rows.to(DEVICE), spec, quantizer.boundaries.to(DEVICE))
        ref = _reference_parts(rows.float(), spec, quantizer)
        assert all(torch.equal(a.cpu(), b) for a, b in zip(got, (ref.codes, ref.scale, ref.zero)))


def test_write_kernel_refuses_keys_without_a_codebook():
    quantizer = _quantizer(64)
    x = torch.randn(1, 1, 4, 64, device=DEVICE)
    with pytest.raises(ValueError, match="boundaries"):
        quantize_pack_turbo(x, quantizer.key_spec)
    with pytest.raises(ValueError, match="head_dim"):
        quantize_pack_turbo(torch.randn(1, 1, 4, 96, device=DEVICE), TurboSpec("value", 3, 96))


# ---------------------------------------------------------------------------------------- decode
def make_inputs(batch, q_heads, kv_heads, q_tokens, head_dim, n_hist, n_fp, *, seed=0, **options):
    """q, the reference-quantized TurboQuant history, an fp segment and ragged per-sequence lengths."""
    gen = torch.Generator().manual_seed(seed)
    quantizer = _quantizer(head_dim, **options)
    q = torch.randn(batch, q_heads, q_tokens, head_dim, generator=gen)
    keys = _history(torch.randn(batch, kv_heads, n_hist, head_dim, generator=gen) * 2, quantizer.key_spec, quantizer)
    values = _history(torch.randn(batch, kv_heads, n_hist, head_dim, generator=gen), quantizer.value_spec, quantizer)
    fp_k, fp_v = (torch.randn(batch, kv_heads, n_fp, head_dim, generator=gen) for _ in range(2))
    hist_len = torch.randint(max(n_hist - 5, 0), n_hist + 1, (batch,), generator=gen, dtype=torch.int32)
    fp_len = torch.randint(max(n_fp - 3, q_tokens), n_fp + 1, (batch,), generator=gen, dtype=torch.int32)
    hist_start = torch.minimum(torch.randint(0, 6, (batch,), generator=gen, dtype=torch.int32), hist_len)
    fp_start = torch.minimum(torch.randint(0, 3, (batch,), generator=gen, dtype=torch.int32), fp_len - q_tokens)
    args = (q, keys.codes, keys.scale, keys.zero, values.codes, values.scale, values.zero, fp_k, fp_v,
            hist_len, fp_len, hist_start, fp_start)
    return args, quantizer, (keys, values)


def reference_decode(args, quantizer, history) -> torch.Tensor:
    """fp32 attention over the reference's dequantized history (an empty one: no rows)."""
    q, *_, fp_k, fp_v, hist_len, fp_len, hist_start, fp_start = args
    keys, values = history
    if keys.codes.shape[2]:
        k_hist, v_hist = dequantize_keys(keys, quantizer.centroids), dequantize_values(values)   # [B, H_kv, N, D]
    else:
        k_hist = v_hist = fp_k[:, :, :0].float()
    return attention_reference(q, k_hist, v_hist, fp_k, fp_v, hist_len, fp_len, hist_start, fp_start,
                               sm_scale=q.shape[-1] ** -0.5)


def kernel_decode(args, quantizer, num_splits=None) -> torch.Tensor:
    return decode_attention_turbo(*(t.to(DEVICE) for t in args), sm_scale=args[0].shape[-1] ** -0.5,
                                  k_spec=quantizer.key_spec, v_spec=quantizer.value_spec,
                                  centroids=quantizer.centroids.to(DEVICE), num_splits=num_splits).cpu()


DECODE_CASES = {  # name: (B, H_q, H_kv, T_q, D, N, M, num_splits, quantizer options)
    "gqa4-d128-n150-splits3": (2, 8, 2, 1, 128, 150, 9, 3, {}),
    "gqa1-d64-n70-tq4": (3, 2, 2, 4, 64, 70, 12, None, {}),
    "gqa4-d64-n33-tq16": (1, 4, 1, 16, 64, 33, 20, 2, {}),            # 64 query rows: four row blocks
    "gqa1-d128-n65-no-norm-correction": (2, 2, 2, 1, 128, 65, 5, None, {"norm_correction": False}),
    "gqa4-d64-n40-k3v4": (2, 4, 1, 2, 64, 40, 6, None, {"value_bits": 4}),
    "gqa2-d128-n37-k2v2": (1, 4, 2, 1, 128, 37, 4, None, {"key_bits": 2, "value_bits": 2}),
    "gqa2-d256-n21-k4v3": (1, 4, 2, 1, 256, 21, 3, None, {"key_bits": 4}),
}


@pytest.mark.parametrize("name", DECODE_CASES)
def test_decode_kernel_matches_reference_attention(name):
    *shape, num_splits, options = DECODE_CASES[name]
    args, quantizer, history = make_inputs(*shape, **options)
    out, ref = kernel_decode(args, quantizer, num_splits), reference_decode(args, quantizer, history)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert (out - ref).abs().max().item() < TOL


def test_decode_kernel_with_an_empty_history_is_causal_attention_over_the_fp_segment():
    args, quantizer, history = make_inputs(2, 4, 2, 3, 64, 0, 11)
    assert (kernel_decode(args, quantizer) - reference_decode(args, quantizer, history)).abs().max().item() < TOL


def test_decode_kernel_reads_the_norm_and_the_codebook():
    """Guards the comparison: with every norm doubled, or without norm correction, the output moves."""
    args, quantizer, _ = make_inputs(1, 2, 1, 1, 64, 50, 2, seed=3)
    out = kernel_decode(args, quantizer)
    doubled = args[:2] + (args[2] * 2,) + args[3:]
    assert (kernel_decode(doubled, quantizer) - out).abs().max().item() > 1e-2
    plain = _quantizer(64, norm_correction=False)
    assert (kernel_decode(args, plain) - out).abs().max().item() > 1e-4


@pytest.mark.parametrize("mutate, match", [
    (lambda a: a[:2] + (a[2][..., :0],) + a[3:], "k scale must be"),
    (lambda a: a[:4] + (a[4][..., :8],) + a[5:], "v codes must be"),
    (lambda a: a[:9] + (a[9].long(),) + a[10:], "hist_len must be int32"),
])
def test_decode_kernel_refuses_bad_inputs(mutate, match):
    args, quantizer, _ = make_inputs(1, 2, 1, 1, 64, 8, 3)
    with pytest.raises(ValueError, match=match):
        kernel_decode(mutate(args), quantizer)
    with pytest.raises(ValueError, match="centroids"):
        decode_attention_turbo(*args, sm_scale=0.125, k_spec=quantizer.key_spec, v_spec=quantizer.value_spec,
                               centroids=quantizer.centroids[:4])
    with pytest.raises(ValueError, match="16 tokens per warp"):
        decode_attention_turbo(*args, sm_scale=0.125, k_spec=quantizer.key_spec, v_spec=quantizer.value_spec,
                               centroids=quantizer.centroids, config=DecodeConfig(block_n=64, num_warps=8))


def test_decode_kernel_refuses_key_codes_not_aligned_to_4_bytes():
    """The kernel loads a key row's codes as 16- / 32-bit words: key codes whose rows do not start 4-byte aligned (a
    view one byte into its storage, made on the kernel's device) are refused in one sentence, not read misaligned;
    value codes, joined from bytes, may start anywhere."""
    args, quantizer, _ = make_inputs(1, 2, 1, 1, 64, 8, 3)
    args = tuple(a.to(DEVICE) for a in args)

    def one_byte_in(codes):
        shifted = torch.empty(codes.numel() + 1, dtype=torch.uint8, device=DEVICE)[1:].view(codes.shape)
        return shifted.copy_(codes)

    def decode(k_codes, v_codes):
        return decode_attention_turbo(args[0], k_codes, *args[2:4], v_codes, *args[5:], sm_scale=0.125,
                                      k_spec=quantizer.key_spec, v_spec=quantizer.value_spec,
                                      centroids=quantizer.centroids.to(DEVICE))
    with pytest.raises(ValueError, match="^k codes must start every row 4-byte aligned"):
        decode(one_byte_in(args[1]), args[4])
    torch.testing.assert_close(decode(args[1], one_byte_in(args[4])), decode(args[1], args[4]))


def test_short_histories_on_the_batch_1_2_grids_take_shorter_splits():
    """Tiny and small grids: one-tile splits up to 4,096 history tokens, two-tile up to 8,192 (at head_dim 256 on the
    tiny grid only), the launch's 4 beyond and on the medium and large grids
    (results/bench/bench_formats_turbo_short_h200.md)."""
    from kernels.turbo.decode import gpu_config
    assert gpu_config(128, "tiny", 704).min_split_tiles == 1 and gpu_config(64, "small", 4096).min_split_tiles == 1
    assert gpu_config(128, "small", 7872).min_split_tiles == 2 and gpu_config(256, "tiny", 7872).min_split_tiles == 2
    assert gpu_config(256, "small", 7872).min_split_tiles == 4 and gpu_config(128, "tiny", 32448).min_split_tiles == 4
    assert gpu_config(128, "medium", 704).min_split_tiles == 4 and gpu_config(128, "large", 704).min_split_tiles == 4
    assert gpu_config(128, "tiny").min_split_tiles == 4
    assert gpu_config(128, "tiny", 704).num_warps == 2 and gpu_config(128, "large", 704).maxnreg == 168


def test_batch_1_histories_of_4k_to_16k_keep_four_warps():
    """The tiny grid takes four warps over more than 4,096 and at most 16,384 history tokens at head_dim 64 and 128,
    two outside that window and on the small grid (results/bench/bench_formats_turbo_keywords_h200.md)."""
    from kernels.turbo.decode import gpu_config
    for head_dim in (64, 128):
        assert [gpu_config(head_dim, "tiny", n).num_warps for n in (4096, 4097, 6000, 7872, 16384, 16385, 32448)] \
            == [2, 4, 4, 4, 4, 2, 2]
        assert gpu_config(head_dim, "small", 7872).num_warps == 2 and gpu_config(head_dim, "tiny").num_warps == 2
    assert gpu_config(128, "tiny", 7872).min_split_tiles == 2 and gpu_config(128, "tiny", 16064).min_split_tiles == 4


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_medium_and_large_grids_cap_registers_at_every_head_dim(head_dim):
    """A 168-register cap on the medium and large grids at head_dim 64, 128 and 256 (H200 since the keys' aligned
    loads: 0.86-0.98x the time at 64 and 256, results/bench/bench_formats_turbo_keywords_h200.md); the tiny and small
    grids keep their launches (two warps up to head_dim 128, no cap)."""
    from kernels.turbo.decode import gpu_config
    assert gpu_config(head_dim, "medium").maxnreg == 168 and gpu_config(head_dim, "large").maxnreg == 168
    assert gpu_config(head_dim, "medium").num_warps == 4
    assert gpu_config(head_dim, "tiny").maxnreg is None and gpu_config(head_dim, "small").maxnreg is None
    assert gpu_config(head_dim, "small").num_warps == (2 if head_dim <= 128 else 4)


GRID_CASES = {  # name: (B, H_kv, D, N): a grid family's default launch on a GPU of 132 SMs (H100, H200)
    "tiny-d64-four-warps": (1, 2, 64, 6000), "tiny-d128-four-warps": (1, 2, 128, 6000),
    "medium-d64": (9, 2, 64, 300), "medium-d128": (9, 2, 128, 300), "medium-d256": (9, 2, 256, 300),
    "large-d64": (34, 4, 64, 300), "large-d128": (34, 4, 128, 300), "large-d256": (34, 4, 256, 300),
}


@pytest.mark.skipif(DEVICE == "cpu", reason="the grid families and their launches are GPU launches")
@pytest.mark.parametrize("name", GRID_CASES)
def test_default_launch_of_each_grid_family_matches_reference_attention(name):
    """Launches none of the cases above reaches: batch 1 over a 6k history (the tiny grid's four warps and two-tile
    splits, `tiny_history_four_warps`), and the medium and large grids (batch >= 3 at 8 KV heads) under their
    168-register cap at every head_dim. On a GPU of 132 SMs each case must land on its named grid."""
    from kernels.decode.launch import _sm_count, grid_size
    batch, kv_heads, head_dim, n_hist = GRID_CASES[name]
    sms = _sm_count(torch.cuda.current_device())
    grid = grid_size(batch * kv_heads, sms, n_hist, 4)
    if sms != 132 and grid != name.split("-")[0]:
        pytest.skip(f"this GPU's {sms} SMs put the case on another grid")
    assert grid == name.split("-")[0]
    args, quantizer, history = make_inputs(batch, 4 * kv_heads, kv_heads, 1, head_dim, n_hist, 9, seed=batch + head_dim)
    out, ref = kernel_decode(args, quantizer), reference_decode(args, quantizer, history)
    assert (out - ref).abs().max().item() < TOL

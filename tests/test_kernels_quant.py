"""Triton write path (`kernels.quant.quantize_pack`) against the torch reference, bit for bit.

Runs under TRITON_INTERPRET=1 on CPU (set below when CUDA is unavailable); shapes are tiny.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from scipy.linalg import hadamard as sylvester_hadamard  # noqa: E402

from kernels.dispatch import interpreter_forced  # noqa: E402
from kernels.quant import (CLIP_METHODS, default_clip_method, default_rot_block, default_write_tile,  # noqa: E402
                           quantize_pack)
from kernels.reference import quantize_pack_reference  # noqa: E402
from kernels.format import QuantSpec, unpack_codes  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

CASES = [  # (spec, head_dim, tokens)
    (QuantSpec(bits=2, group=128, clip_ratio=0.96), 128, 15),
    (QuantSpec(bits=4, group=32), 128, 129),
    (QuantSpec(bits=2, group=64, symmetric=True, scale_dtype="bfloat16"), 64, 1),
    (QuantSpec(bits=3, group=64, clip_ratio=0.5, scale_dtype="float32"), 64, 33),  # radix-select clip
    (QuantSpec(bits=2, group=32, axis="channel"), 128, 64),
    (QuantSpec(bits=4, group=16, axis="channel", scale_dtype="float32"), 64, 32),
    (QuantSpec(bits=2, group=32, scale_dtype="bfloat16"), 256, 7),
]


def _ids(case):
    spec, head_dim, tokens = case
    return f"int{spec.bits}-{spec.axis}-g{spec.group}-d{head_dim}-t{tokens}-{spec.scale_dtype}"


def _pm1_hadamard(n: int) -> torch.Tensor:
    """+-1 Sylvester Hadamard [n, n], fp32 (scipy's, which harness.hadamard normalizes; unnormalized here: with
    integer or dyadic rows every x @ R is exact)."""
    return torch.from_numpy(sylvester_hadamard(n)).float()


def _assert_identical(got, ref):
    for name, a, b in zip(("codes", "scale", "zero"), got, ref):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(a.cpu(), b.cpu()), f"{name} differs in {(a.cpu() != b.cpu()).sum()} places"


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_bit_identical_to_reference(case):
    spec, head_dim, tokens = case
    x = torch.randn(2, 3, tokens, head_dim, generator=torch.Generator().manual_seed(tokens)) * 2
    _assert_identical(quantize_pack(x.to(DEVICE), spec), quantize_pack_reference(x, spec))


def test_lloyd_max_codes_identical_metadata_to_rounding():
    """Lloyd-Max mean/variance sum in a different order than torch: codes exact, metadata to 1 ulp."""
    spec = QuantSpec(bits=2, group=256, lloyd_max=True, clip_ratio=0.96, scale_dtype="float32")
    x = torch.randn(1, 2, 127, 256, generator=torch.Generator().manual_seed(1))
    codes, scale, zero = quantize_pack(x.to(DEVICE), spec)
    ref_codes, ref_scale, ref_zero = quantize_pack_reference(x, spec)
    assert torch.equal(codes.cpu(), ref_codes)
    torch.testing.assert_close(scale.cpu(), ref_scale, rtol=1e-6, atol=0)
    torch.testing.assert_close(zero.cpu(), ref_zero, rtol=1e-6, atol=1e-6)


def test_fused_rotation_exact_on_exact_arithmetic():
    """With a +-1 Hadamard and dyadic inputs every product and sum is exact, so codes must match."""
    hadamard = _pm1_hadamard(128)
    x = torch.randint(-8, 8, (2, 2, 17, 128), generator=torch.Generator().manual_seed(2)).float() / 4
    spec = QuantSpec(bits=2, group=128, clip_ratio=0.96)
    _assert_identical(quantize_pack(x.to(DEVICE), spec, hadamard.to(DEVICE)), quantize_pack_reference(x, spec, hadamard))


def test_fused_rotation_matches_random_orthogonal():
    """A random orthogonal R: x @ R differs from torch only in the last bits, so codes agree almost everywhere."""
    gen = torch.Generator().manual_seed(3)
    rotation = torch.linalg.qr(torch.randn(64, 64, generator=gen))[0]
    x = torch.randn(3, 40, 64, generator=gen)
    spec = QuantSpec(bits=4, group=64)
    codes, scale, zero = quantize_pack(x.to(DEVICE), spec, rotation.to(DEVICE))
    ref_codes, ref_scale, ref_zero = quantize_pack_reference(x, spec, rotation)
    assert (codes.cpu() == ref_codes).float().mean() > 0.99
    rtol = 1e-3 if DEVICE == "cpu" else 4e-3          # the GPU's fp32 tl.dot runs in tf32 (10-bit mantissa)
    torch.testing.assert_close(scale.cpu(), ref_scale, rtol=rtol, atol=0)


def test_writes_in_place_into_a_strided_cache_slice():
    spec = QuantSpec(bits=2, group=64)
    x = torch.randn(2, 3, 9, 128, generator=torch.Generator().manual_seed(4))
    cache = [torch.full((2, 3, 32, n), 7, dtype=dtype, device=DEVICE)
             for n, dtype in ((32, torch.uint8), (2, torch.float16), (2, torch.float16))]
    views = tuple(t[:, :, 5:14] for t in cache)
    returned = quantize_pack(x.to(DEVICE), spec, out=views)
    assert all(r.data_ptr() == v.data_ptr() for r, v in zip(returned, views))
    _assert_identical(views, quantize_pack_reference(x, spec))
    for t in cache:
        assert (t[:, :, :5] == 7).all() and (t[:, :, 14:] == 7).all()


@pytest.mark.parametrize("spec", [QuantSpec(bits=2, group=64), QuantSpec(bits=2, group=16, axis="channel")],
                         ids=["token", "channel"])
def test_row_offsets_write_each_sequence_at_its_device_offset(spec):
    """row_offsets [B] (on the device) puts sequence b's rows at token rows offsets[b].. of the whole buffers: the
    bytes of the reference there, every other row untouched."""
    x = torch.randn(2, 3, 16, 128, generator=torch.Generator().manual_seed(6))
    offsets, capacity = [32, 16], 64
    ref = quantize_pack_reference(x, spec)
    cache = [torch.full((2, 3, capacity * part.shape[-2] // 16, part.shape[-1]), 7, dtype=part.dtype, device=DEVICE)
             for part in ref]                                                  # [B, H_kv, rows, *]
    quantize_pack(x.to(DEVICE), spec, out=tuple(cache),
                  row_offsets=torch.tensor(offsets, dtype=torch.int32, device=DEVICE))
    for b, offset in enumerate(offsets):
        rows = [slice(offset * part.shape[-2] // 16, (offset + 16) * part.shape[-2] // 16) for part in ref]
        _assert_identical([t[b, :, r] for t, r in zip(cache, rows)], [part[b] for part in ref])
        for t, r in zip(cache, rows):
            assert (t[b, :, :r.start] == 7).all() and (t[b, :, r.stop:] == 7).all()
    with pytest.raises(ValueError, match="int32"):
        quantize_pack(x.to(DEVICE), spec, out=tuple(cache), row_offsets=torch.tensor(offsets, device=DEVICE))
    with pytest.raises(ValueError, match="pass the packed buffers"):
        quantize_pack(x.to(DEVICE), spec, row_offsets=torch.tensor(offsets, dtype=torch.int32, device=DEVICE))


def test_two_dim_input():
    spec = QuantSpec(bits=4, group=128)
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(5))
    _assert_identical(quantize_pack(x.to(DEVICE), spec), quantize_pack_reference(x, spec))


@pytest.mark.parametrize("make, match", [
    (lambda: (torch.randn(2, 96), QuantSpec(bits=2, group=32), None), "head_dim"),
    (lambda: (torch.randn(2, 128), QuantSpec(bits=2, group=48), None), "power of two"),
    (lambda: (torch.randn(30, 64), QuantSpec(bits=2, group=16, axis="channel"), None), "does not divide"),
    (lambda: (torch.randn(4, 64), QuantSpec(bits=2, group=64), torch.eye(32)), "rotation"),
    (lambda: (torch.randn(4, 64).int(), QuantSpec(bits=2, group=64), None), "fp32, fp16 or bf16"),
])
def test_bad_inputs_raise_before_launch(make, match):
    x, spec, rotation = make()
    with pytest.raises(ValueError, match=match):
        quantize_pack(x.to(DEVICE), spec, rotation if rotation is None else rotation.to(DEVICE))


def test_bad_out_raises():
    spec = QuantSpec(bits=2, group=64)
    x = torch.randn(4, 64, device=DEVICE)
    codes, scale, zero = quantize_pack(x, spec)
    with pytest.raises(ValueError, match="out scale"):
        quantize_pack(x, spec, out=(codes, scale.float(), zero))


def test_launch_tile_override_keeps_codes_bit_exact():
    """block_t / num_warps (the bench's write-path tiles) change the launch, never the result."""
    spec = QuantSpec(bits=2, group=64, clip_ratio=0.9)
    x = torch.randn(2, 3, 70, 128, generator=torch.Generator().manual_seed(5))
    ref = quantize_pack_reference(x, spec)
    for block_t, warps in ((32, 4), (64, 8)):
        got = quantize_pack(x.to(DEVICE), spec, block_t=block_t, num_warps=warps)
        assert all(torch.equal(a.cpu(), b) for a, b in zip(got, ref))


@pytest.mark.skipif(not torch.cuda.is_available() or interpreter_forced(),
                    reason="the reciprocal + Markstein division runs compiled on a CUDA device only")
@pytest.mark.parametrize("spec", [QuantSpec(bits=2, group=128), QuantSpec(bits=4, group=32),
                                  QuantSpec(bits=2, group=64, symmetric=True, scale_dtype="bfloat16")], ids=str)
def test_fast_division_keeps_every_code_on_gpu(spec):
    """Millions of codes, with values spread over many binades and many landing near rounding boundaries
    (small integer multiples of the scale): every code equals torch's (IEEE division) on the same GPU."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(16, 8, 1024, 128, generator=gen) * torch.exp(torch.randn(16, 8, 1024, 1, generator=gen))
    x[..., ::3] = torch.round(x[..., ::3] * 4) / 4                     # exact quarters: boundary-heavy groups
    x = x.to(DEVICE, torch.bfloat16)
    got, ref = quantize_pack(x, spec), quantize_pack_reference(x, spec)
    assert torch.equal(got[0], ref[0]), f"{(got[0] != ref[0]).sum().item()} of {got[0].numel()} code bytes differ"


@pytest.mark.parametrize("spec", [QuantSpec(bits=2, group=128), QuantSpec(bits=2, group=64, symmetric=True),
                                  QuantSpec(bits=4, group=32, scale_dtype="bfloat16")], ids=str)
def test_metadata_edge_cases_match_reference(spec):
    """Near-constant groups far from zero (the scale is raised so the zero point stays finite) and ranges beyond
    fp16 (scale and zero saturate at the dtype's max instead of becoming inf): codes and metadata as torch's.
    (Lloyd-Max is left out: its mean of a near-constant group depends on the summation order.)"""
    gen = torch.Generator().manual_seed(11)
    flat = 1000.0 + torch.randn(1, 2, 5, 128, generator=gen) * 1e-3
    huge = torch.randn(1, 2, 5, 128, generator=gen) * 1e6
    x = torch.cat([flat, huge], dim=2)
    _assert_identical(quantize_pack(x.to(DEVICE), spec), quantize_pack_reference(x, spec))


def _tie_heavy_rows(tokens, head_dim, gen):
    """Rows of small integer multiples of 1/4 (so |x| ties everywhere, also at tau), a row of one value, a row of
    zeros, a row whose largest |x| repeats (+-), and rows where every value above tau is one repeated value."""
    x = torch.randint(-6, 7, (2, tokens, head_dim), generator=gen).float() / 4
    x[0, 0] = 1.5
    x[0, 1] = 0.0
    x[0, 2, ::3] = -2.0
    x[0, 2, 1::3] = 2.0
    x[1, 0] = torch.linspace(-1, 1, head_dim)
    x[1, 0, :20] = 3.0
    x[1, 1, 5:9] = -7.0
    return x


@pytest.mark.parametrize("method", CLIP_METHODS)
@pytest.mark.parametrize("spec, head_dim", [(QuantSpec(bits=2, group=128, clip_ratio=0.96), 128),
                                            (QuantSpec(bits=2, group=128, clip_ratio=0.92), 128),
                                            (QuantSpec(bits=2, group=32, clip_ratio=0.9), 128),
                                            (QuantSpec(bits=4, group=32, clip_ratio=0.9, scale_dtype="bfloat16"), 64),
                                            (QuantSpec(bits=2, group=64, clip_ratio=0.96, symmetric=True), 256)],
                         ids=lambda v: str(v) if isinstance(v, int) else f"int{v.bits}-g{v.group}-clip{v.clip_ratio}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_every_clip_method_bit_identical_with_ties_and_masked_tails(method, spec, head_dim, dtype):
    """Each clip method (a launch knob) gives the reference's codes, scales and zeros, on random rows and on rows
    full of ties in |x| (at tau and above it), with a tail tile whose rows are masked (tokens not a multiple of
    block_t), for fp32 and for 16-bit inputs (whose spare low bits the distinct descent fills with the column)."""
    gen = torch.Generator().manual_seed(head_dim + len(method))
    tokens = 11
    x = torch.cat([torch.randn(2, tokens, head_dim, generator=gen) * 3, _tie_heavy_rows(tokens, head_dim, gen)])
    x = x.to(dtype)
    got = quantize_pack(x.to(DEVICE), spec, block_t=8, num_warps=1, clip_method=method)
    _assert_identical(got, quantize_pack_reference(x, spec))


@pytest.mark.parametrize("method", CLIP_METHODS)
def test_clipped_values_take_the_grid_code_of_tau_inside_the_grid(method):
    """Where a group's extreme is the clipped tau, the stored zero's rounding can put tau's code inside the grid
    (not 0 or 3): every clipped value must take that code, as the reference's clamped values do (a write that
    clamped codes to the grid's ends instead of values to tau would not)."""
    spec = QuantSpec(bits=2, group=32, clip_ratio=0.9)                         # 12 values above tau = 2
    x = torch.full((2, 128), 0.25)
    x[0, :12], x[0, 12], x[0, 13:32] = -5.0, -2.0, -1.9996                    # group 0 ends at -tau
    x[1, :12], x[1, 12], x[1, 13:32] = 5.0, 2.0, 1.9995                       # group 0 ends at tau
    ref = quantize_pack_reference(x, spec)
    codes = unpack_codes(ref[0], 2)                                            # [2, 128]
    assert codes[0, :13].unique().tolist() == [2] and codes[1, :13].unique().tolist() == [1]   # inside the grid
    _assert_identical(quantize_pack(x.to(DEVICE), spec, block_t=8, num_warps=1, clip_method=method), ref)


@pytest.mark.parametrize("method", CLIP_METHODS)
def test_every_clip_method_bit_identical_after_an_exact_rotation(method):
    """With a +-1 Hadamard and dyadic inputs x @ R is exact, and its rows tie often (the distinct descent must
    find the tie and fall back to counting): codes as the reference's, at a 16-row tile with masked rows."""
    hadamard = _pm1_hadamard(64)
    gen = torch.Generator().manual_seed(9)
    x = torch.randint(-3, 4, (3, 21, 64), generator=gen).float() / 2
    x[0, :4] = torch.randn(4, 64, generator=gen).round()                         # many equal |x @ R| per row
    spec = QuantSpec(bits=2, group=64, clip_ratio=0.92)
    got = quantize_pack(x.to(DEVICE), spec, hadamard.to(DEVICE), block_t=16, num_warps=1, clip_method=method)
    _assert_identical(got, quantize_pack_reference(x, spec, hadamard))


def test_default_clip_method_by_top_and_input_dtype():
    spec = QuantSpec(bits=2, group=128, clip_ratio=0.96)
    assert default_clip_method(128, spec, torch.bfloat16) == "distinct"   # rotated rows too: rounded to bf16
    assert default_clip_method(128, spec, torch.float32) == "descend"
    assert default_clip_method(128, QuantSpec(bits=3, group=64, clip_ratio=0.5), torch.bfloat16) == "radix"


def test_unknown_clip_method_raises():
    with pytest.raises(ValueError, match="clip_method"):
        quantize_pack(torch.randn(4, 64, device=DEVICE), QuantSpec(bits=2, group=64, clip_ratio=0.9),
                      clip_method="sort")


def test_rotated_write_tile_follows_the_rows_per_head():
    """Bulk writes (prefill) take 64 rows x 4 warps with a rotation; a decode step's few rows per head keep
    16 x 1 (a 64-row tile would compute 63 masked rows per token); without a rotation the tile is fixed."""
    spec = QuantSpec(bits=2, group=128, clip_ratio=0.96)
    assert default_write_tile(128, spec, rotate=True, tokens=4096) == (64, 4)
    assert default_write_tile(128, spec, rotate=True, tokens=1) == (16, 1)
    assert default_write_tile(128, spec, rotate=False, tokens=1) == default_write_tile(128, spec, rotate=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_rotated_rows_rounded_to_the_input_dtype_before_the_clip(dtype):
    """x @ R is exact here (integer rows of 7 bits, +-1 Hadamard) but needs up to 12 significant bits, so bf16 rows
    round it (to nearest even, as torch's cast); the codes, scales and zeros are the reference's for x @ R in x's
    dtype, which for bf16 differ from those of the fp32 product."""
    gen = torch.Generator().manual_seed(11)
    x = torch.randint(-100, 101, (2, 3, 70, 128), generator=gen).to(dtype)
    rotation = _pm1_hadamard(128)
    spec = QuantSpec(bits=2, group=128, clip_ratio=0.96)
    got = quantize_pack(x.to(DEVICE), spec, rotation.to(DEVICE, dtype))
    _assert_identical(got, quantize_pack_reference(x, spec, rotation))
    unrounded = quantize_pack_reference(x.float(), spec, rotation)
    assert all(torch.equal(a.cpu(), b) for a, b in zip(got, unrounded)) == (dtype == torch.float32)


@pytest.mark.parametrize("rot_block", [16, 32, 128])
def test_rotation_slice_width_never_changes_the_codes(rot_block):
    """rot_block (the fused rotation's slice width, a benchmark knob; 64 by default at this tile) sums x @ R in other
    slices: exact sums here, so the codes are the reference's."""
    gen = torch.Generator().manual_seed(rot_block)
    x = torch.randint(-100, 101, (2, 70, 128), generator=gen).to(torch.bfloat16)
    rotation = _pm1_hadamard(128)
    spec = QuantSpec(bits=2, group=128, clip_ratio=0.96)
    got = quantize_pack(x.to(DEVICE), spec, rotation.to(DEVICE, torch.bfloat16), rot_block=rot_block)
    _assert_identical(got, quantize_pack_reference(x, spec, rotation))


def test_rotation_slice_width_by_tile():
    """64-row tiles (bulk writes) take 64-wide slices (at most head_dim); a decode step's small tile keeps 32."""
    assert default_rot_block(128, 64) == 64 and default_rot_block(256, 64) == 64 and default_rot_block(64, 64) == 64
    assert default_rot_block(128, 16) == 32


def test_bad_rotation_slice_width_is_one_sentence():
    with pytest.raises(ValueError, match="rot_block must be a power of two"):
        quantize_pack(torch.randn(4, 64, device=DEVICE), QuantSpec(bits=2, group=64), torch.eye(64, device=DEVICE),
                      rot_block=96)


@pytest.mark.parametrize("tokens", [1, 70])
def test_rotated_writes_match_the_reference_at_both_tiles(tokens):
    """Clip + rotation at a decode step's single row and at a bulk write over one 64-row tile plus a tail."""
    gen = torch.Generator().manual_seed(tokens)
    x = torch.randint(-8, 8, (3, tokens, 128), generator=gen).float() / 4      # quarter integers: exact sums
    rotation = _pm1_hadamard(128)
    spec = QuantSpec(bits=2, group=128, clip_ratio=0.96)
    got = quantize_pack(x.to(DEVICE), spec, rotation.to(DEVICE))
    _assert_identical(got, quantize_pack_reference(x @ rotation, spec))
